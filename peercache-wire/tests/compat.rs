//! Compatibility: committed byte fixtures of every wire-crate message of version 1 must keep
//! decoding. Regenerate (only when adding a message) with `PEERCACHE_BLESS=1 cargo test`.

use std::path::PathBuf;

use peercache_wire::envelope::{self, Envelope, Message};
use peercache_wire::handshake::{
    Acceptor, ClientHandshake, HANDSHAKE_VERSION, Hello, HelloReply, Plane, ServerHandshake, Step,
};
use peercache_wire::{Auth, Incarnation, NodeId, WireError};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/v1")
        .join(name)
}

fn check<M: Message + PartialEq + std::fmt::Debug>(name: &str, msg: M) {
    let path = fixture(name);
    if std::env::var_os("PEERCACHE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, envelope::encode(&msg, &[]).unwrap()).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    let decoded: M = envelope::decode(&bytes).unwrap();
    assert_eq!(
        decoded, msg,
        "fixture {name} no longer decodes to the same message"
    );
}

#[test]
fn v1_hello_fixtures_decode() {
    check(
        "hello.bin",
        Hello {
            min_version: 1,
            max_version: 1,
            plane: Plane::Control,
            node: Some(NodeId::new("node-a:31998").unwrap()),
            incarnation: Incarnation(0x0102_0304_0506_0708),
            features: 0,
        },
    );
    check(
        "hello_anonymous.bin",
        Hello {
            min_version: 1,
            max_version: 1,
            plane: Plane::Data,
            node: None,
            incarnation: Incarnation(1),
            features: 0,
        },
    );
}

#[test]
fn v1_hello_reply_fixtures_decode() {
    check(
        "hello_accept.bin",
        HelloReply::Accept {
            version: 1,
            node: Some(NodeId::new("node-b").unwrap()),
            incarnation: Incarnation(42),
            features: 0,
        },
    );
    check(
        "hello_reject.bin",
        HelloReply::Reject {
            reason: "no common version".into(),
        },
    );
}

#[test]
fn v1_auth_fixtures_decode() {
    use peercache_wire::handshake::{AuthChallengeV1, AuthProof};
    check(
        "auth_challenge.bin",
        AuthChallengeV1 {
            nonce: [0xa5; 32],
            proof: [0x3c; 32],
        },
    );
    check("auth_proof.bin", AuthProof { proof: [0x7e; 32] });
}

/// A recorded exchange of the previous release (handshake version 1, server proves first),
/// in `tests/fixtures/handshake-v1/`: `authed_*` with the secret below, `open_*` without one.
/// Frame 0 is the client's Hello, 1 the server's answer, and so on.
fn v1_frame(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/handshake-v1")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

const V1_SECRET: &[u8] = b"fixture-cluster-secret-v1-0001";

fn server(auth: Auth) -> Acceptor {
    Acceptor {
        planes: vec![Plane::Control],
        node: Some(NodeId::new("node-b:31998").unwrap()),
        incarnation: Incarnation(7),
        auth,
    }
}

#[test]
fn a_previous_release_client_is_refused_with_a_version_error_and_learns_nothing() {
    let acc = server(Auth::from_secret(V1_SECRET).unwrap());
    let mut hs = ServerHandshake::new(&acc);
    let Step::Finish(frame, result) = hs.on_frame(&v1_frame("authed_0.bin")).unwrap() else {
        panic!("a version-1 client must not be challenged")
    };
    assert!(
        matches!(
            result,
            Err(WireError::HandshakeVersion {
                ours: HANDSHAKE_VERSION,
                theirs: 1
            })
        ),
        "{result:?}"
    );
    // What the old client reads: a refusal (its typed `Handshake` error) that says why and
    // what to do, and no proof of the secret.
    let env = Envelope::parse(&frame).unwrap();
    assert!(env.ext.is_empty());
    let HelloReply::Reject { reason } = env.decode::<HelloReply>().unwrap() else {
        panic!("expected a refusal")
    };
    assert!(
        reason.starts_with("handshake version 1 refused"),
        "{reason}"
    );
    assert!(reason.contains("same PeerCache release"), "{reason}");
}

#[test]
fn a_previous_release_server_is_refused_with_a_version_error_before_any_proof() {
    let auth = Auth::from_secret(V1_SECRET).unwrap();
    let hello = Hello::new(
        Plane::Control,
        Some(NodeId::new("node-a:31998").unwrap()),
        Incarnation(0x0102_0304_0506_0708),
    );
    let (mut hs, _) = ClientHandshake::new(&hello, &auth).unwrap();
    // The old server answers any authenticated Hello with its proof-first challenge.
    let err = hs.on_frame(&v1_frame("authed_1.bin")).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::HandshakeVersion {
                ours: HANDSHAKE_VERSION,
                theirs: 1
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("same PeerCache release"), "{err}");
}

#[test]
fn without_a_secret_the_previous_release_and_this_one_still_talk() {
    let acc = server(Auth::none());
    let mut hs = ServerHandshake::new(&acc);
    let Step::Finish(frame, Ok(hello)) = hs.on_frame(&v1_frame("open_0.bin")).unwrap() else {
        panic!("an open version-1 hello must be accepted")
    };
    assert_eq!(hello.node.unwrap().as_str(), "node-a:31998");
    assert!(matches!(
        envelope::decode::<HelloReply>(&frame).unwrap(),
        HelloReply::Accept { .. }
    ));
    let hello = Hello::new(Plane::Control, None, Incarnation(1));
    let (mut c, _) = ClientHandshake::new(&hello, &Auth::none()).unwrap();
    let Step::Finish(_, Ok(acc)) = c.on_frame(&v1_frame("open_1.bin")).unwrap() else {
        panic!("an open version-1 acceptance must be taken")
    };
    assert_eq!(acc.node.unwrap().as_str(), "node-b:31998");
}

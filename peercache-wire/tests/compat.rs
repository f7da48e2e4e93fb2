//! Compatibility: committed byte fixtures of every wire-crate message of version 1 must keep
//! decoding. Regenerate (only when adding a message) with `PEERCACHE_BLESS=1 cargo test`.

use std::path::PathBuf;

use peercache_wire::envelope::{self, Message};
use peercache_wire::handshake::{Hello, HelloReply, Plane};
use peercache_wire::{Incarnation, NodeId};

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
    use peercache_wire::handshake::{AuthChallenge, AuthProof};
    check(
        "auth_challenge.bin",
        AuthChallenge {
            nonce: [0xa5; 32],
            proof: [0x3c; 32],
        },
    );
    check("auth_proof.bin", AuthProof { proof: [0x7e; 32] });
}

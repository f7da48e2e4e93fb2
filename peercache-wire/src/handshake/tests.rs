//! The handshake state machines against each other, in memory and over real sockets.

use super::*;
use crate::NodeId;
use crate::auth::{Side, TAG_LEN};
use crate::envelope::{self, Envelope, Extension};
use std::net::TcpStream;
use std::time::Duration;
use tokio_util::codec::Framed;

fn acceptor(planes: &[Plane], node: Option<&str>, inc: u64, auth: Auth) -> Acceptor {
    Acceptor {
        planes: planes.to_vec(),
        node: node.map(|n| NodeId::new(n).unwrap()),
        incarnation: Incarnation(inc),
        auth,
    }
}

/// Runs both state machines against each other in memory.
fn run(client: &Auth, server: &Auth) -> (Result<Accepted, WireError>, Result<Hello, WireError>) {
    let (c, s, _) = run_on(Plane::Control, client, server);
    (c, s)
}

/// [`run`] on `plane`, with the keys the server ended with.
fn run_on(
    plane: Plane,
    client: &Auth,
    server: &Auth,
) -> (
    Result<Accepted, WireError>,
    Result<Hello, WireError>,
    Option<crate::seal::ChannelKeys>,
) {
    let acc = acceptor(&[plane], None, 1, server.clone());
    let (c, s, srv) = drive(&acc, &hello(plane), client);
    (c, s, srv.channel())
}

/// Runs a client saying `hello` against a server answering as `acc`, in memory; returns both
/// results and the server's state machine (its keys, its verdict on the client's identity).
fn drive<'a>(
    acc: &'a Acceptor,
    hello: &Hello,
    client: &Auth,
) -> (
    Result<Accepted, WireError>,
    Result<Hello, WireError>,
    ServerHandshake<'a>,
) {
    let mut srv = ServerHandshake::new(acc);
    let (mut cli, mut to_server) = ClientHandshake::new(hello, client).unwrap();
    loop {
        let to_client = match srv.on_frame(&to_server) {
            Ok(Step::Send(f)) => f,
            Ok(Step::Finish(f, r)) => {
                let c = match cli.on_frame(&f) {
                    Ok(Step::Finish(_, c)) => c,
                    Ok(Step::Send(_)) => Err(WireError::Handshake("unexpected send".into())),
                    Err(e) => Err(e),
                };
                return (c, r, srv);
            }
            Err(e) => return (Err(WireError::Closed), Err(e), srv),
        };
        match cli.on_frame(&to_client) {
            Ok(Step::Send(f)) => to_server = f,
            Ok(Step::Finish(_, c)) => return (c, Err(WireError::Closed), srv),
            Err(e) => return (Err(e), Err(WireError::Closed), srv),
        }
    }
}

#[test]
fn a_connection_is_sealed_when_one_side_requires_it_and_both_derive_the_same_keys() {
    let offers = Auth::from_secret(b"first-cluster-secret").unwrap();
    let requires = offers.requiring_encryption(true);
    // Neither requires: not sealed.
    let (c, s, k) = run_on(Plane::Control, &offers, &offers);
    assert!(s.is_ok() && c.as_ref().unwrap().channel.is_none() && k.is_none());
    // Either side requiring seals it, with the same keys on both sides.
    for (client, server) in [
        (&requires, &offers),
        (&offers, &requires),
        (&requires, &requires),
    ] {
        let (c, s, k) = run_on(Plane::Control, client, server);
        assert!(s.is_ok(), "{s:?}");
        let ck = c.unwrap().channel.expect("client keys");
        assert_eq!(Some(ck), k);
    }
    // Two connections never share keys (fresh nonces on both sides).
    let (a, _, _) = run_on(Plane::Data, &requires, &offers);
    let (b, _, _) = run_on(Plane::Data, &requires, &offers);
    assert_ne!(a.unwrap().channel, b.unwrap().channel);
    // A side that prefers sealing seals with one that can, either way round.
    let prefers = offers.with_sealing(crate::seal::Sealing::Prefer);
    for (client, server) in [(&prefers, &offers), (&offers, &prefers)] {
        let (c, s, k) = run_on(Plane::Control, client, server);
        assert!(s.is_ok(), "{s:?}");
        assert_eq!(c.unwrap().channel, k);
        assert!(k.is_some());
    }
    // The bootstraps that hand over to RDMA or shared memory are not sealed.
    let (c, s, k) = run_on(Plane::RdmaBootstrap, &requires, &requires);
    assert!(s.is_ok() && c.unwrap().channel.is_none() && k.is_none());
}

#[test]
fn a_side_that_requires_sealing_refuses_one_that_cannot_seal() {
    let requires = Auth::from_secret(b"first-cluster-secret")
        .unwrap()
        .requiring_encryption(true);
    // A secured server that requires it refuses an open client (for want of the secret).
    let (c, s, _) = run_on(Plane::Control, &Auth::none(), &requires);
    assert!(c.is_err() && s.is_err());
    // A requiring client against an open server: refused with the sealing reason, typed.
    let (c, s, _) = run_on(Plane::Control, &requires, &Auth::none());
    assert!(matches!(c, Err(WireError::Integrity(_))), "{c:?}");
    assert!(matches!(s, Err(WireError::Handshake(ref r)) if r.contains("encryption in transit")));
    // A server of a release before sealing answers with a sound proof and no sealing bit:
    // the requiring client refuses it.
    let secret = Auth::from_secret(b"first-cluster-secret").unwrap();
    let (mut cli, hello_frame) = ClientHandshake::new(&hello(Plane::Control), &requires).unwrap();
    let nc: [u8; TAG_LEN] = Envelope::parse(&hello_frame)
        .unwrap()
        .extension(EXT_AUTH_NONCE)
        .unwrap()
        .unwrap()
        .try_into()
        .unwrap();
    let ns = [9u8; TAG_LEN];
    let challenge = envelope::encode(&AuthChallenge { nonce: ns }, &[]).unwrap();
    assert!(matches!(cli.on_frame(&challenge), Ok(Step::Send(_))));
    let accept = HelloReply::Accept {
        version: crate::WIRE_VERSION,
        node: None,
        incarnation: Incarnation(1),
        features: 0,
    };
    let plain = envelope::encode(&accept, &[]).unwrap();
    let body = Envelope::parse(&plain).unwrap().body.to_vec();
    let proof = secret
        .proof(Side::Server, &nc, &ns, &[&hello_frame, &body])
        .unwrap();
    let reply = envelope::encode(
        &accept,
        &[Extension {
            tag: EXT_SERVER_PROOF,
            data: proof.to_vec(),
        }],
    )
    .unwrap();
    let err = cli.on_frame(&reply).unwrap_err();
    assert!(
        matches!(err, WireError::Integrity(ref r) if r.contains("did not agree")),
        "{err:?}"
    );
}

#[test]
fn matrix_of_secrets() {
    let s1 = Auth::from_secret(b"first-cluster-secret").unwrap();
    let s2 = Auth::from_secret(b"other-cluster-secret").unwrap();
    let none = Auth::none();
    let (c, s) = run(&s1, &s1);
    assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    let (c, s) = run(&none, &none);
    assert!(c.is_ok() && s.is_ok());
    // Wrong secret: the client proves first and the server refuses it, typed on both sides.
    let (c, s) = run(&s2, &s1);
    assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
    assert!(matches!(s, Err(WireError::Unauthenticated(_))), "{s:?}");
    assert_eq!(s1.rejected(), 1);
    // No secret against a secured server: refused by the server, typed on both sides.
    let (c, s) = run(&none, &s1);
    assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
    assert!(matches!(s, Err(WireError::Unauthenticated(_))), "{s:?}");
    assert_eq!(s1.rejected(), 2);
    // A secured client never trusts an open server.
    let (c, _) = run(&s1, &none);
    assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
}

#[test]
fn a_stranger_receives_nothing_that_depends_on_the_secret() {
    // The offline-guessing oracle of handshake version 1: the server proved first. Now a
    // stranger's whole view of the exchange is a nonce and a refusal.
    let good = Auth::from_secret(b"first-cluster-secret").unwrap();
    let acc = acceptor(&[Plane::Control], None, 1, good.clone());
    let mut srv = ServerHandshake::new(&acc);
    let (cli, hello_frame) = ClientHandshake::new(
        &hello(Plane::Control),
        &Auth::from_secret(b"guess-guess-guess").unwrap(),
    )
    .unwrap();
    let Step::Send(ch) = srv.on_frame(&hello_frame).unwrap() else {
        panic!("expected a challenge")
    };
    let env = Envelope::parse(&ch).unwrap();
    assert_eq!(env.kind, AuthChallenge::KIND);
    assert!(env.ext.is_empty(), "the challenge carries extensions");
    let ch: AuthChallenge = env.decode().unwrap();
    // The challenge is exactly a nonce: its body is the 32 bytes and nothing else.
    assert_eq!(env.body.len(), TAG_LEN);
    // The stranger's guess is refused, and the refusal carries no proof either.
    let guess = Auth::from_secret(b"guess-guess-guess").unwrap();
    let proof = guess
        .proof(Side::Client, cli.nonce(), &ch.nonce, &[&hello_frame])
        .unwrap();
    let frame = envelope::encode(&AuthProof { proof }, &[]).unwrap();
    let Step::Finish(reply, r) = srv.on_frame(&frame).unwrap() else {
        panic!("expected the end")
    };
    assert!(matches!(r, Err(WireError::Unauthenticated(_))));
    let env = Envelope::parse(&reply).unwrap();
    assert!(env.ext.is_empty(), "the refusal carries extensions");
    assert!(matches!(
        env.decode::<HelloReply>().unwrap(),
        HelloReply::Reject { .. }
    ));
    assert_eq!(good.rejected(), 1);
}

#[test]
fn a_server_without_the_secret_cannot_pass_for_one_that_has_it() {
    // A fake server collects the client's proof and accepts — with no proof, or a made-up
    // one. The client refuses both.
    let good = Auth::from_secret(b"first-cluster-secret").unwrap();
    for proof_ext in [None, Some(vec![0x55u8; TAG_LEN]), Some(vec![1, 2, 3])] {
        let (mut cli, _) = ClientHandshake::new(&hello(Plane::Control), &good).unwrap();
        let ch = envelope::encode(
            &AuthChallenge {
                nonce: [9; TAG_LEN],
            },
            &[],
        )
        .unwrap();
        assert!(matches!(cli.on_frame(&ch).unwrap(), Step::Send(_)));
        let accept = HelloReply::Accept {
            version: WIRE_VERSION,
            node: None,
            incarnation: Incarnation(1),
            features: 0,
        };
        let exts: Vec<Extension> = proof_ext
            .into_iter()
            .map(|data| Extension {
                tag: EXT_SERVER_PROOF,
                data,
            })
            .collect();
        let frame = envelope::encode(&accept, &exts).unwrap();
        let err = cli.on_frame(&frame).unwrap_err();
        assert!(matches!(err, WireError::Unauthenticated(_)), "{err:?}");
    }
}

#[test]
fn a_proof_for_one_acceptance_does_not_cover_another() {
    // The server's proof covers its acceptance: moving it onto an acceptance that names
    // another node fails.
    let good = Auth::from_secret(b"first-cluster-secret").unwrap();
    let acc = acceptor(&[Plane::Control], Some("real-server"), 1, good.clone());
    let mut srv = ServerHandshake::new(&acc);
    let (mut cli, hello_frame) = ClientHandshake::new(&hello(Plane::Control), &good).unwrap();
    let Step::Send(ch) = srv.on_frame(&hello_frame).unwrap() else {
        panic!()
    };
    let Step::Send(proof) = cli.on_frame(&ch).unwrap() else {
        panic!()
    };
    let Step::Finish(reply, Ok(_)) = srv.on_frame(&proof).unwrap() else {
        panic!()
    };
    let env = Envelope::parse(&reply).unwrap();
    let server_proof = env.extension(EXT_SERVER_PROOF).unwrap().unwrap().to_vec();
    let forged = HelloReply::Accept {
        version: WIRE_VERSION,
        node: Some(NodeId::new("someone-else").unwrap()),
        incarnation: Incarnation(1),
        features: 0,
    };
    let forged = envelope::encode(
        &forged,
        &[Extension {
            tag: EXT_SERVER_PROOF,
            data: server_proof,
        }],
    )
    .unwrap();
    let err = cli.on_frame(&forged).unwrap_err();
    assert!(matches!(err, WireError::Unauthenticated(_)), "{err:?}");
}

fn hello(plane: Plane) -> Hello {
    Hello::new(plane, Some(NodeId::new("a").unwrap()), Incarnation(1))
}

#[test]
fn accept_negotiates_highest_common_version() {
    let r = accept(
        &hello(Plane::Control),
        &[Plane::Control],
        None,
        Incarnation(2),
    );
    assert!(matches!(
        r,
        HelloReply::Accept {
            version: WIRE_VERSION,
            ..
        }
    ));
}

#[test]
fn wrong_plane_and_future_only_clients_are_rejected() {
    let r = accept(&hello(Plane::Data), &[Plane::Control], None, Incarnation(2));
    assert!(matches!(r, HelloReply::Reject { .. }));
    let mut future = hello(Plane::Control);
    future.min_version = WIRE_VERSION + 1;
    future.max_version = WIRE_VERSION + 3;
    assert!(matches!(
        accept(&future, &[Plane::Control], None, Incarnation(2)),
        HelloReply::Reject { .. }
    ));
}

#[test]
fn sync_handshake_over_real_socket() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let srv = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        server_sync(
            &mut s,
            &acceptor(&[Plane::Data], Some("srv"), 9, Auth::none()),
            Duration::from_secs(5),
        )
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let acc = client_sync(
        &mut c,
        &hello(Plane::Data),
        &Auth::none(),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(acc.node.unwrap().as_str(), "srv");
    assert_eq!(acc.incarnation, Incarnation(9));
    assert_eq!(srv.join().unwrap().unwrap().hello.plane, Plane::Data);
}

#[test]
fn silent_server_times_out_within_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let t0 = std::time::Instant::now();
    let err = client_sync(
        &mut c,
        &hello(Plane::Data),
        &Auth::none(),
        Duration::from_millis(200),
    )
    .unwrap_err();
    assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    drop(l);
}

/// Writes `bytes` one at a time, `gap` apart, until they run out or the peer closes;
/// returns when it stopped.
fn trickle(mut s: TcpStream, bytes: &[u8], gap: Duration) -> std::time::Instant {
    use std::io::Write;
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(gap);
    }
    std::time::Instant::now()
}

#[test]
fn a_stranger_trickling_a_handshake_is_cut_off_at_the_total_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut s, _) = l.accept().unwrap();
    // A plausible frame header, then a body, one byte every 100 ms: each read arrives well
    // inside a per-read timeout, but the exchange must still end at the total deadline.
    let mut bytes = 200u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[7u8; 200]);
    let writer = std::thread::spawn(move || trickle(c, &bytes, Duration::from_millis(100)));
    let t0 = std::time::Instant::now();
    let acc = acceptor(&[Plane::Data], Some("srv"), 1, Auth::none());
    let err = server_sync(&mut s, &acc, Duration::from_millis(600)).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
    assert!(took < Duration::from_millis(1200), "cut off after {took:?}");
    drop(s);
    writer.join().unwrap();
}

#[test]
fn a_tarpit_server_cannot_hold_a_client_past_its_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let tarpit = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut bytes = 300u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[1u8; 300]);
        trickle(s, &bytes, Duration::from_millis(100))
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let t0 = std::time::Instant::now();
    let err = client_sync(
        &mut c,
        &hello(Plane::Data),
        &Auth::none(),
        Duration::from_millis(600),
    )
    .unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
    assert!(took < Duration::from_millis(1200), "held for {took:?}");
    drop(c);
    tarpit.join().unwrap();
}

#[tokio::test]
async fn async_handshake_round_trip() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let srv = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut f = Framed::new(s, crate::frame::codec(4096));
        server_async(
            &mut f,
            &acceptor(&[Plane::Discovery], None, 3, Auth::none()),
            Duration::from_secs(5),
        )
        .await
    });
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut f = Framed::new(s, crate::frame::codec(4096));
    let acc = client_async(
        &mut f,
        &hello(Plane::Discovery),
        &Auth::none(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert_eq!(acc.incarnation, Incarnation(3));
    assert!(srv.await.unwrap().is_ok());
}

/// Both state machines against each other; the grant the server gave.
fn run_granted(
    client: &Auth,
    server: &Auth,
) -> (
    Result<Accepted, WireError>,
    Result<crate::auth::Grant, WireError>,
) {
    let acc = acceptor(&[Plane::Control], None, 1, server.clone());
    let mut srv = ServerHandshake::new(&acc);
    let (mut cli, mut to_server) = ClientHandshake::new(&hello(Plane::Control), client).unwrap();
    loop {
        match srv.on_frame(&to_server) {
            Ok(Step::Send(f)) => match cli.on_frame(&f) {
                Ok(Step::Send(f)) => to_server = f,
                other => panic!("the client stopped early: {other:?}"),
            },
            Ok(Step::Finish(f, r)) => {
                let c = match cli.on_frame(&f) {
                    Ok(Step::Finish(_, c)) => c,
                    Ok(Step::Send(_)) => Err(WireError::Handshake("unexpected send".into())),
                    Err(e) => Err(e),
                };
                return (c, r.map(|_| srv.grant()));
            }
            Err(e) => return (Err(WireError::Closed), Err(e)),
        }
    }
}

#[test]
fn the_read_only_token_is_granted_read_only_only_where_accepted_and_both_sides_verify() {
    let secret = b"a cluster secret of 32 bytes ok!";
    let token = crate::auth::read_only_token(secret).unwrap();
    assert_eq!(token.len(), 64);
    assert_eq!(
        token,
        crate::auth::read_only_token(secret).unwrap(),
        "the same on every process"
    );
    assert_ne!(
        token,
        crate::auth::read_only_token(b"another secret of 32 bytes, ok!!").unwrap()
    );
    assert!(!token.contains("a cluster secret"));
    let full = Auth::from_secret(secret).unwrap();
    let client_port = full.accepting_read_only(secret).unwrap();
    let ro = Auth::from_secret(token.as_bytes()).unwrap();
    // The client port: the secret is granted everything, the token read-only; the client
    // checks the server's answer with the key it proved, so both handshakes complete.
    let (c, s) = run_granted(&full, &client_port);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(s.unwrap(), crate::auth::Grant::Full);
    let (c, s) = run_granted(&ro, &client_port);
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(s.unwrap(), crate::auth::Grant::ReadOnly);
    // Every other port: the token is a stranger's secret.
    let (c, s) = run_granted(&ro, &full);
    assert!(
        c.is_err() && matches!(s, Err(WireError::Unauthenticated(_))),
        "{c:?} {s:?}"
    );
    // An open endpoint stays open (and grants everything).
    assert!(
        !Auth::none()
            .accepting_read_only(secret)
            .unwrap()
            .is_enabled()
    );
}

/// Runs a handshake between a client naming `cnode` and a server named `snode`; returns both
/// results and whether the server found the client's node id proven.
fn run_named(
    client: &Auth,
    cnode: Option<&str>,
    server: &Auth,
    snode: Option<&str>,
) -> (Result<Accepted, WireError>, Result<Hello, WireError>, bool) {
    let acc = acceptor(&[Plane::Control], snode, 1, server.clone());
    let h = Hello::new(
        Plane::Control,
        cnode.map(|n| NodeId::new(n).unwrap()),
        Incarnation(2),
    );
    let (c, s, srv) = drive(&acc, &h, client);
    (c, s, srv.verified())
}

/// The cluster's signing key and an authentication for a node whose certificate names
/// `subject` (None: no certificate, checks only).
struct Certs {
    cluster: crate::identity::SigningKey,
}

impl Certs {
    fn new() -> Self {
        Certs {
            cluster: crate::identity::SigningKey::generate().unwrap(),
        }
    }

    fn auth(&self, subject: Option<&str>, require: bool) -> Auth {
        let own = subject.map(|s| {
            let key = crate::identity::SigningKey::generate().unwrap();
            let cert = self.cluster.issue(s, key.public_key(), u64::MAX).unwrap();
            (key, cert)
        });
        let id = crate::identity::Identity::new(own, self.cluster.public_key(), require).unwrap();
        Auth::from_secret(b"first-cluster-secret")
            .unwrap()
            .with_identity(id)
    }
}

#[test]
fn members_with_certificates_prove_their_node_ids_both_ways() {
    let c = Certs::new();
    let (cli, srv, verified) = run_named(
        &c.auth(Some("node-a"), true),
        Some("node-a"),
        &c.auth(Some("node-*"), true),
        Some("node-b"),
    );
    assert!(srv.is_ok(), "{srv:?}");
    assert!(verified, "the server found the client's id proven");
    assert!(
        cli.unwrap().verified,
        "the client found the server's id proven"
    );
    // A tool that names no node needs no certificate, even where they are required.
    let (cli, srv, verified) = run_named(
        &c.auth(None, false),
        None,
        &c.auth(Some("node-b"), true),
        Some("node-b"),
    );
    assert!(srv.is_ok() && !verified);
    assert!(cli.unwrap().verified);
}

#[test]
fn a_member_cannot_name_another_node_than_its_certificate_covers() {
    let c = Certs::new();
    let server = c.auth(Some("node-b"), true);
    // node-a's certificate, a Hello naming node-c: refused, typed on both sides.
    let (cli, srv, _) = run_named(
        &c.auth(Some("node-a"), false),
        Some("node-c"),
        &server,
        Some("node-b"),
    );
    assert!(
        matches!(srv, Err(WireError::Unauthenticated(ref r)) if r.contains("does not cover")),
        "{srv:?}"
    );
    assert!(matches!(cli, Err(WireError::Unauthenticated(_))), "{cli:?}");
    // No certificate, naming a node, where they are required: refused.
    let (_, srv, _) = run_named(
        &c.auth(None, false),
        Some("node-a"),
        &server,
        Some("node-b"),
    );
    assert!(
        matches!(srv, Err(WireError::Unauthenticated(ref r)) if r.contains("requires node certificates")),
        "{srv:?}"
    );
    // A certificate of another cluster's key: refused.
    let other = Certs::new();
    let (_, srv, _) = run_named(
        &other.auth(Some("node-a"), false),
        Some("node-a"),
        &server,
        Some("node-b"),
    );
    assert!(
        matches!(srv, Err(WireError::Unauthenticated(ref r)) if r.contains("not signed")),
        "{srv:?}"
    );
    // Where certificates are not required, a claim without one is still served, unproven.
    let lenient = c.auth(Some("node-b"), false);
    let (_, srv, verified) = run_named(
        &c.auth(None, false),
        Some("node-a"),
        &lenient,
        Some("node-b"),
    );
    assert!(srv.is_ok() && !verified);
    // A server whose certificate does not cover the node it names is refused by the client.
    let (cli, _, _) = run_named(
        &c.auth(Some("node-a"), true),
        Some("node-a"),
        &c.auth(Some("node-x"), false),
        Some("node-b"),
    );
    assert!(
        matches!(cli, Err(WireError::Unauthenticated(ref r)) if r.contains("does not cover")),
        "{cli:?}"
    );
    // And a server with no certificate, by a client that requires them.
    let (cli, _, _) = run_named(
        &c.auth(Some("node-a"), true),
        Some("node-a"),
        &c.auth(None, false),
        Some("node-b"),
    );
    assert!(
        matches!(cli, Err(WireError::Unauthenticated(ref r)) if r.contains("without proving")),
        "{cli:?}"
    );
}

#[test]
fn a_certificate_and_signature_moved_to_another_connection_are_refused() {
    // Record a member's Hello (with its certificate) and proof, replay them to a new server
    // handshake: the server's fresh nonce makes both the MAC and the node signature fail.
    let c = Certs::new();
    let server = c.auth(Some("node-b"), true);
    let acc = acceptor(&[Plane::Control], Some("node-b"), 1, server.clone());
    let h = Hello::new(
        Plane::Control,
        Some(NodeId::new("node-a").unwrap()),
        Incarnation(2),
    );
    let (mut cli, hello_frame) = ClientHandshake::new(&h, &c.auth(Some("node-a"), true)).unwrap();
    let mut first = ServerHandshake::new(&acc);
    let Ok(Step::Send(challenge)) = first.on_frame(&hello_frame) else {
        panic!("challenge")
    };
    let Ok(Step::Send(proof)) = cli.on_frame(&challenge) else {
        panic!("proof")
    };
    let mut second = ServerHandshake::new(&acc);
    assert!(matches!(second.on_frame(&hello_frame), Ok(Step::Send(_))));
    let Ok(Step::Finish(_, r)) = second.on_frame(&proof) else {
        panic!("finish")
    };
    assert!(matches!(r, Err(WireError::Unauthenticated(_))), "{r:?}");
}

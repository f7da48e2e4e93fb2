//! A member speaks only for itself, and no member can grow a discovery server's table past
//! its bounds: forged and oversized requests over real, authenticated sockets are refused with
//! typed errors and counted, and the real member's registration is untouched.

use std::net::SocketAddr;
use std::time::Duration;

use peercache_discovery::{DiscReply, DiscRequest, DiscoveryServer, NodeInfo};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcError};
use peercache_wire::{Auth, Incarnation, WireError, envelope};

mod common;
use common::info;

const SECRET: &[u8] = b"discovery-identity-test-secret";
const T: Duration = Duration::from_secs(3);

/// A connection that announces itself as `me` in its handshake.
fn member(me: &NodeInfo) -> RpcClient {
    RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Discovery, Some(me.node.clone()), me.incarnation),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth: Auth::from_secret(SECRET).unwrap(),
    })
}

/// A discovery server on loopback whose members live 30 s past their last heartbeat.
fn server() -> DiscoveryServer {
    DiscoveryServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(30),
        None,
        Auth::from_secret(SECRET).unwrap(),
    )
    .unwrap()
}

/// A tool's connection: the secret, no node id.
fn tool() -> RpcClient {
    RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Discovery, None, Incarnation(5)),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth: Auth::from_secret(SECRET).unwrap(),
    })
}

fn send(c: &RpcClient, at: SocketAddr, req: &DiscRequest) -> Result<DiscReply, WireError> {
    let f = envelope::encode(req, &[]).unwrap();
    rpc::decode_reply::<DiscReply>(&c.call(at, &f, T)?)
}

fn members(c: &RpcClient, at: SocketAddr) -> Vec<NodeInfo> {
    match send(c, at, &DiscRequest::Members).unwrap() {
        DiscReply::Members { members, .. } => members,
        other => panic!("{other:?}"),
    }
}

fn forbidden(r: Result<DiscReply, WireError>) {
    match r {
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_FORBIDDEN, "{message}");
            assert!(message.contains("may act only for itself"), "{message}");
        }
        other => panic!("expected a forbidden refusal, got {other:?}"),
    }
}

#[test]
fn a_member_cannot_register_heartbeat_or_deregister_another() {
    let srv = server();
    let at = srv.local_addr();
    let (a, b) = (info("node-a", 1), info("node-b", 2));
    let (ca, cb) = (member(&a), member(&b));
    send(&ca, at, &DiscRequest::Register(a.clone())).unwrap();
    send(&cb, at, &DiscRequest::Register(b.clone())).unwrap();

    // A, a member with the secret, tries to replace B's announcement with its own endpoints.
    let mut forged = b.clone();
    forged.control = "127.0.0.1:6666".parse().unwrap();
    forbidden(send(&ca, at, &DiscRequest::Register(forged)));
    // ... to keep B alive, or to make it leave.
    forbidden(send(
        &ca,
        at,
        &DiscRequest::Heartbeat {
            node: b.node.clone(),
            incarnation: b.incarnation,
            known_version: 0,
        },
    ));
    forbidden(send(
        &ca,
        at,
        &DiscRequest::Deregister {
            node: b.node.clone(),
            incarnation: b.incarnation,
        },
    ));
    // Another life of itself is not itself either: a stale connection cannot evict the
    // restarted node.
    let mut other_life = a.clone();
    other_life.incarnation = Incarnation(99);
    forbidden(send(&ca, at, &DiscRequest::Register(other_life)));
    // A tool connection (no node id) may read the table but announce nothing.
    let tool = tool();
    forbidden(send(&tool, at, &DiscRequest::Register(info("node-c", 5))));

    assert_eq!(srv.identity_refused(), 5);
    assert_eq!(srv.refused("not_yours"), 5);
    let now = members(&tool, at);
    assert_eq!(now.len(), 2, "{now:?}");
    assert_eq!(now[1], b, "B's announcement changed");
    // B itself still can.
    send(
        &cb,
        at,
        &DiscRequest::Deregister {
            node: b.node.clone(),
            incarnation: b.incarnation,
        },
    )
    .unwrap();
    assert_eq!(members(&tool, at).len(), 1);
}

#[test]
fn an_oversized_announcement_is_refused_and_counted() {
    let srv = server();
    let at = srv.local_addr();
    let mut big = info("node-big", 1);
    big.attrs = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let c = member(&big);
    let refused = |r: Result<DiscReply, WireError>, what: &str| match r {
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_REFUSED, "{message}");
            assert!(message.contains(what), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    refused(
        send(&c, at, &DiscRequest::Register(big.clone())),
        "65 attributes",
    );
    big.attrs = vec![("layout".into(), "x".repeat(20 << 10))];
    refused(send(&c, at, &DiscRequest::Register(big.clone())), "bytes");
    big.attrs.clear();
    big.data = vec!["127.0.0.1:1".parse().unwrap(); 65];
    refused(
        send(&c, at, &DiscRequest::Register(big.clone())),
        "65 data endpoints",
    );
    assert_eq!(srv.refused("oversized"), 3);
    assert_eq!(srv.identity_refused(), 0);
    assert!(members(&c, at).is_empty());
}

#[test]
fn a_registration_in_a_live_members_name_is_counted_and_repaired_by_the_member() {
    let srv = server();
    let at = srv.local_addr();
    let b = info("node-b", 2);
    let victim = peercache_discovery::DiscoveryClient::start(
        b.clone(),
        peercache_discovery::DiscoveryConfig {
            seeds: vec![at],
            heartbeat: Duration::from_millis(50),
            max_masters: 1,
            rpc_timeout: Duration::from_secs(1),
            auth: Auth::from_secret(SECRET).unwrap(),
        },
    )
    .unwrap();
    victim.wait_ready(Some(Duration::from_secs(10))).unwrap();
    // A secret holder whose handshake claims B (its node id and incarnation are public in
    // `Members`) registers B with its own endpoints: taken today, but counted...
    let mut forged = b.clone();
    forged.control = "127.0.0.1:6666".parse().unwrap();
    forged.data = vec!["127.0.0.1:6667".parse().unwrap()];
    let forger = member(&b);
    send(&forger, at, &DiscRequest::Register(forged.clone())).unwrap();
    assert!(srv.live_changes() >= 1);
    // ... and B, seeing an entry in its name that it did not announce, registers its own
    // again: the table shows B's endpoints within a few heartbeats, and stays that way.
    let tool = tool();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while members(&tool, at) != vec![b.clone()] {
        assert!(
            std::time::Instant::now() < deadline,
            "the forged entry persists: {:?}",
            members(&tool, at)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let rounds = victim.rounds();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while victim.rounds() < rounds + 5 {
        assert!(std::time::Instant::now() < deadline, "heartbeats stopped");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(members(&tool, at), vec![b.clone()], "repaired for good");
    assert!(
        srv.live_changes() >= 2,
        "the forgery and the repair are both counted"
    );
    victim.shutdown();
}

#[test]
fn a_registration_announcing_another_hosts_addresses_is_refused_and_counted() {
    let srv = server();
    let at = srv.local_addr();
    let refused = |r: Result<DiscReply, WireError>| match r {
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_REFUSED, "{message}");
            assert!(
                message.contains("not an address of the host it comes from"),
                "{message}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    // A secret holder on this host points its entry's control endpoint at a third host...
    let mut a = info("node-a", 1);
    a.control = "192.0.2.7:1000".parse().unwrap();
    refused(send(&member(&a), at, &DiscRequest::Register(a.clone())));
    // ... or its client endpoint (an attribute holding a socket address).
    let mut b = info("node-b", 2);
    b.attrs = vec![("client".into(), "192.0.2.7:31000".into())];
    refused(send(&member(&b), at, &DiscRequest::Register(b.clone())));
    assert_eq!(srv.refused("foreign_address"), 2);
    assert!(members(&tool(), at).is_empty());
    // Every loopback address is this host's, as a node on 127.0.0.N announces it.
    let mut c = info("node-c", 3);
    c.host = "127.0.0.9".parse().unwrap();
    c.control = "127.0.0.9:1000".parse().unwrap();
    c.attrs = vec![("client".into(), "127.0.0.9:31000".into())];
    send(&member(&c), at, &DiscRequest::Register(c.clone())).unwrap();
    // With the check off (members behind a NAT), the third host's address is taken.
    srv.check_sources(false);
    send(&member(&a), at, &DiscRequest::Register(a.clone())).unwrap();
    assert_eq!(members(&tool(), at).len(), 2);
    assert_eq!(srv.refused("foreign_address"), 2);
}

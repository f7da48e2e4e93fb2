//! A member acts only for itself on a shard: inserts, removes and marks of another node's
//! copies are refused with `CODE_FORBIDDEN` and counted; a hand-off is taken only from a node
//! that held the range, naming only live owners, at most `MAX_HANDOFF_OWNERS` of them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{key, loc, node};
use peercache_directory::admission::MAX_HANDOFF_OWNERS;
use peercache_directory::{
    DirReply, DirRequest, DirectoryService, OwnerRef, Owners, Ring, ShardConfig,
};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcError, RpcServer, ServerConfig};
use peercache_wire::{Auth, Incarnation, NodeId, PageKey, WireError, envelope};

const SECRET: &[u8] = b"directory-identity-test-secret";
const VNODES: u32 = 64;

fn serve(service: Arc<DirectoryService>, me: &NodeId) -> RpcServer {
    RpcServer::start(
        ServerConfig {
            bind: "127.0.0.31:0".parse().unwrap(),
            planes: vec![Plane::Control],
            node: Some(me.clone()),
            incarnation: Incarnation(1),
            max_frame: 16 << 20,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 64,
            offload: &[],
            workers: 1,
            name: "dir-identity",
            auth: Auth::from_secret(SECRET).unwrap(),
            shares: Default::default(),
        },
        service.into_handler(),
    )
    .unwrap()
}

/// A connection whose handshake says it is `who`.
fn as_member(who: &NodeId) -> RpcClient {
    RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Control, Some(who.clone()), Incarnation(1)),
        max_idle_per_peer: 1,
        max_frame: 16 << 20,
        auth: Auth::from_secret(SECRET).unwrap(),
    })
}

fn send(c: &RpcClient, srv: &RpcServer, req: &DirRequest<'_>) -> Result<DirReply, WireError> {
    let f = envelope::encode(req, &[]).unwrap();
    rpc::decode_reply(&c.call(srv.local_addr(), &f, Duration::from_secs(3))?)
}

fn forbidden(r: Result<DirReply, WireError>, what: &str) {
    match r {
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_FORBIDDEN, "{message}");
            assert!(message.contains(what), "{message}");
        }
        other => panic!("expected a forbidden refusal, got {other:?}"),
    }
}

#[test]
fn a_member_cannot_insert_remove_or_mark_another_nodes_copies() {
    let (a, b, shard) = (node(1), node(2), node(3));
    let service = Arc::new(DirectoryService::new(ShardConfig::default()));
    let srv = serve(service.clone(), &shard);
    let (ca, cb) = (as_member(&a), as_member(&b));
    let k = key(1);
    send(&cb, &srv, &DirRequest::Insert(vec![(k, loc(&b, 5))].into())).unwrap();

    // A publishes a location naming B (pointing readers at whatever A likes).
    forbidden(
        send(&ca, &srv, &DirRequest::Insert(vec![(k, loc(&b, 6))].into())),
        "insert",
    );
    // ... or removes / marks B's copy.
    let theirs = OwnerRef {
        key: k,
        node: b.clone(),
        generation: Some(5),
    };
    forbidden(
        send(&ca, &srv, &DirRequest::Remove(vec![theirs.clone()].into())),
        "remove",
    );
    forbidden(
        send(
            &ca,
            &srv,
            &DirRequest::MarkNonResident(vec![theirs.clone()].into()),
        ),
        "mark",
    );
    // One foreign item spoils the whole request: A's own insert in it is not applied either.
    let mixed = vec![(key(2), loc(&a, 1)), (key(3), loc(&b, 1))];
    forbidden(send(&ca, &srv, &DirRequest::Insert(mixed.into())), "insert");
    assert_eq!(service.refusals().identity.get(), 4);

    // B's entry is exactly as B left it; key 2 was never inserted.
    match send(&ca, &srv, &DirRequest::Lookup(vec![k, key(2)].into())).unwrap() {
        DirReply::Found(f) => {
            let owners = f[0].clone().unwrap();
            assert_eq!(owners.len(), 1);
            assert_eq!(owners[0], loc(&b, 5));
            assert!(f[1].is_none());
        }
        other => panic!("{other:?}"),
    }
    // B itself may.
    match send(&cb, &srv, &DirRequest::Remove(vec![theirs].into())).unwrap() {
        DirReply::Applied(1) => {}
        other => panic!("{other:?}"),
    }
}

/// A key whose owners (2 replicas) on `ring` include `holder` and not `outsider`.
fn key_held_by(ring: &Ring, holder: &NodeId, outsider: &NodeId) -> PageKey {
    (0..10_000)
        .map(|i| key(1000 + i))
        .find(|k| {
            let o = ring.owners(*k, 2);
            o.contains(holder) && !o.contains(outsider)
        })
        .expect("some key")
}

#[test]
fn a_handoff_is_taken_only_from_a_holder_and_only_for_live_owners() {
    let (a, b, c, me) = (node(11), node(12), node(13), node(14));
    let service = Arc::new(DirectoryService::new(ShardConfig::default()));
    let srv = serve(service.clone(), &me);
    let ring = Ring::new([a.clone(), b.clone(), c.clone(), me.clone()], VNODES);
    service.set_holders(ring.clone(), ring.clone(), 2);
    let k = key_held_by(&ring, &a, &b);
    let owners: Owners = [loc(&a, 1)].into_iter().collect();

    // B never held k's range: refused as a whole, counted.
    forbidden(
        send(
            &as_member(&b),
            &srv,
            &DirRequest::Handoff(vec![(k, owners.clone())].into()),
        ),
        "held none of their ranges",
    );
    assert_eq!(service.refusals().not_a_holder.get(), 1);
    assert_eq!(service.refusals().identity.get(), 1);
    assert!(service.with_shard(|s, _| s.peek(k).is_none()));

    // A held it: taken, but an owner that is not a live member is dropped from the entry.
    let ghost = NodeId::new("not-a-member").unwrap();
    let mut with_ghost = owners.clone();
    with_ghost.push(loc(&ghost, 1));
    match send(
        &as_member(&a),
        &srv,
        &DirRequest::Handoff(vec![(k, with_ghost)].into()),
    )
    .unwrap()
    {
        DirReply::Applied(_) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(service.refusals().dead_owners.get(), 1);
    let held = service.with_shard(|s, _| s.peek(k)).unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].node, a);

    // An entry naming more owners than the bound is dropped (the ring has only four members,
    // so a ring of many members makes them all live).
    let many: Vec<NodeId> = (0..MAX_HANDOFF_OWNERS + 1)
        .map(|i| NodeId::new(format!("m{i}")).unwrap())
        .collect();
    let big_ring = Ring::new(many.iter().cloned().chain([a.clone()]), VNODES);
    service.set_holders(big_ring.clone(), big_ring.clone(), 2);
    let holder = big_ring.owners(key(7), 2)[0].clone();
    let crowd: Owners = many.iter().map(|n| loc(n, 1)).collect();
    send(
        &as_member(&holder),
        &srv,
        &DirRequest::Handoff(vec![(key(7), crowd)].into()),
    )
    .unwrap();
    assert_eq!(service.refusals().too_many_owners.get(), 1);
    assert!(service.with_shard(|s, _| s.peek(key(7)).is_none()));
}

#[test]
fn a_handoff_that_arrives_before_the_first_ring_is_judged_when_it_arrives() {
    let (a, b, c, me) = (node(21), node(22), node(24), node(23));
    let service = Arc::new(DirectoryService::new(ShardConfig::default()));
    let srv = serve(service.clone(), &me);
    let before = Ring::new([a.clone(), b.clone(), c.clone()], VNODES);
    let k_a = key_held_by(&before, &a, &b);
    let k_b = key_held_by(&before, &b, &a);
    let from_a: Owners = [loc(&a, 1)].into_iter().collect();
    // A sends both keys (one of them B's range) before this newcomer has any ring.
    send(
        &as_member(&a),
        &srv,
        &DirRequest::Handoff(vec![(k_a, from_a.clone()), (k_b, from_a)].into()),
    )
    .unwrap();
    assert!(service.with_shard(|s, _| s.len()) == 0);
    let after = Ring::new([a.clone(), b.clone(), c.clone(), me.clone()], VNODES);
    service.set_holders(before, after.clone(), 2);
    assert!(service.with_shard(|s, _| s.peek(k_a).is_some()));
    // k_b's range was B's, unless the new ring made A an owner of it.
    let a_owns_k_b = after.owners(k_b, 2).contains(&a);
    assert_eq!(service.with_shard(|s, _| s.peek(k_b).is_some()), a_owns_k_b);
    assert_eq!(
        service.refusals().not_a_holder.get(),
        u64::from(!a_owns_k_b)
    );
}

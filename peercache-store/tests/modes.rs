//! Centralized and hybrid modes on loopback: storage servers hold the pages inference nodes
//! write (prepare → one-sided write → commit, ingest as the fallback), reservations that are
//! never committed are released, only the reserving node may write a reserved slot, and the
//! fallbacks when no storage server exists.

use std::time::{Duration, Instant};

use peercache_store::Store;
use peercache_store::control::{PrepareOutcome, StoreReply, StoreRequest};
use peercache_transport::{
    Access, Batch, OpError, RegionKey, RemoteRange, Segment, Transport, TransportConfig,
};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Incarnation, NodeId, PageKey, envelope};
use serde_json::json;

mod common;

/// A transport that proves the test nodes' secret.
fn authed() -> TransportConfig {
    TransportConfig {
        auth: peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap(),
        ..TransportConfig::default()
    }
}
use common::{free_port, get as read_all, page, settle};

/// A node on 127.0.0.`n` named `n<n>`.
fn node(n: u8, seed: u8, port: u16, extra: serde_json::Value) -> Store {
    let mut m = json!({"node_id": format!("n{n}")});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    common::node(n, seed, port, m)
}

/// A centralized storage server on 127.0.0.`n` (its settings: `extra`) and an inference node
/// on 127.0.0.`n + 1` that writes into it, both members.
fn storage_and_writer(n: u8, extra: serde_json::Value) -> (Store, Store) {
    let port = free_port();
    let mut storage = json!({"mode": "centralized", "role": "storage"});
    for (k, v) in extra.as_object().unwrap() {
        storage[k] = v.clone();
    }
    let s = node(n, n, port, storage);
    let a = node(n + 1, n, port, json!({"mode": "centralized"}));
    settle(&[&s, &a]);
    (s, a)
}

/// One store RPC to `s`'s control port as `who`, answered within 2 s.
fn store_call(
    who: &RpcClient,
    s: &Store,
    req: &StoreRequest,
) -> Result<StoreReply, peercache_wire::WireError> {
    let f = who
        .call(
            s.control_endpoint(),
            &envelope::encode(req, &[]).unwrap(),
            Duration::from_secs(2),
        )
        .unwrap();
    rpc::decode_reply::<StoreReply>(&f)
}

#[test]
fn centralized_writes_land_on_storage_servers_and_read_back_byte_exact() {
    let port = free_port();
    let central = json!({"mode": "centralized"});
    let storage = json!({"mode": "centralized", "role": "storage"});
    let s1 = node(110, 110, port, storage.clone());
    let s2 = node(111, 110, port, storage);
    let a = node(112, 110, port, central.clone());
    let b = node(113, 110, port, central);
    settle(&[&s1, &s2, &a, &b]);

    let len = 32 << 10;
    let keys: Vec<String> = (0..40).map(|i| format!("central-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..40).map(|i| page(i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    // Inference nodes hold nothing; the storage servers hold every page once.
    assert_eq!(a.stats().pool_pages, 0);
    assert_eq!(s1.stats().pool_pages + s2.stats().pool_pages, 40);
    assert!(s1.stats().pool_pages > 0 && s2.stats().pool_pages > 0);
    for o in a.locate(&keys).unwrap() {
        let o = o.expect("every page is in the directory");
        assert!(
            o.iter()
                .all(|l| l.node.as_str() == "n110" || l.node.as_str() == "n111")
        );
    }
    let (got, out) = read_all(&b, &keys, len);
    assert!(got.iter().all(|&x| x));
    assert_eq!(out, pages);
    assert_eq!(b.batch_exists(&keys).unwrap(), 40);
    // Writing again is answered "present" without moving the bytes.
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    assert_eq!(s1.stats().pool_pages + s2.stats().pool_pages, 40);

    // From a registered host buffer the one-sided write goes straight from it (no staging).
    let mut host = vec![0u8; 8 * len];
    for (i, chunk) in host.chunks_mut(len).enumerate() {
        chunk.copy_from_slice(&page(1000 + i as u64, len));
    }
    // SAFETY: `host` outlives the node (shut down below before it is dropped).
    unsafe { a.register_host_buffer(host.as_mut_ptr(), host.len()) }.unwrap();
    let hkeys: Vec<String> = (0..8).map(|i| format!("central-host-{i}")).collect();
    let hrefs: Vec<&[u8]> = host.chunks(len).collect();
    assert!(a.batch_set(&hkeys, &hrefs).unwrap().iter().all(|&x| x));
    let (got, out) = read_all(&b, &hkeys, len);
    assert!(got.iter().all(|&x| x));
    assert_eq!(
        out,
        host.chunks(len).map(|c| c.to_vec()).collect::<Vec<_>>()
    );
    for s in [a, b, s1, s2] {
        s.shutdown();
    }
}

/// A control connection whose handshake says it is node `who`.
fn as_node(who: &str) -> RpcClient {
    RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(
            Plane::Control,
            Some(NodeId::new(who).unwrap()),
            Incarnation(7),
        ),
        max_idle_per_peer: 1,
        max_frame: 1 << 20,
        auth: peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap(),
    })
}

#[test]
fn uncommitted_reservations_are_released_and_only_the_reserver_may_write() {
    // A write admitted into a slot may land until the data server's deadline (`op_timeout`),
    // so the reservation outlives it: writes are admitted in the first 0.5 s.
    let (s, a) = storage_and_writer(120, json!({"reservation_timeout": 1.5, "op_timeout": 1.0}));
    let len = 16 << 10;
    let key = "leaked-0";
    let pk = PageKey::from_key(key);
    let prepare = |writer: &str| {
        let rpc = as_node(writer);
        let req = StoreRequest::Prepare {
            writer: NodeId::new(writer).unwrap(),
            pages: vec![(pk, len as u32, len as u32)],
        };
        let f = rpc
            .call(
                s.control_endpoint(),
                &envelope::encode(&req, &[]).unwrap(),
                Duration::from_secs(2),
            )
            .unwrap();
        match rpc::decode_reply::<StoreReply>(&f).unwrap() {
            StoreReply::Prepared(mut v) => v.remove(0),
            other => panic!("{other:?}"),
        }
    };
    // A writer reserves a slot and never commits.
    let PrepareOutcome::Slot { addr, region, .. } = prepare("ghost") else {
        panic!("expected a slot");
    };
    // While reserved, nobody else gets the key ("being written"), and a write of it fails.
    assert!(matches!(prepare("other"), PrepareOutcome::Refused(_)));
    let p = page(77, len);
    assert_eq!(a.batch_set(&[key], &[p.as_slice()]).unwrap(), vec![false]);

    // Least privilege on the data plane: only the reserving node may write the slot.
    let write_as = |who: &str, addr: u64| {
        let t = Transport::start(authed(), Some(NodeId::new(who).unwrap())).unwrap();
        let mut src = page(5, len);
        // SAFETY: `src` outlives the handle (dropped at the end of this closure).
        let h = unsafe { t.register(src.as_mut_ptr(), src.len(), Access::LocalOnly) }.unwrap();
        let b = common::one_op(region, addr, len as u32, &h);
        let r = t.write_batch(s.data_endpoint(), &b).unwrap();
        drop(h);
        r[0].clone()
    };
    assert!(matches!(
        write_as("mallory", addr),
        Err(OpError::AccessDenied(_))
    ));
    // ... nor past the end of the slot, even the reserver.
    assert!(matches!(
        write_as("ghost", addr + 1),
        Err(OpError::AccessDenied(_))
    ));
    assert!(write_as("ghost", addr).is_ok());
    // After the reservation expires it is released: the same key can now be stored for real.
    let t0 = Instant::now();
    loop {
        if a.batch_set(&[key], &[p.as_slice()]).unwrap()[0] {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "reservation never released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "released too early"
    );
    let mut out = vec![0u8; len];
    assert!(a.batch_get(&[key], &mut [&mut out[..]]).unwrap()[0]);
    assert_eq!(out, p);
    // The expired writer can no longer write anywhere.
    assert!(matches!(
        write_as("ghost", addr),
        Err(OpError::AccessDenied(_))
    ));
    a.shutdown();
    s.shutdown();
}

#[test]
fn without_storage_servers_centralized_fails_fast_and_hybrid_falls_back() {
    let port = free_port();
    let c = node(130, 130, port, json!({"mode": "centralized"}));
    let h = node(
        131,
        130,
        port,
        json!({"mode": "hybrid", "write_policy": "storage"}),
    );
    settle(&[&c, &h]);
    let p = page(1, 4096);
    let t0 = Instant::now();
    assert_eq!(
        c.batch_set(&["x", "y"], &[p.as_slice(), p.as_slice()])
            .unwrap(),
        vec![false, false]
    );
    assert!(t0.elapsed() < Duration::from_millis(500), "no hang");
    // Hybrid with write_policy=storage and no storage server: the local pool.
    assert_eq!(h.batch_set(&["x"], &[p.as_slice()]).unwrap(), vec![true]);
    assert_eq!(h.stats().pool_pages, 1);
    let mut out = vec![0u8; 4096];
    assert!(c.batch_get(&["x"], &mut [&mut out[..]]).unwrap()[0]);
    assert_eq!(out, p);
    c.shutdown();
    h.shutdown();
}

#[test]
fn hybrid_write_policies() {
    let port = free_port();
    let s = node(140, 140, port, json!({"mode": "hybrid", "role": "storage"}));
    let local = node(141, 140, port, json!({"mode": "hybrid"}));
    let storage = node(
        142,
        140,
        port,
        json!({"mode": "hybrid", "write_policy": "storage"}),
    );
    let both = node(
        143,
        140,
        port,
        json!({"mode": "hybrid", "write_policy": "both"}),
    );
    settle(&[&s, &local, &storage, &both]);
    let p = page(9, 8192);
    for (n, w) in [(&local, "l"), (&storage, "s"), (&both, "b")] {
        assert!(n.batch_set(&[w], &[p.as_slice()]).unwrap()[0]);
    }
    // local: p2p, in its own pool only; storage: on the server only; both: in both places.
    let owners = |k: &str| -> Vec<String> {
        let mut v: Vec<String> = local.locate(&[k]).unwrap()[0]
            .as_ref()
            .unwrap()
            .iter()
            .map(|l| l.node.to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(owners("l"), vec!["n141"]);
    assert_eq!(owners("s"), vec!["n140"]);
    assert_eq!(owners("b"), vec!["n140", "n143"]);
    assert_eq!(storage.stats().pool_pages, 0);
    assert_eq!(both.stats().pool_pages, 1);
    assert_eq!(s.stats().pool_pages, 2);
    for k in ["l", "s", "b"] {
        let mut out = vec![0u8; 8192];
        assert!(
            storage.batch_get(&[k], &mut [&mut out[..]]).unwrap()[0],
            "{k}"
        );
        assert_eq!(out, p);
    }
    for n in [local, storage, both, s] {
        n.shutdown();
    }
}

#[test]
fn a_failed_one_sided_write_falls_back_to_ingest() {
    // Reservations that expire at once: every one-sided write is refused by the server's
    // guard, so every page must travel by the ingest fallback. A write may land until the data
    // server's deadline (op_timeout), which here ends a microsecond after the reservation
    // does: the guard refuses every write.
    let (s, a) = storage_and_writer(
        150,
        json!({"reservation_timeout": 1.0, "op_timeout": 0.999999}),
    );
    let keys: Vec<String> = (0..6).map(|i| format!("ingested-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..6).map(|i| page(300 + i, 12 << 10)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    assert_eq!(s.stats().pool_pages, 6);
    let (got, out) = read_all(&a, &keys, 12 << 10);
    assert!(got.iter().all(|&x| x));
    assert_eq!(out, pages);
    a.shutdown();
    s.shutdown();
}

/// A storage server publishes a reserved page only if its bytes are the writer's: a commit
/// whose checksum does not match what landed in the slot (a torn or stray write) is refused
/// and the slot released; the matching commit publishes it.
#[test]
fn a_commit_publishes_only_the_bytes_the_writer_checksummed() {
    let (s, _writer) = storage_and_writer(124, json!({}));
    let rpc = as_node("w");
    let call = |req: &StoreRequest| store_call(&rpc, &s, req).unwrap();
    let len = 8 << 10;
    let pk = PageKey::from_key("checked-0");
    let writer = Transport::start(authed(), Some(NodeId::new("w").unwrap())).unwrap();
    let mut src = page(11, len);
    // SAFETY: `src` outlives the handle (dropped before it at the end of the test).
    let h = unsafe { writer.register(src.as_mut_ptr(), src.len(), Access::LocalOnly) }.unwrap();
    let attempt = |sum: u64| {
        let prep = StoreRequest::Prepare {
            writer: NodeId::new("w").unwrap(),
            pages: vec![(pk, len as u32, len as u32)],
        };
        let StoreReply::Prepared(mut o) = call(&prep) else {
            panic!("prepare failed")
        };
        let PrepareOutcome::Slot {
            token,
            addr,
            region,
        } = o.remove(0)
        else {
            panic!("expected a slot")
        };
        let b = common::one_op(region, addr, len as u32, &h);
        assert!(writer.write_batch(s.data_endpoint(), &b).unwrap()[0].is_ok());
        match call(&StoreRequest::CommitVerified(vec![(token, sum)])) {
            StoreReply::Committed(l) => l[0].clone(),
            other => panic!("{other:?}"),
        }
    };
    let right = peercache_pool::header::checksum(&page(11, len));
    assert_eq!(attempt(right ^ 1), None, "a mismatching commit is refused");
    // The refused slot was released, so the same key can be prepared and committed again.
    let loc = attempt(right).expect("the matching commit publishes");
    assert_eq!(loc.checksum, right);
    drop(h);
    drop(src);
}

/// The storage write protocol belongs to the writer a connection announced: a prepare for
/// another writer, and a commit or abort of another writer's reservation, are refused and
/// counted (the reservation survives them); an unverified commit is not served; tokens are
/// random.
#[test]
fn a_member_cannot_prepare_commit_or_abort_for_another_writer() {
    let (s, a) = storage_and_writer(126, json!({}));
    let call = |who: &RpcClient, req: &StoreRequest| store_call(who, &s, req);
    let (w1, w2) = (as_node("w1"), as_node("w2"));
    let len = 8 << 10;
    let pages: Vec<(PageKey, u32, u32)> = (0..8)
        .map(|i| (PageKey::from_key(&format!("owned-{i}")), len, len))
        .collect();
    let prepare = |who: &RpcClient, writer: &str| {
        call(
            who,
            &StoreRequest::Prepare {
                writer: NodeId::new(writer).unwrap(),
                pages: pages.clone(),
            },
        )
    };
    let forbidden = |r: Result<StoreReply, peercache_wire::WireError>| match r {
        Err(peercache_wire::WireError::Remote { code, message }) => {
            assert_eq!(code, rpc::RpcError::CODE_FORBIDDEN, "{message}");
        }
        other => panic!("expected a forbidden refusal, got {other:?}"),
    };
    // w2 reserves in w1's name; a tool connection reserves at all.
    forbidden(prepare(&w2, "w1"));
    let tool = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(3)),
        max_idle_per_peer: 1,
        max_frame: 1 << 20,
        auth: peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap(),
    });
    forbidden(prepare(&tool, "w1"));
    assert_eq!(s.stats().identity_refused, 2);

    let Ok(StoreReply::Prepared(slots)) = prepare(&w1, "w1") else {
        panic!("w1's own prepare failed")
    };
    let slots: Vec<(u64, u64, u64)> = slots
        .into_iter()
        .map(|o| match o {
            PrepareOutcome::Slot {
                token,
                addr,
                region,
            } => (token, addr, region),
            other => panic!("{other:?}"),
        })
        .collect();
    // Tokens are random: none is zero, no two are neighbours (a counter's would be).
    let mut tokens: Vec<u64> = slots.iter().map(|s| s.0).collect();
    tokens.sort_unstable();
    assert!(
        tokens[0] != 0 && tokens.windows(2).all(|w| w[1] - w[0] > 1),
        "{tokens:?}"
    );

    // w1 writes its pages into the slots.
    let writer = Transport::start(authed(), Some(NodeId::new("w1").unwrap())).unwrap();
    let mut src = page(21, len as usize);
    // SAFETY: `src` outlives the handle (dropped before it at the end of the test).
    let h = unsafe { writer.register(src.as_mut_ptr(), src.len(), Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    for &(_, addr, region) in &slots {
        b.push(
            RemoteRange {
                region: RegionKey(region),
                addr,
                len,
            },
            &[Segment {
                region: h.key(),
                addr: h.addr(0),
                len,
            }],
        );
    }
    assert!(
        writer
            .write_batch(s.data_endpoint(), &b)
            .unwrap()
            .iter()
            .all(|r| r.is_ok())
    );
    let sum = peercache_pool::header::checksum(&page(21, len as usize));
    let verified: Vec<(u64, u64)> = slots.iter().map(|s| (s.0, sum)).collect();
    let all: Vec<u64> = slots.iter().map(|s| s.0).collect();

    // w2 (who could have learned the tokens) commits or aborts them: refused per token.
    match call(&w2, &StoreRequest::CommitVerified(verified.clone())).unwrap() {
        StoreReply::Committed(l) => assert!(l.iter().all(Option::is_none)),
        other => panic!("{other:?}"),
    }
    match call(&w2, &StoreRequest::Abort(all.clone())).unwrap() {
        StoreReply::Aborted(0) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(s.stats().identity_refused, 2 + 8 + 8);
    // The legacy unverified commit publishes nothing, whoever sends it.
    match call(&w1, &StoreRequest::Commit(all)) {
        Err(peercache_wire::WireError::Remote { code, message }) => {
            assert_eq!(code, rpc::RpcError::CODE_REFUSED);
            assert!(message.contains("CommitVerified"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // w1's reservations survived all of it: its verified commit publishes every page, and the
    // storage server itself recorded them in the directory (a node publishes only its own).
    match call(&w1, &StoreRequest::CommitVerified(verified)).unwrap() {
        StoreReply::Committed(l) => assert!(l.iter().all(Option::is_some), "{l:?}"),
        other => panic!("{other:?}"),
    }
    let keys: Vec<String> = (0..8).map(|i| format!("owned-{i}")).collect();
    for o in a.locate(&keys).unwrap() {
        assert_eq!(o.expect("recorded")[0].node.as_str(), "n126");
    }
    let (got, out) = read_all(&a, &keys, len as usize);
    assert!(got.iter().all(|&x| x));
    assert!(out.iter().all(|p| *p == page(21, len as usize)));
    drop(h);
    drop(src);
    a.shutdown();
    s.shutdown();
}

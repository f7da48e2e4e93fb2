//! `discovery = "etcd"` against a real etcd (Debian's `etcd`, see `scripts/etcd.sh`): a
//! three-node cluster joins through etcd and serves pages byte-exact; a node process killed
//! with SIGKILL leaves when its lease expires and none of its pages is served after; an etcd
//! restart while nodes run keeps the membership (stale in `/cluster`) and no page is served
//! wrong meanwhile.
#![cfg(feature = "etcd")]

mod common;
use common::wait_until;

use std::time::{Duration, Instant};

use peercache_store::Store;
use peercache_wire::testkit::etcd::EtcdServer;
use serde_json::json;

fn etcd_node(n: u8, etcd: &EtcdServer, prefix: &str) -> Store {
    common::start(common::config(
        &format!("127.0.0.{n}"),
        "127.0.0.1",
        1,
        json!({
            "discovery": "etcd", "discovery_addr": "",
            "etcd_endpoints": etcd.url(), "etcd_prefix": prefix,
            "heartbeat_interval": 0.3, "member_ttl": 2.0,
        }),
    ))
}

fn pages(seed: u64, n: usize, len: usize) -> (Vec<String>, Vec<Vec<u8>>) {
    let keys = (0..n).map(|i| format!("etcd/{seed}/{i}")).collect();
    let pages = (0..n)
        .map(|i| common::page(seed * 1000 + i as u64, len))
        .collect();
    (keys, pages)
}

#[test]
fn three_nodes_join_through_etcd_and_serve_pages_byte_exact() {
    let etcd = EtcdServer::start("127.0.0.1");
    let nodes: Vec<Store> = (61..=63).map(|n| etcd_node(n, &etcd, "/s1")).collect();
    for s in &nodes {
        assert!(s.wait_members(3, Duration::from_secs(10)));
        s.sync_membership();
    }
    let len = 32 << 10;
    let written: Vec<(Vec<String>, Vec<Vec<u8>>)> = (0..3)
        .map(|i| {
            let (keys, data) = pages(i as u64 + 1, 24, len);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            assert!(nodes[i].batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
            (keys, data)
        })
        .collect();
    for (i, reader) in nodes.iter().enumerate() {
        for (j, (keys, data)) in written.iter().enumerate() {
            let (hits, got) = common::get(reader, keys, len);
            assert!(
                hits.iter().all(|&h| h),
                "node {i} reading node {j}'s: {hits:?}"
            );
            assert!(got == *data, "node {i} read a wrong page of node {j}");
        }
    }
    let view = nodes[0].cluster_view();
    assert_eq!(view["discovery"]["kind"], "etcd");
    assert_eq!(view["discovery"]["stale"], false);
    assert_eq!(view["discovery"]["sources"][0], etcd.url());
    assert_eq!(view["masters"], json!([]));
    assert_eq!(view["members"].as_array().unwrap().len(), 3);
    for s in nodes {
        s.shutdown();
    }
}

#[test]
fn a_node_killed_with_sigkill_leaves_within_its_lease() {
    let etcd = EtcdServer::start("127.0.0.1");
    let reader = etcd_node(64, &etcd, "/s2");
    let client_port = common::free_port();
    let endpoints = format!("etcd_endpoints={}", etcd.url());
    let mut owner = common::node_process(
        env!("CARGO_BIN_EXE_peercache-node"),
        &["--host", "127.0.0.65"],
        &[
            "node_id=etcd-owner",
            "discovery=etcd",
            &endpoints,
            "etcd_prefix=/s2",
            "protocol=tcp",
            "global_segment_size=64mb",
            "host_local=false",
            "heartbeat_interval=0.3",
            "member_ttl=2",
        ],
        client_port,
    );
    assert!(reader.wait_members(2, Duration::from_secs(20)));
    reader.sync_membership();
    let c = common::client(format!("127.0.0.65:{client_port}").parse().unwrap());
    let len = 16 << 10;
    let (keys, data) = pages(7, 32, len);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    // The client API may come up a moment after the node joined.
    wait_until("owner's client API", Duration::from_secs(10), || {
        c.put(&keys, &refs).is_ok_and(|s| s.iter().all(|&x| x))
    });
    // Readable once the owner's ring lists the reader (a watch round at most).
    wait_until(
        "the owner's pages readable",
        Duration::from_secs(10),
        || common::get(&reader, &keys, len).0.iter().all(|&h| h),
    );
    let (hits, got) = common::get(&reader, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == data);

    owner.0.kill().unwrap(); // SIGKILL: no revoke, the lease must run out
    owner.0.wait().unwrap();
    let t0 = Instant::now();
    wait_until("the killed node leaves", Duration::from_secs(10), || {
        reader.members().len() == 1
    });
    let took = t0.elapsed();
    // Lease TTL 2 s plus one watch round (and etcd's expiry check).
    assert!(took < Duration::from_secs(4), "left after {took:?}");
    reader.sync_membership();
    let (hits, _) = common::get(&reader, &keys, len);
    assert!(
        hits.iter().all(|&h| !h),
        "served after its owner died: {hits:?}"
    );
    reader.shutdown();
}

#[test]
fn an_etcd_restart_keeps_nodes_serving_and_membership_resumes() {
    let mut etcd = EtcdServer::start("127.0.0.1");
    let a = etcd_node(66, &etcd, "/s3");
    let b = etcd_node(67, &etcd, "/s3");
    common::settle(&[&a, &b]);
    let len = 16 << 10;
    let (keys, data) = pages(9, 32, len);
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));

    etcd.kill();
    wait_until("stale in /cluster", Duration::from_secs(10), || {
        a.cluster_view()["discovery"]["stale"] == true
            && b.cluster_view()["discovery"]["stale"] == true
    });
    // Membership kept: b still reads a's pages, byte-exact, while etcd is away.
    assert_eq!(b.members().len(), 2);
    let (hits, got) = common::get(&b, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == data, "a wrong page while etcd was away");

    etcd.restart();
    wait_until("membership resumed", Duration::from_secs(15), || {
        a.cluster_view()["discovery"]["stale"] == false
            && b.cluster_view()["discovery"]["stale"] == false
    });
    assert_eq!(a.members().len(), 2);
    let (hits, got) = common::get(&b, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == data);
    // New members are seen again.
    let c = etcd_node(68, &etcd, "/s3");
    assert!(a.wait_members(3, Duration::from_secs(10)));
    for s in [a, b, c] {
        s.shutdown();
    }
}

#[test]
fn a_node_with_etcd_unreachable_waits_then_names_etcd() {
    // Nothing listens there: start waits (retrying) and then fails with a typed error.
    let port = common::free_port();
    let cfg = common::config(
        "127.0.0.69",
        "127.0.0.1",
        1,
        json!({
            "discovery": "etcd", "discovery_addr": "",
            "etcd_endpoints": format!("http://127.0.0.1:{port}"),
            "op_timeout": 0.3,
        }),
    );
    let s = Store::start(cfg).unwrap();
    let t0 = Instant::now();
    let err = s.wait_ready(Some(Duration::from_secs(2))).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert!(err.to_string().contains("etcd"), "{err}");
    s.shutdown();
}

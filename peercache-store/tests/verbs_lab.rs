//! The store on real kernel verbs: soft-RoCE (`rdma_rxe`) in the throwaway guest of
//! `scripts/rdma-lab.sh`, run by the `rdma-verbs` CI stage. Ignored elsewhere: they need the
//! lab's device and addresses (`PEERCACHE_LAB_DEVICE`, `PEERCACHE_LAB_GID`,
//! `PEERCACHE_LAB_ADDRS`, and 10.77.0.3, which the stage's guest script adds). Every node
//! reads over `protocol = "rdma"` with the sideway backend; deadlines allow for emulation.
#![cfg(feature = "rdma")]

use std::time::Duration;

use peercache_store::Store;
use serde_json::json;

mod common;
use common::{config, free_port, get, page, start};

const LAB: &str = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)";

/// The lab's address `i` (0 and 1 from the lab, 2 = 10.77.0.3).
fn addr(i: usize) -> String {
    let addrs = std::env::var("PEERCACHE_LAB_ADDRS").unwrap_or_else(|_| panic!("{LAB}"));
    let mut v: Vec<String> = addrs.split_whitespace().map(str::to_string).collect();
    v.push("10.77.0.3".into());
    v[i].clone()
}

/// A node on lab address `i` seeded by address 0, reading over kernel verbs.
fn verbs_node(i: usize, port: u16, extra: serde_json::Value) -> Store {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k}: {LAB}"));
    let mut settings = json!({
        "protocol": "rdma", "rdma_backend": "verbs",
        "device_names": var("PEERCACHE_LAB_DEVICE"),
        "gid_index": var("PEERCACHE_LAB_GID").parse::<i64>().unwrap(),
        "host_local": false, "op_timeout": 20.0, "suspect_for": 0.5,
        "heartbeat_interval": 0.5, "member_ttl": 5.0,
    });
    for (k, v) in extra.as_object().unwrap() {
        settings[k] = v.clone();
    }
    start(config(&addr(i), &addr(0), port, settings))
}

fn rdma_bytes(s: &Store) -> u64 {
    s.stats().rdma_read_bytes
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_node_that_joins_after_publish_reads_the_pages_over_verbs() {
    let port = free_port();
    let a = verbs_node(0, port, json!({}));
    let b = verbs_node(1, port, json!({}));
    assert!(a.wait_members(2, Duration::from_secs(30)));
    let len = 128 << 10;
    let keys: Vec<String> = (0..32).map(|i| format!("early-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..32).map(|i| page(i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));

    // A third node joins after the pages were published: the directory hands it its ranges,
    // and it reads every page one-sided from the writer's pool.
    let c = verbs_node(2, port, json!({}));
    for n in [&a, &b, &c] {
        assert!(n.wait_members(3, Duration::from_secs(30)));
        n.sync_membership();
    }
    assert_eq!(c.batch_exists(&keys).unwrap(), keys.len());
    let (hits, got) = get(&c, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == pages, "pages differ");
    assert!(
        rdma_bytes(&c) >= (keys.len() * len) as u64,
        "read over RDMA: {:?}",
        c.stats()
    );
    for n in [a, b, c] {
        n.shutdown();
    }
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_reader_racing_an_evicting_writer_never_accepts_wrong_bytes_over_verbs() {
    // 4 MiB pools of 16 KiB pages: the writer evicts constantly while the reader reads its
    // slots one-sided — the NIC may land a page the writer is overwriting; verification must
    // turn that into a miss.
    let port = free_port();
    let extra = json!({"global_segment_size": "4mb", "exists_prime_ttl": 5.0});
    let w = verbs_node(0, port, extra.clone());
    let r = verbs_node(1, port, extra);
    for n in [&w, &r] {
        assert!(n.wait_members(2, Duration::from_secs(30)));
        n.sync_membership();
    }
    let (accepted, missed) = common::race(
        &w,
        &r,
        common::Race {
            keys: 1000,
            writes: 4000,
            rounds: 120,
        },
    );
    let s = r.stats();
    eprintln!(
        "racing reader over verbs: {accepted} pages accepted byte-exact, {missed} misses, \
         {} verification rejects, {} bytes over RDMA",
        s.verify_rejects, s.rdma_read_bytes
    );
    assert!(accepted > 0);
    assert!(s.rdma_read_bytes > 0, "{s:?}");
    w.shutdown();
    r.shutdown();
}

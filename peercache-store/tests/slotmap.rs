//! Slotmap mode on loopback: directory-free placement, cross-node round trips, overflow beyond
//! the ways, length mismatches, and writers racing readers on one bucket with no wrong page
//! ever accepted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use peercache_store::Store;
use serde_json::json;

mod common;
use common::get;

/// A slotmap cluster (64 KiB slots, 4 ways, 16 MiB regions; `extra` overrides).
fn cluster(hosts: &[u8], extra: serde_json::Value) -> Vec<Store> {
    let mut m = json!({
        "mode": "slotmap", "global_segment_size": "16mb", "slot_max_page_bytes": "64kb",
        "slot_ways": 4,
    });
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    common::cluster(hosts, m)
}

/// A page that says which key and version it is, the rest derived from both.
fn page(key: u64, version: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    out[..8].copy_from_slice(&key.to_le_bytes());
    out[8..16].copy_from_slice(&version.to_le_bytes());
    let mut x = (key << 32 ^ version).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in out[16..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    out
}

/// True if `bytes` is exactly some version of `key`'s page.
fn is_a_version_of(bytes: &[u8], key: u64) -> bool {
    let k = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let v = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    k == key && bytes == page(key, v, bytes.len()).as_slice()
}

#[test]
fn cross_node_round_trips_overflow_and_length_mismatch() {
    let nodes = cluster(&[160, 161, 162], json!({}));
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let len = 24 << 10;
    let keys: Vec<String> = (0..60).map(|i| format!("sm-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..60).map(|i| page(i, 1, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    // No directory: the pages live in their owners' slot regions, found by hashing.
    assert_eq!(a.stats().shard_entries + b.stats().shard_entries, 0);
    assert_eq!(c.batch_exists(&keys).unwrap(), 60);
    let (got, out) = get(b, &keys, len);
    assert!(got.iter().all(|&x| x));
    assert_eq!(out, pages);
    // Never-written keys are clean misses; exists stops at the first one.
    let mut with_hole = keys[..5].to_vec();
    with_hole.insert(2, "never-written".into());
    assert_eq!(c.batch_exists(&with_hole).unwrap(), 2);
    assert_eq!(
        c.batch_contains(&with_hole).unwrap(),
        vec![true, true, false, true, true, true]
    );
    let (got, _) = get(c, &with_hole, len);
    assert_eq!(got, vec![true, true, false, true, true, true]);
    // A different length is a miss, never a truncated page.
    let (got, _) = get(c, &keys[..3], len - 1);
    assert_eq!(got, vec![false; 3]);
    // Overwriting returns the new bytes.
    let v2 = page(7, 2, len);
    assert!(b.batch_set(&keys[7..8], &[v2.as_slice()]).unwrap()[0]);
    let (got, out) = get(c, &keys[7..8], len);
    assert!(got[0]);
    assert_eq!(out[0], v2);
}

#[test]
fn overflow_beyond_the_ways_evicts_the_oldest() {
    // One bucket per node: every key of an owner shares it.
    let nodes = cluster(&[163, 164], json!({"slot_num_buckets": 1}));
    let len = 8 << 10;
    let keys: Vec<String> = (0..40).map(|i| format!("of-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..40).map(|i| page(100 + i, 1, len)).collect();
    for (k, p) in keys.iter().zip(&pages) {
        assert!(nodes[0].batch_set(&[k], &[p.as_slice()]).unwrap()[0]);
    }
    let (got, out) = get(&nodes[1], &keys, len);
    // Two owners × one bucket × four ways: at most eight pages survive, and each is right.
    let hits = got.iter().filter(|&&x| x).count();
    assert!(hits > 0 && hits <= 8, "{hits} hits");
    for (i, (g, o)) in got.iter().zip(&out).enumerate() {
        if *g {
            assert_eq!(o, &pages[i], "page {i}");
        }
    }
    // The last key written to each owner is among the survivors.
    assert!(got[39]);
}

#[test]
fn writers_racing_readers_on_one_bucket_never_yield_a_wrong_page() {
    let nodes = Arc::new(cluster(
        &[165, 166, 167],
        json!({"slot_num_buckets": 1, "slot_ways": 4}),
    ));
    let len = 48 << 10;
    // Six keys into one bucket per owner: constant overwrites and way reuse.
    let keys: Arc<Vec<String>> = Arc::new((0..6).map(|i| format!("race-{i}")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let (accepted, wrong, reads) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut threads = Vec::new();
    for w in 0..2usize {
        let (nodes, keys, stop) = (nodes.clone(), keys.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut v = 1u64;
            while !stop.load(Ordering::Relaxed) {
                for (i, k) in keys.iter().enumerate() {
                    let p = page(i as u64, v, len);
                    let _ = nodes[w].batch_set(&[k], &[p.as_slice()]);
                }
                v += 1;
            }
        }));
    }
    for r in 0..2usize {
        let (nodes, keys, stop) = (nodes.clone(), keys.clone(), stop.clone());
        let (accepted, wrong, reads) = (accepted.clone(), wrong.clone(), reads.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (got, out) = get(&nodes[1 + r], &keys, len);
                reads.fetch_add(got.len() as u64, Ordering::Relaxed);
                for (i, (g, o)) in got.iter().zip(&out).enumerate() {
                    if *g {
                        accepted.fetch_add(1, Ordering::Relaxed);
                        if !is_a_version_of(o, i as u64) {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    let t0 = Instant::now();
    let rejected = || -> u64 { nodes.iter().map(|n| n.stats().verify_rejects).sum() };
    while (rejected() == 0 || accepted.load(Ordering::Relaxed) < 200)
        && t0.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let (acc, bad, rej) = (
        accepted.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
        rejected(),
    );
    eprintln!(
        "slotmap race: {} reads, {acc} accepted, {rej} torn reads rejected, {bad} wrong",
        reads.load(Ordering::Relaxed)
    );
    assert_eq!(bad, 0, "a wrong page was accepted");
    assert!(acc > 0, "readers never got a page");
    assert!(
        rej > 0,
        "no torn read was ever caught: the race did not happen"
    );
}

#[test]
fn keys_whose_owner_left_are_clean_misses() {
    let nodes = cluster(&[168, 169, 170], json!({}));
    let len = 8 << 10;
    let keys: Vec<String> = (0..60).map(|i| format!("moved-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..60).map(|i| page(600 + i, 1, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(nodes[0].batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    // Which keys the leaving node owned, on the ring of all three.
    let members: Vec<peercache_wire::NodeId> =
        nodes[0].members().into_iter().map(|m| m.node).collect();
    let ring = peercache_directory::Ring::new(members, 160);
    let leaving = nodes[2].node_id().clone();
    let owned: Vec<bool> = keys
        .iter()
        .map(|k| ring.primary(peercache_wire::PageKey::from_key(k)) == Some(&leaving))
        .collect();
    assert!(owned.iter().any(|&o| o) && owned.iter().any(|&o| !o));
    nodes[2].shutdown();
    assert!(nodes[0].wait_members(2, Duration::from_secs(10)));
    nodes[0].sync_membership();
    let (got, out) = get(&nodes[0], &keys, len);
    for (i, ((g, o), p)) in got.iter().zip(&out).zip(&pages).enumerate() {
        if owned[i] {
            assert!(!g, "key {i}: its owner left, nothing migrates: a miss");
        } else {
            assert!(*g, "key {i}: its owner is still here");
            assert_eq!(o, p);
        }
    }
}

/// A member announcing a slot layout outside the bounds this node's own configuration allows
/// (here 100 000 ways: a reader would size header reads and scratch by it) is refused and
/// counted once; the keys it would own are misses, and everyone else's keys work.
#[test]
fn a_layout_out_of_bounds_is_refused_and_its_keys_are_misses() {
    use peercache_discovery::{DiscoveryClient, DiscoveryConfig, NodeInfo};
    let port = common::free_port();
    let m = json!({
        "mode": "slotmap", "global_segment_size": "16mb", "slot_max_page_bytes": "64kb",
        "slot_ways": 4,
    });
    let a = common::node(174, 174, port, m.clone());
    let b = common::node(175, 174, port, m);
    let evil_id = peercache_wire::NodeId::new("evil").unwrap();
    let host: std::net::IpAddr = "127.0.0.176".parse().unwrap();
    let evil = DiscoveryClient::start(
        NodeInfo {
            node: evil_id.clone(),
            incarnation: peercache_wire::Incarnation(1),
            host,
            meta: None,
            control: std::net::SocketAddr::new(host, 9),
            data: vec![std::net::SocketAddr::new(host, 9)],
            role: "inference".into(),
            attrs: vec![("slotmap".into(), "1:0:65536:100000:1".into())],
        },
        DiscoveryConfig {
            seeds: vec![std::net::SocketAddr::new(
                "127.0.0.174".parse().unwrap(),
                port,
            )],
            auth: peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap(),
            ..DiscoveryConfig::default()
        },
    )
    .unwrap();
    for s in [&a, &b] {
        assert!(s.wait_members(3, Duration::from_secs(10)));
        s.sync_membership();
        s.sync_membership();
    }
    // Counted once per announcement, however often membership is synced.
    assert_eq!(a.stats().layouts_refused, 1);
    assert_eq!(b.stats().layouts_refused, 1);
    let ring = peercache_directory::Ring::new(a.members().into_iter().map(|m| m.node), 160);
    let len = 8 << 10;
    let keys: Vec<String> = (0..60).map(|i| format!("bounded-{i}")).collect();
    let evils: Vec<bool> = keys
        .iter()
        .map(|k| ring.primary(peercache_wire::PageKey::from_key(k)) == Some(&evil_id))
        .collect();
    assert!(evils.iter().any(|&e| e) && evils.iter().any(|&e| !e));
    let pages: Vec<Vec<u8>> = (0..60).map(|i| page(900 + i, 1, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    let stored = a.batch_set(&keys, &refs).unwrap();
    let (got, out) = get(&b, &keys, len);
    for i in 0..keys.len() {
        if evils[i] {
            assert!(!stored[i] && !got[i], "key {i} of the refused member");
        } else {
            assert!(stored[i] && got[i], "key {i}");
            assert_eq!(out[i], pages[i]);
        }
    }
    evil.shutdown();
}

//! The disk tier inside a node: write-through, evicted pages stay findable as disk-only
//! copies and are promoted back on read, and a restarted node (same id) finds its pages again.

use std::time::Duration;

use peercache_store::Store;
use serde_json::json;

mod common;
use common::page;

fn node(port: u16, disk: &std::path::Path) -> Store {
    node_on(
        "127.0.0.30",
        "127.0.0.30",
        port,
        "disk-node-1",
        Some(disk),
        1,
    )
}

fn node_on(
    host: &str,
    seed: &str,
    port: u16,
    id: &str,
    disk: Option<&std::path::Path>,
    members: usize,
) -> Store {
    let mut m = json!({"node_id": id, "global_segment_size": "4mb"});
    if let Some(d) = disk {
        m["disk_enabled"] = json!(true);
        m["disk_path"] = json!(d.to_str().unwrap());
        m["disk_size"] = json!("256mb");
    }
    let s = common::start(common::config(host, seed, port, m));
    assert!(s.wait_members(members, Duration::from_secs(10)));
    s
}

fn read_all(s: &Store, keys: &[String], len: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    // Four at a time: the 4 MiB pool holds six 512 KiB pages.
    for chunk in keys.chunks(4) {
        let mut bufs = vec![vec![0u8; len]; chunk.len()];
        let mut d: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let got = s.batch_get(chunk, &mut d).unwrap();
        assert!(
            got.iter().all(|&g| g),
            "every page is served, promoted from disk when evicted"
        );
        out.extend(bufs);
    }
    out
}

#[test]
fn evicted_pages_are_promoted_from_disk_and_survive_a_restart() {
    let port = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let len = 512 << 10;
    let keys: Vec<String> = (0..20).map(|i| format!("disk-page-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..20).map(|i| page(i, len)).collect();
    // Every page present and byte-exact, then the node stopped.
    let all_back = |s: &Store, why: &str| {
        assert_eq!(s.batch_exists(&keys).unwrap(), 20, "{why}");
        assert_eq!(read_all(s, &keys, len), pages);
        s.shutdown();
    };
    {
        let s = node(port, dir.path());
        for (k, p) in keys.iter().zip(&pages) {
            assert!(s.batch_set(&[k], &[p]).unwrap()[0]);
        }
        assert!(s.flush_evictions(Duration::from_secs(5)));
        assert!(s.stats().pool_evictions >= 14, "the pool holds six pages");
        all_back(&s, "evicted pages are still present (on disk)");
    }
    // Same node id, same disk folder: the pages come back.
    let s = node(port, dir.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.batch_exists(&keys).unwrap() < 20 && std::time::Instant::now() < deadline {
        s.sync_membership();
    }
    // The recovery scan is over (the re-publish waited for it), and /cluster says so.
    let view = s.cluster_view();
    assert_eq!(view["disk"]["recovering"], false, "{}", view["disk"]);
    assert_eq!(view["disk"]["keys"], 20, "{}", view["disk"]);
    all_back(&s, "recovered pages were re-published");
}

#[test]
fn a_reader_without_disk_gets_pages_another_node_holds_only_on_disk() {
    let port = common::free_port();
    let dir = tempfile::tempdir().unwrap();
    let owner = node_on(
        "127.0.0.31",
        "127.0.0.31",
        port,
        "disk-owner",
        Some(dir.path()),
        1,
    );
    let reader = node_on("127.0.0.32", "127.0.0.31", port, "no-disk-reader", None, 2);
    // Both views: the reader locates through its own ring.
    common::settle(&[&owner, &reader]);
    let len = 512 << 10;
    let keys: Vec<String> = (0..20).map(|i| format!("far-disk-page-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..20).map(|i| page(1000 + i, len)).collect();
    for (k, p) in keys.iter().zip(&pages) {
        assert!(owner.batch_set(&[k], &[p]).unwrap()[0]);
    }
    assert!(owner.flush_evictions(Duration::from_secs(5)));
    assert!(owner.stats().pool_evictions >= 14);
    let disk_only = |s: &Store, ks: &[String]| {
        s.locate(ks)
            .unwrap()
            .iter()
            .filter(|o| o.as_ref().is_some_and(|o| o.iter().all(|l| !l.resident)))
            .count()
    };
    assert!(
        disk_only(&reader, &keys) >= 14,
        "evicted pages are disk-only entries"
    );

    // exists counts them and starts promoting the first ones in the background.
    // (Two pages: background promotion is limited to half the owner's 4 MiB pool.)
    assert_eq!(reader.batch_exists(&keys[..2]).unwrap(), 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while disk_only(&reader, &keys[..2]) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "exists did not promote the pages it found on disk"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // Every page reads back byte-exact on the node without a disk tier (promote RPC to the
    // owner, then a one-sided read of the fresh copy).
    assert_eq!(read_all(&reader, &keys, len), pages);
    reader.shutdown();
    owner.shutdown();
}

/// A recognisable small page: its index, then bytes derived from it.
fn small_page(i: u64, len: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

#[test]
fn a_restarted_node_republishes_a_hundred_thousand_small_disk_pages() {
    use peercache_pool::disk::{DiskConfig, DiskTier};
    use peercache_wire::PageKey;

    const PAGES: u64 = 100_000;
    const LEN: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let key = |i: u64| format!("small-disk-page-{i}");
    // What the node's previous life left: write-through records in its tier folder.
    {
        let mut cfg = DiskConfig::new(dir.path().join("disk-restart-a"), 1 << 30);
        cfg.queue_depth = 4096;
        let tier = DiskTier::open(cfg).unwrap();
        for i in 0..PAGES {
            if i % 2048 == 0 {
                tier.flush();
            }
            let p = small_page(i, LEN);
            assert!(tier.put(
                PageKey::from_key(&key(i)),
                &[&p],
                LEN as u32,
                1,
                peercache_wire::Layout::NONE
            ));
        }
        tier.flush();
        assert_eq!(tier.stats().keys, PAGES);
    }
    let port = common::free_port();
    let seed = node_on("127.0.0.33", "127.0.0.33", port, "disk-seed", None, 1);
    let restarted = common::start(common::config(
        "127.0.0.34",
        "127.0.0.33",
        port,
        json!({"node_id": "disk-restart-a", "global_segment_size": "4mb",
               "disk_enabled": true, "disk_path": dir.path().to_str().unwrap(),
               "disk_size": "1gb"}),
    ));
    assert!(restarted.wait_members(2, Duration::from_secs(10)));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while restarted.stats().disk_republished < PAGES {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {PAGES} recovered pages re-published within 60 s",
            restarted.stats().disk_republished
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(restarted.stats().disk_republished, PAGES, "each page once");
    // The other node finds every page, as a disk-only copy of the restarted node, once it counts
    // that node live: until its membership has it (a heartbeat at most), its shard keeps the
    // copies but names no owner it does not count live.
    assert!(seed.wait_members(2, Duration::from_secs(10)));
    seed.sync_membership();
    let keys: Vec<String> = (0..PAGES).map(key).collect();
    for chunk in keys.chunks(16 * 1024) {
        for (k, owners) in chunk.iter().zip(seed.locate(chunk).unwrap()) {
            let owners = owners.unwrap_or_else(|| panic!("{k} is not found after the restart"));
            assert!(
                owners
                    .iter()
                    .any(|l| l.node.as_str() == "disk-restart-a" && !l.resident && l.len == 4096),
                "{k}: {owners:?}"
            );
        }
    }
    // A sample reads back byte-exact (promoted from the restarted node's disk).
    let sample: Vec<u64> = (0..PAGES).step_by(997).take(40).collect();
    for chunk in sample.chunks(8) {
        let ks: Vec<String> = chunk.iter().map(|&i| key(i)).collect();
        let (got, bufs) = common::get(&seed, &ks, LEN);
        assert!(got.iter().all(|&g| g), "sampled pages are served: {got:?}");
        for (&i, b) in chunk.iter().zip(&bufs) {
            assert_eq!(*b, small_page(i, LEN), "page {i} is the page written");
        }
    }
    restarted.shutdown();
    seed.shutdown();
}

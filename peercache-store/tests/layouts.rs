//! Two deployments sharing one cluster under the same keys — bf16 beside fp8, MHA TP 2 beside
//! TP 4 — never read each other's pages: every read path refuses a page of another layout as
//! a counted miss (`layout_mismatches`), a deployment keeps hitting its own, a restarted node
//! with the same layout hits its disk-tier pages again, and pages written with no layout
//! (every earlier release) are misses for a reader that declared one.

use std::time::Duration;

use peercache_store::Store;
use peercache_store::layout::page::{LayoutSpec, PoolShape};
use serde_json::json;

mod common;
use common::{free_port, get, page};

fn spec(dtype: &str, tp: Option<[u32; 2]>, bytes_per_page: u64) -> LayoutSpec {
    LayoutSpec {
        model: "tiny-llama".into(),
        kv_dtype: dtype.into(),
        pp_rank: 0,
        tp,
        pools: vec![PoolShape {
            name: "kv".into(),
            tokens_per_page: 64,
            host_layout: "layer_first".into(),
            bytes_per_page,
        }],
    }
}

fn settle(nodes: &[&Store]) {
    for s in nodes {
        assert!(s.wait_members(nodes.len(), Duration::from_secs(10)));
        s.sync_membership();
    }
}

fn write(s: &Store, keys: &[String], pages: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(s.batch_set(keys, &refs).unwrap().iter().all(|&x| x));
}

/// Reads `keys` on `s`: the pages it got, `None` for a miss (whose buffer must be zeros: a
/// refused page leaves no bytes behind).
fn read(s: &Store, keys: &[String], len: usize) -> Vec<Option<Vec<u8>>> {
    let (hits, pages) = get(s, keys, len);
    hits.into_iter()
        .zip(pages)
        .map(|(h, p)| {
            if !h {
                assert!(p.iter().all(|&b| b == 0), "a miss left bytes behind");
            }
            h.then_some(p)
        })
        .collect()
}

#[test]
fn bf16_and_fp8_deployments_share_a_cluster_and_never_read_each_others_pages() {
    let port = free_port();
    // Two nodes per deployment; the shared memory path is off for one pair so both the TCP and
    // the same-host copy carry pages across deployments.
    let a1 = common::node(230, 230, port, json!({"node_id": "bf16-a"}));
    let a2 = common::node(231, 230, port, json!({"node_id": "bf16-b"}));
    let b1 = common::node(
        232,
        230,
        port,
        json!({"node_id": "fp8-a", "host_local": false}),
    );
    let b2 = common::node(233, 230, port, json!({"node_id": "fp8-b"}));
    settle(&[&a1, &a2, &b1, &b2]);
    let len = 16 << 10;
    let (bf16, fp8) = (
        spec("bfloat16", None, len as u64),
        spec("float8_e4m3fn", None, len as u64),
    );
    for s in [&a1, &a2] {
        s.set_layout(&bf16);
    }
    for s in [&b1, &b2] {
        s.set_layout(&fp8);
    }
    assert_ne!(a1.layout(), b1.layout());

    let keys: Vec<String> = (0..32).map(|i| format!("prompt-page-{i}")).collect();
    let bf16_pages: Vec<Vec<u8>> = (0..32).map(|i| page(100 + i, len)).collect();
    let fp8_pages: Vec<Vec<u8>> = (0..32).map(|i| page(900 + i, len)).collect();

    // bf16 writes; its other rank hits every page; neither fp8 node gets one byte of them.
    write(&a1, &keys, &bf16_pages);
    let want_bf16: Vec<Option<Vec<u8>>> = bf16_pages.iter().cloned().map(Some).collect();
    assert_eq!(a2.batch_exists(&keys).unwrap(), keys.len());
    assert_eq!(read(&a2, &keys, len), want_bf16);
    for s in [&b1, &b2] {
        // The directory knows each copy's layout: exists does not count bf16 pages for an
        // fp8 reader (no prefetch that the get would then refuse).
        assert_eq!(s.batch_exists(&keys).unwrap(), 0);
        assert_eq!(s.batch_exists_valid(&keys).unwrap(), Vec::<u32>::new());
        let before = s.stats().layout_mismatches;
        assert!(read(s, &keys, len).iter().all(|p| p.is_none()));
        assert_eq!(
            s.stats().layout_mismatches - before,
            keys.len() as u64,
            "each refused page is counted once"
        );
    }

    // fp8 writes the same keys; each deployment now hits its own pages, whichever copy the
    // directory lists first.
    write(&b1, &keys, &fp8_pages);
    let want_fp8: Vec<Option<Vec<u8>>> = fp8_pages.iter().cloned().map(Some).collect();
    for s in [&a1, &a2, &b1, &b2] {
        assert_eq!(s.batch_exists(&keys).unwrap(), keys.len());
    }
    for _ in 0..2 {
        assert_eq!(read(&b2, &keys, len), want_fp8);
        assert_eq!(read(&a2, &keys, len), want_bf16);
        assert_eq!(read(&b1, &keys, len), want_fp8, "b1 reads its own pool");
        assert_eq!(read(&a1, &keys, len), want_bf16, "a1 reads its own pool");
    }
    for s in [&a1, &a2, &b1, &b2] {
        s.shutdown();
    }
}

#[test]
fn mha_tp2_and_tp4_shards_are_different_layouts_mla_ranks_share_one() {
    let port = free_port();
    let tp2 = common::node(234, 234, port, json!({"node_id": "tp2-r0"}));
    let tp4 = common::node(235, 234, port, json!({"node_id": "tp4-r0"}));
    let tp4b = common::node(236, 234, port, json!({"node_id": "tp4-r1"}));
    settle(&[&tp2, &tp4, &tp4b]);
    let len = 8 << 10;
    // MHA: rank 0 of TP 2 holds heads 0..H/2; rank 0 of TP 4 holds heads 0..H/4 — the same
    // keys (SGLang names MHA pages by rank), other bytes.
    tp2.set_layout(&spec("bfloat16", Some([0, 2]), 2 * len as u64));
    tp4.set_layout(&spec("bfloat16", Some([0, 4]), len as u64));
    tp4b.set_layout(&spec("bfloat16", Some([0, 4]), len as u64));
    let keys: Vec<String> = (0..16).map(|i| format!("mha-tp0-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..16).map(|i| page(300 + i, len)).collect();
    write(&tp4, &keys, &pages);
    assert!(read(&tp2, &keys, len).iter().all(|p| p.is_none()));
    assert_eq!(tp2.stats().layout_mismatches, 16);
    assert_eq!(
        read(&tp4b, &keys, len),
        pages.iter().cloned().map(Some).collect::<Vec<_>>(),
        "the same shard of the same deployment hits"
    );

    // MLA: the latent is the same on every TP rank, so the spec has no TP shard and ranks of
    // different TP sizes share pages.
    let mla = spec("bfloat16", None, len as u64);
    for s in [&tp2, &tp4] {
        s.set_layout(&mla);
    }
    let keys: Vec<String> = (0..16).map(|i| format!("mla-{i}")).collect();
    write(&tp4, &keys, &pages);
    assert_eq!(
        read(&tp2, &keys, len),
        pages.iter().cloned().map(Some).collect::<Vec<_>>()
    );
    for s in [&tp2, &tp4, &tp4b] {
        s.shutdown();
    }
}

fn disk_node(port: u16, dir: &std::path::Path) -> Store {
    let s = common::node(
        237,
        237,
        port,
        json!({"node_id": "layout-disk", "disk_enabled": true,
               "disk_path": dir.to_str().unwrap(), "disk_size": "64mb"}),
    );
    assert!(s.wait_members(1, Duration::from_secs(10)));
    s
}

/// Reads until every key is a hit or the deadline passes (a restarted node re-publishes its
/// disk pages in the background).
fn read_until_all_hit(s: &Store, keys: &[String], len: usize) -> Vec<Option<Vec<u8>>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = read(s, keys, len);
        if got.iter().all(|p| p.is_some()) || std::time::Instant::now() > deadline {
            return got;
        }
        s.sync_membership();
    }
}

#[test]
fn a_restart_with_the_same_layout_hits_its_disk_pages_and_another_layout_does_not() {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let len = 16 << 10;
    let bf16 = spec("bfloat16", None, len as u64);
    let keys: Vec<String> = (0..24).map(|i| format!("disk-layout-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..24).map(|i| page(500 + i, len)).collect();
    let want: Vec<Option<Vec<u8>>> = pages.iter().cloned().map(Some).collect();
    {
        let s = disk_node(port, dir.path());
        s.set_layout(&bf16);
        write(&s, &keys, &pages);
        s.flush_disk();
        s.shutdown();
    }
    // The same deployment restarted: its disk-tier pages are its own.
    {
        let s = disk_node(port, dir.path());
        s.set_layout(&bf16);
        assert_eq!(read_until_all_hit(&s, &keys, len), want);
        assert_eq!(s.stats().layout_mismatches, 0);
        s.shutdown();
    }
    // Restarted as fp8: the bf16 pages on disk are refused, and fp8 pages written under the
    // same keys replace them.
    let s = disk_node(port, dir.path());
    s.set_layout(&spec("float8_e4m3fn", None, len as u64));
    // Wait until the disk pages are re-published (the directory names this node for each),
    // so the reads below find them.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let listed = |s: &Store| s.locate(&keys).unwrap().iter().flatten().count();
    while listed(&s) < keys.len() && std::time::Instant::now() < deadline {
        s.sync_membership();
    }
    // Re-published with the layout each record carries on disk.
    let found = s.locate(&keys).unwrap();
    assert!(
        found.iter().all(|o| o
            .as_ref()
            .is_some_and(|o| o[0].layout == bf16.fingerprint())),
        "{found:?}"
    );
    // Present in the cluster, but not in this node's layout: not counted by exists.
    assert_eq!(s.batch_exists(&keys).unwrap(), 0);
    assert!(read(&s, &keys, len).iter().all(|p| p.is_none()));
    assert!(s.stats().layout_mismatches >= keys.len() as u64);
    let fp8_pages: Vec<Vec<u8>> = (0..24).map(|i| page(700 + i, len)).collect();
    write(&s, &keys, &fp8_pages);
    assert_eq!(
        read(&s, &keys, len),
        fp8_pages.iter().cloned().map(Some).collect::<Vec<_>>()
    );
    s.shutdown();
}

#[test]
fn pages_without_a_layout_are_misses_for_a_reader_that_declared_one() {
    let nodes = common::cluster(&[238, 239], json!({}));
    let (old, new) = (&nodes[0], &nodes[1]);
    let len = 4 << 10;
    let keys: Vec<String> = (0..8).map(|i| format!("before-layouts-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8).map(|i| page(i, len)).collect();
    // `old` never declares a layout: what every release before layouts wrote.
    write(old, &keys, &pages);
    assert!(old.layout().is_none());
    new.set_layout(&spec("bfloat16", None, len as u64));
    assert!(read(new, &keys, len).iter().all(|p| p.is_none()));
    assert_eq!(new.stats().layout_mismatches, 8);
    for s in &nodes {
        s.shutdown();
    }
}

#[test]
fn slotmap_and_storage_server_paths_refuse_another_layout_too() {
    // Slotmap: pages live in the key's owner's slot region, read one-sided.
    let slot = json!({"mode": "slotmap", "global_segment_size": "16mb",
                      "slot_max_page_bytes": "64kb", "slot_ways": 4});
    let nodes = common::cluster(&[240, 241, 242], slot);
    let len = 8 << 10;
    let keys: Vec<String> = (0..24).map(|i| format!("slot-layout-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..24).map(|i| page(40 + i, len)).collect();
    let want: Vec<Option<Vec<u8>>> = pages.iter().cloned().map(Some).collect();
    nodes[0].set_layout(&spec("bfloat16", None, len as u64));
    nodes[1].set_layout(&spec("bfloat16", None, len as u64));
    nodes[2].set_layout(&spec("float8_e4m3fn", None, len as u64));
    write(&nodes[0], &keys, &pages);
    assert_eq!(read(&nodes[1], &keys, len), want);
    assert!(read(&nodes[2], &keys, len).iter().all(|p| p.is_none()));
    assert_eq!(
        nodes[2].stats().layout_mismatches,
        24,
        "local and remote slots alike"
    );
    for s in &nodes {
        s.shutdown();
    }

    // Centralized: the writer's layout travels to the storage server with the write.
    let port = free_port();
    let storage = json!({"mode": "centralized", "role": "storage", "node_id": "st-layout"});
    let central = json!({"mode": "centralized"});
    let st = common::node(243, 243, port, storage);
    let w = common::node(
        244,
        243,
        port,
        json!({"mode": "centralized", "node_id": "w-bf16"}),
    );
    let other = common::node(245, 243, port, central);
    settle(&[&st, &w, &other]);
    w.set_layout(&spec("bfloat16", None, len as u64));
    other.set_layout(&spec("float8_e4m3fn", None, len as u64));
    let keys: Vec<String> = (0..16).map(|i| format!("central-layout-{i}")).collect();
    write(&w, &keys, &pages[..16]);
    assert_eq!(read(&w, &keys, len), want[..16].to_vec());
    assert!(read(&other, &keys, len).iter().all(|p| p.is_none()));
    assert_eq!(other.stats().layout_mismatches, 16);
    for s in [&st, &w, &other] {
        s.shutdown();
    }
}

//! Three (and four) nodes on loopback, each on its own 127.0.0.N, sharing one meta port.

use std::time::Duration;

use serde_json::json;

mod common;
use common::{Race, free_port, get as read_all, node, page, race};

/// A cluster of 64 MiB nodes (`extra` overrides).
fn cluster(hosts: &[u8], extra: serde_json::Value) -> Vec<peercache_store::Store> {
    let mut m = json!({"global_segment_size": "64mb"});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    common::cluster(hosts, m)
}

#[test]
fn set_on_one_node_reads_byte_exact_on_the_others() {
    let nodes = cluster(&[2, 3, 4], json!({}));
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);

    // MLA: one component per page.
    let mla_keys: Vec<String> = (0..40).map(|i| format!("mla-{i}")).collect();
    let mla: Vec<Vec<u8>> = (0..40).map(|i| page(i, 64 << 10)).collect();
    let refs: Vec<&[u8]> = mla.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&mla_keys, &refs).unwrap().iter().all(|&x| x));

    // MHA: K and V components from separate buffers.
    let mha_keys: Vec<String> = (0..20).map(|i| format!("mha-{i}")).collect();
    let ks: Vec<Vec<u8>> = (0..20).map(|i| page(100 + i, 32 << 10)).collect();
    let vs: Vec<Vec<u8>> = (0..20).map(|i| page(200 + i, 32 << 10)).collect();
    let segs: Vec<&[u8]> = ks
        .iter()
        .zip(&vs)
        .flat_map(|(k, v)| [k.as_slice(), v.as_slice()])
        .collect();
    assert!(
        a.batch_set_segments(&mha_keys, &segs, &[2; 20])
            .unwrap()
            .iter()
            .all(|&x| x)
    );

    // Layer-first: 16 layers × (K, V) = 32 segments of 2 KiB per page.
    let lf_keys: Vec<String> = (0..8).map(|i| format!("layer-first-{i}")).collect();
    let layers: Vec<Vec<Vec<u8>>> = (0..8)
        .map(|p| (0..32).map(|l| page(1000 + p * 64 + l, 2048)).collect())
        .collect();
    let lsegs: Vec<&[u8]> = layers
        .iter()
        .flat_map(|p| p.iter().map(|l| l.as_slice()))
        .collect();
    assert!(
        a.batch_set_segments(&lf_keys, &lsegs, &[32; 8])
            .unwrap()
            .iter()
            .all(|&x| x)
    );

    for reader in [b, c] {
        assert_eq!(reader.batch_exists(&mla_keys).unwrap(), 40);
        common::assert_reads_back(reader, &mla_keys, &mla);

        assert_eq!(reader.batch_exists(&mha_keys).unwrap(), 20);
        let mut kk: Vec<Vec<u8>> = vec![vec![0u8; 32 << 10]; 20];
        let mut vv: Vec<Vec<u8>> = vec![vec![0u8; 32 << 10]; 20];
        let mut d: Vec<&mut [u8]> = kk
            .iter_mut()
            .zip(vv.iter_mut())
            .flat_map(|(k, v)| [k.as_mut_slice(), v.as_mut_slice()])
            .collect();
        assert!(
            reader
                .batch_get_segments(&mha_keys, &mut d, &[2; 20])
                .unwrap()
                .iter()
                .all(|&x| x)
        );
        assert_eq!(kk, ks);
        assert_eq!(vv, vs);

        // No exists first: the get looks the directory up itself.
        let mut out: Vec<Vec<Vec<u8>>> = vec![vec![vec![0u8; 2048]; 32]; 8];
        let mut d: Vec<&mut [u8]> = out
            .iter_mut()
            .flat_map(|p| p.iter_mut().map(|l| l.as_mut_slice()))
            .collect();
        assert!(
            reader
                .batch_get_segments(&lf_keys, &mut d, &[32; 8])
                .unwrap()
                .iter()
                .all(|&x| x)
        );
        assert_eq!(out, layers);
    }
    assert!(
        b.stats().transport_read_bytes > 0,
        "remote pages moved through the transport"
    );
    // The writer reads its own pages locally.
    let mut own = vec![vec![0u8; 64 << 10]; 1];
    let mut d: Vec<&mut [u8]> = own.iter_mut().map(|b| b.as_mut_slice()).collect();
    assert!(a.batch_get(&mla_keys[..1], &mut d).unwrap()[0]);
    assert_eq!(own[0], mla[0]);
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn exists_counts_leading_pages_and_misses_are_false() {
    let nodes = cluster(&[5, 6], json!({}));
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..10).map(|i| page(i, 4096)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    // Store pages 0..6 and 7..10: a hole at 6.
    let mut stored = keys.clone();
    stored.remove(6);
    let mut srefs = refs.clone();
    srefs.remove(6);
    nodes[0].batch_set(&stored, &srefs).unwrap();
    assert_eq!(nodes[1].batch_exists(&keys).unwrap(), 6);
    // Per-key presence sees past the hole (the v2 side-pool checks need it).
    let each = nodes[1].batch_contains(&keys).unwrap();
    assert_eq!(each, (0..10).map(|i| i != 6).collect::<Vec<_>>());
    let mut bufs = vec![vec![0u8; 4096]; 10];
    let mut d: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let got = nodes[1].batch_get(&keys, &mut d).unwrap();
    assert_eq!(got, (0..10).map(|i| i != 6).collect::<Vec<_>>());
    // A destination of the wrong size is a miss, not a partial copy.
    let mut small = [vec![0u8; 100]];
    let mut d: Vec<&mut [u8]> = small.iter_mut().map(|b| b.as_mut_slice()).collect();
    assert_eq!(nodes[1].batch_get(&keys[..1], &mut d).unwrap(), vec![false]);
    // Bad argument shapes are typed errors.
    let mut d: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    assert!(nodes[1].batch_get_segments(&keys, &mut d, &[1, 2]).is_err());
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn prefixes_isolate_tenants() {
    let port = free_port();
    let a = node(7, 7, port, json!({"prefix": "tenant-a"}));
    let b = node(8, 7, port, json!({"prefix": "tenant-b"}));
    assert!(
        a.wait_members(2, Duration::from_secs(10)) && b.wait_members(2, Duration::from_secs(10))
    );
    let p = page(1, 4096);
    a.batch_set(&["shared-key"], &[&p]).unwrap();
    assert_eq!(a.batch_exists(&["shared-key"]).unwrap(), 1);
    assert_eq!(
        b.batch_exists(&["shared-key"]).unwrap(),
        0,
        "tenant b must not see tenant a's page"
    );
    let q = page(2, 4096);
    b.batch_set(&["shared-key"], &[&q]).unwrap();
    let mut buf = vec![0u8; 4096];
    assert!(a.batch_get(&["shared-key"], &mut [&mut buf[..]]).unwrap()[0]);
    assert_eq!(buf, p);
    assert!(b.batch_get(&["shared-key"], &mut [&mut buf[..]]).unwrap()[0]);
    assert_eq!(buf, q);
    a.shutdown();
    b.shutdown();
}

#[test]
fn a_node_that_joins_after_the_publish_finds_every_key() {
    let port = free_port();
    let a = node(10, 10, port, json!({}));
    let b = node(11, 10, port, json!({}));
    assert!(
        a.wait_members(2, Duration::from_secs(10)) && b.wait_members(2, Duration::from_secs(10))
    );
    let keys: Vec<String> = (0..300).map(|i| format!("early-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..300).map(|i| page(i, 4096)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    let c = node(12, 10, port, json!({}));
    for n in [&a, &b, &c] {
        assert!(n.wait_members(3, Duration::from_secs(10)));
    }
    assert_eq!(c.batch_exists(&keys).unwrap(), 300);
    common::assert_reads_back(&c, &keys, &pages);
    for n in [a, b, c] {
        n.shutdown();
    }
}

#[test]
fn a_reader_racing_an_evicting_writer_never_accepts_wrong_bytes() {
    // 4 MiB pools of 16 KiB pages: the writer evicts constantly while the reader reads.
    let nodes = cluster(
        &[13, 14],
        json!({"global_segment_size": "4mb", "exists_prime_ttl": 5.0}),
    );
    let (w, r) = (&nodes[0], &nodes[1]);
    let (accepted, missed) = race(
        w,
        r,
        Race {
            keys: 2000,
            writes: 6000,
            rounds: 300,
        },
    );
    eprintln!("racing reader: {accepted} pages accepted byte-exact, {missed} misses");
    assert!(accepted > 0);
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn a_cached_location_of_a_reused_slot_is_a_miss_not_another_keys_bytes() {
    // The original returned Y's bytes for X here (reference §11, weak spot 1).
    let port = free_port();
    // 4 MiB pool, 1 MiB pages: two slots, so the third page reuses the first page's slot.
    let w = node(16, 16, port, json!({"global_segment_size": "4mb"}));
    let r = node(17, 16, port, json!({"directory_read_cache_ttl": 30.0}));
    assert!(
        w.wait_members(2, Duration::from_secs(10)) && r.wait_members(2, Duration::from_secs(10))
    );
    let (px, py, pz) = (page(1, 1 << 20), page(2, 1 << 20), page(3, 1 << 20));
    assert!(w.batch_set(&["X"], &[&px]).unwrap()[0]);
    let mut buf = vec![0u8; 1 << 20];
    assert!(r.batch_get(&["X"], &mut [&mut buf[..]]).unwrap()[0]);
    assert_eq!(buf, px);
    // X's location is now cached on r. Fill w so that Z lands in X's old slot.
    assert!(w.batch_set(&["Y"], &[&py]).unwrap()[0]);
    assert!(w.batch_set(&["Z"], &[&pz]).unwrap()[0]);
    assert!(w.flush_evictions(Duration::from_secs(5)));
    buf.fill(0);
    let got = r.batch_get(&["X"], &mut [&mut buf[..]]).unwrap()[0];
    assert!(!got, "a stale cached location must be a miss");
    assert_ne!(buf, pz, "never another key's bytes");
    assert_eq!(
        r.stats().verify_rejects,
        1,
        "the reuse was caught by verification"
    );
    // The entry was dropped from the cache: the next read asks the directory (X is gone).
    assert!(!r.batch_get(&["X"], &mut [&mut buf[..]]).unwrap()[0]);
    assert_eq!(r.stats().verify_rejects, 1);
    w.shutdown();
    r.shutdown();
}

#[test]
fn replicate_on_read_keeps_a_copy_that_serves_after_the_writer_leaves() {
    let nodes = cluster(&[5, 6, 7], json!({"replicate_on_read": true}));
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let keys: Vec<String> = (0..16).map(|i| format!("hot-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..16).map(|i| page(500 + i, 32 << 10)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    common::assert_reads_back(b, &keys, &pages);
    // B registers its reclaimable copies (asynchronously): wait until the directory lists it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let owners = a.locate(&keys).unwrap();
        let replicated = owners
            .iter()
            .filter(|o| {
                o.as_ref().is_some_and(|o| {
                    o.iter().any(|l| {
                        l.node == *b.node_id()
                            && l.class == peercache_directory::CopyClass::Reclaimable
                    })
                })
            })
            .count();
        if replicated == 16 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{replicated}/16 replicas registered"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The writer leaves; C still reads every page, from B's replicas.
    a.shutdown();
    assert!(c.wait_members(2, Duration::from_secs(10)));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut out = vec![vec![0u8; 32 << 10]; 16];
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
        let got = c.batch_get(&keys, &mut outs).unwrap();
        if got.iter().all(|&x| x) {
            assert_eq!(out, pages);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            got.iter().filter(|&&x| x).count()
        );
        c.sync_membership();
    }
}

#[test]
fn partial_tail_pages_report_their_valid_length() {
    let nodes = cluster(&[8, 9], json!({}));
    let (a, b) = (&nodes[0], &nodes[1]);
    let keys: Vec<String> = (0..3).map(|i| format!("seq-9-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..3).map(|i| page(900 + i, 16 << 10)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    let valid = [16 << 10, 16 << 10, 5000];
    assert!(
        a.batch_set_partial(&keys, &refs, &valid)
            .unwrap()
            .iter()
            .all(|&x| x)
    );
    assert_eq!(b.batch_exists_valid(&keys).unwrap(), valid.to_vec());
    let mut out = vec![vec![0u8; 16 << 10]; 3];
    let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
    let got = b.batch_get_valid(&keys, &mut outs).unwrap();
    assert_eq!(got, valid.iter().map(|&v| Some(v)).collect::<Vec<_>>());
    assert_eq!(out, pages);
    // Local reads report it too.
    let mut out = vec![0u8; 16 << 10];
    assert_eq!(
        a.batch_get_valid(&keys[2..], &mut [&mut out[..]]).unwrap(),
        vec![Some(5000)]
    );
    // A valid length beyond the page is refused.
    let e = a.batch_set_partial(&keys[..1], &refs[..1], &[(16 << 10) + 1]);
    assert!(
        matches!(e, Err(peercache_store::StoreError::BadRequest(_))),
        "{e:?}"
    );

    // A page gathered from segments (SGLang's layouts): the valid length counts bytes over
    // all of them, and a read scattered into segments reports it.
    let key = ["seq-9-segments"];
    let halves: Vec<&[u8]> = pages[0].chunks(8 << 10).collect();
    assert_eq!(
        a.batch_set_partial_segments(&key, &halves, &[2], &[12 << 10])
            .unwrap(),
        [true]
    );
    let mut out = vec![0u8; 16 << 10];
    let (lo, hi) = out.split_at_mut(8 << 10);
    let raw = [
        peercache_store::RawSeg {
            ptr: lo.as_mut_ptr(),
            len: lo.len(),
        },
        peercache_store::RawSeg {
            ptr: hi.as_mut_ptr(),
            len: hi.len(),
        },
    ];
    // SAFETY: both segments are exclusively borrowed, disjoint halves of `out`.
    let got = unsafe { b.batch_get_valid_raw(&key, &raw, &[2]) }.unwrap();
    assert_eq!(got, [Some(12 << 10)]);
    assert_eq!(out, pages[0]);
    for (segs, counts, valid) in [
        (&halves[..], &[2][..], (16 << 10) + 1),
        (&halves[..1], &[2][..], 1),
    ] {
        let e = a.batch_set_partial_segments(&key, segs, counts, &[valid]);
        assert!(
            matches!(e, Err(peercache_store::StoreError::BadRequest(_))),
            "{e:?}"
        );
    }
}

#[test]
fn the_fourth_copy_of_a_page_is_reclaimable_and_goes_first_under_pressure() {
    // Four nodes publish the same pages: a copy that brings the live owners to three or more
    // is reclaimable (the directory's hint, PegaFlow's rule), and pool pressure on such a node
    // evicts it before the node's own retained pages.
    let nodes = cluster(&[10, 11, 12, 13], json!({"global_segment_size": "8mb"}));
    let keys: Vec<String> = (0..4).map(|i| format!("shared-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..4).map(|i| page(700 + i, 256 << 10)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    for n in &nodes {
        assert!(n.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    }
    let last = nodes[3].node_id().clone();
    let classes = |k: &str| -> Vec<(String, peercache_directory::CopyClass)> {
        nodes[0].locate(&[k]).unwrap()[0]
            .as_ref()
            .unwrap()
            .iter()
            .map(|l| (l.node.to_string(), l.class))
            .collect()
    };
    for k in &keys {
        let c = classes(k);
        assert_eq!(c.len(), 4, "{c:?}");
        let reclaimable = c
            .iter()
            .filter(|(_, class)| *class == peercache_directory::CopyClass::Reclaimable)
            .count();
        assert_eq!(
            reclaimable, 2,
            "the third and fourth copies are demoted: {c:?}"
        );
        let mine = c.iter().find(|(n, _)| n == last.as_str()).unwrap();
        assert_eq!(mine.1, peercache_directory::CopyClass::Reclaimable, "{c:?}");
    }
    // The fourth node now fills its 8 MiB pool with its own pages, one at a time: the
    // reclaimable shared copies go before any of its own retained pages.
    let mut own: Vec<String> = Vec::new();
    let mut gone = false;
    for i in 0..64u64 {
        let k = format!("own-{i}");
        let p = page(800 + i, 256 << 10);
        assert!(nodes[3].batch_set(&[&k], &[p.as_slice()]).unwrap()[0]);
        own.push(k);
        assert!(nodes[3].flush_evictions(Duration::from_secs(5)));
        let (own_named, own_stale) = nodes[3].audit(&own).unwrap();
        let (shared_named, _) = nodes[3].audit(&keys).unwrap();
        if shared_named < keys.len() {
            // Eviction has started: every own page is still here.
            assert_eq!(
                (own_named, own_stale),
                (own.len(), 0),
                "own pages evicted first"
            );
        }
        if shared_named == 0 {
            gone = true;
            break;
        }
    }
    assert!(gone, "the pool never needed room");
    // The shared pages are still served by the other owners.
    common::assert_reads_back(&nodes[3], &keys, &pages);
}

#[test]
fn unregistered_destinations_land_directly_unless_lazy_registration_is_off() {
    for (lazy, hosts) in [(true, [60u8, 61]), (false, [62, 63])] {
        let nodes = cluster(&hosts, json!({"lazy_registration": lazy}));
        let (a, b) = (&nodes[0], &nodes[1]);
        let keys: Vec<String> = (0..8).map(|i| format!("lazy-{i}")).collect();
        let pages: Vec<Vec<u8>> = (0..8).map(|i| page(900 + i, 24 << 10)).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
        // Plain Vecs: never registered with the node.
        let (got, out) = read_all(b, &keys, 24 << 10);
        assert!(got.iter().all(|&x| x), "{got:?}");
        assert_eq!(out, pages);
        let staged = b.stats().staged_reads;
        if lazy {
            assert_eq!(staged, 0, "read straight into the caller's memory");
        } else {
            assert_eq!(staged, 8, "read through staging and copied");
        }
        for n in &nodes {
            n.shutdown();
        }
    }
}

#[test]
fn same_host_peers_read_through_shared_memory_unless_host_local_is_off() {
    let port = free_port();
    let a = node(41, 41, port, json!({"global_segment_size": "64mb"}));
    let b = node(42, 41, port, json!({"global_segment_size": "64mb"}));
    let c = node(
        43,
        41,
        port,
        json!({"global_segment_size": "64mb", "host_local": false}),
    );
    common::settle(&[&a, &b, &c]);
    let len = 96 << 10;
    let keys: Vec<String> = (0..48).map(|i| format!("shm-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..48).map(|i| page(7000 + i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    let served = |s: &peercache_store::Store| {
        s.cluster_view()["transport"]["served_bytes"]
            .as_u64()
            .unwrap()
    };

    // b shares the host with a: its first read goes over TCP and attaches in the background;
    // from then on every page is one copy out of a's pool, verified.
    let (hits, got) = read_all(&b, &keys, len);
    assert!(hits.iter().all(|&h| h));
    assert_eq!(got, pages);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while b.cluster_view()["transport"]["local_peers"] != 1 {
        assert!(std::time::Instant::now() < until, "b never attached to a");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (served0, read0) = (served(&a), b.stats().transport_read_bytes);
    let (hits, got) = read_all(&b, &keys, len);
    assert!(hits.iter().all(|&h| h));
    assert_eq!(got, pages);
    let sb = b.stats();
    assert!(sb.transport_local_read_bytes >= 48 * len as u64, "{sb:?}");
    assert_eq!(
        sb.transport_local_read_bytes,
        sb.transport_read_bytes - read0
    );
    assert_eq!(served(&a), served0, "a's data server moved nothing more");
    assert_eq!(a.cluster_view()["transport"]["local_leases"], 1);

    // c turned the path off: the same pages come over TCP from a's data server.
    let (hits, got) = read_all(&c, &keys, len);
    assert!(hits.iter().all(|&h| h));
    assert_eq!(got, pages);
    assert_eq!(c.stats().transport_local_read_bytes, 0);
    assert!(served(&a) >= served0 + 48 * len as u64);

    // a leaves: b's lease closes and b never serves a page from the old mapping.
    assert_eq!(b.cluster_view()["peers"].as_array().unwrap().len(), 1);
    drop(a);
    let (hits, _) = read_all(&b, &keys, len);
    assert!(hits.iter().all(|&h| !h), "{hits:?}");
    assert_eq!(
        b.stats().transport_local_read_bytes,
        sb.transport_local_read_bytes
    );
    // Once b's membership drops a, its transport forgets a (pooled connections, attachment).
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !b.cluster_view()["peers"].as_array().unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "b still tracks the departed a"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.cluster_view()["transport"]["local_peers"], 0);
}

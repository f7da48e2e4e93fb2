//! `drive --gpu`'s read path, end to end on the software RDMA fabric (`rdma_backend = "soft"`):
//! an owner node backs up an SGLang-shaped working set from its host pool; a reader node reads
//! it into a device pool (a memfd exported as a dma-buf at an address the process never maps,
//! as a GPU's memory would be) with the bench's device read caller — one-sided READs into the
//! device, then one strided copy of the stamps back — and every page is checked. A page that
//! is not its key's is counted; a TCP node cannot register device memory.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peercache_bench::cmd::drive::devpool::{DevicePool, MemfdArena, device_read_caller};
use peercache_bench::cmd::throughput::start_node;
use peercache_bench::load::sglang::{Checks, HostLayout, HostPool, Layout, ReadKind, ShapeArgs};
use peercache_store::Store;
use serde_json::json;

const PAGES: usize = 8;
const REQUESTS: u64 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn shape(host_layout: HostLayout) -> ShapeArgs {
    ShapeArgs {
        layout: Layout::Mha,
        host_layout,
        tokens_per_page: 16,
        layers: 4,
        kv_heads: 1,
        head_dim: 128,
        mla_dim: 576,
        dtype_bytes: 2,
        model: "device-read".into(),
    }
}

fn settings(protocol: &str) -> serde_json::Map<String, serde_json::Value> {
    json!({"protocol": protocol, "rdma_backend": "soft"})
        .as_object()
        .unwrap()
        .clone()
}

/// The owner at `ip` (its own seed) backs up `set`, each page stamped with its key except
/// `wrong` (request, slot), stamped with another key's stamp.
fn owner(
    ip: &str,
    port: u16,
    s: &ShapeArgs,
    set: &[Vec<String>],
    wrong: (usize, usize),
) -> (Store, HostPool) {
    let store = start_node(ip, &format!("{ip}:{port}"), 64 << 20, &settings("rdma")).unwrap();
    let mut pool = HostPool::new(s, PAGES);
    // SAFETY: the pool is dropped after the node is shut down (the test's end).
    unsafe { pool.register(&store) }.unwrap();
    let per = s.segments_per_page() as usize;
    for (r, keys) in set.iter().enumerate() {
        let mut segs = Vec::new();
        for (slot, k) in keys.iter().enumerate() {
            let stamp = if (r, slot) == wrong { &set[0][0] } else { k };
            pool.stamp(slot, stamp);
            pool.segments(slot, &mut segs);
        }
        // SAFETY: the segments point into `pool`, not touched by anything else meanwhile.
        let ok = unsafe { store.batch_set_raw(keys, &segs, &vec![per; keys.len()]) }.unwrap();
        assert!(ok.iter().all(|&x| x));
    }
    (store, pool)
}

fn wait_visible(store: &Store, set: &[Vec<String>]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for keys in set {
        while store.batch_exists(keys).unwrap() < keys.len() {
            assert!(Instant::now() < deadline, "the working set never appeared");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn device_pool(s: &ShapeArgs) -> Arc<DevicePool> {
    let arena = MemfdArena::new(PAGES * s.page_bytes() as usize).unwrap();
    Arc::new(DevicePool::new(Box::new(arena), s, PAGES).unwrap())
}

#[test]
fn pages_land_in_device_memory_and_every_one_is_checked() {
    for (n, host_layout) in [HostLayout::LayerFirst, HostLayout::PageFirst]
        .into_iter()
        .enumerate()
    {
        let s = shape(host_layout);
        let set = peercache_bench::load::sglang::working_set(&s, REQUESTS, PAGES);
        let port = free_port();
        let o_ip = format!("127.0.0.{}", 71 + 2 * n);
        let r_ip = format!("127.0.0.{}", 72 + 2 * n);
        // Request 2's slot 5 carries request 0's first stamp: the check must see it.
        let (own, _own_pool) = owner(&o_ip, port, &s, &set, (2, 5));
        let reader = start_node(
            &r_ip,
            &format!("{o_ip}:{port}"),
            64 << 20,
            &settings("rdma"),
        )
        .unwrap();
        wait_visible(&reader, &set);
        let pool = device_pool(&s);
        // SAFETY: the pool outlives the reader node (dropped after shutdown below).
        unsafe { pool.register(&reader) }.unwrap();
        let checks = Arc::new(Checks::default());
        let before = reader.stats().rdma_read_bytes;
        for kind in [ReadKind::Get, ReadKind::Prefetch] {
            // SAFETY: `pool` is registered with `reader`, used by this caller only.
            let mut call = unsafe {
                device_read_caller(
                    kind,
                    reader.clone(),
                    pool.clone(),
                    set.clone(),
                    0,
                    checks.clone(),
                )
            };
            // One pass over the working set: requests 1, 2, 3, 0.
            for _ in 0..REQUESTS {
                let out = call();
                assert!(!out.error, "{kind:?}: the call failed");
                assert_eq!((out.pages, out.misses), (PAGES as u64, 0), "{kind:?}");
            }
        }
        assert_eq!(
            checks.wrong.load(Ordering::Relaxed),
            2,
            "{host_layout:?}: the one wrong page, once per pass, and nothing else"
        );
        let st = reader.stats();
        let moved = 2 * REQUESTS * PAGES as u64 * s.page_bytes();
        assert!(
            st.rdma_read_bytes - before >= moved,
            "{host_layout:?}: {} RDMA bytes for {moved} bytes of pages",
            st.rdma_read_bytes - before
        );
        assert_eq!(st.staged_reads, 0, "nothing bounced through the host");
        reader.shutdown();
        own.shutdown();
    }
}

#[test]
fn a_node_without_rdma_cannot_take_device_memory() {
    let s = shape(HostLayout::LayerFirst);
    let port = free_port();
    let node = start_node(
        "127.0.0.75",
        &format!("127.0.0.75:{port}"),
        64 << 20,
        &settings("tcp"),
    )
    .unwrap();
    let pool = device_pool(&s);
    // SAFETY: the pool outlives the node.
    let e = unsafe { pool.register(&node) }.unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("registering GPU memory"), "{text}");
    assert!(text.to_lowercase().contains("rdma"), "{text}");
    node.shutdown();
}

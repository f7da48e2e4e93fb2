//! Prefill/decode: a decode node waits, bounded, for a prefix another node is publishing.

use std::time::{Duration, Instant};

use peercache_store::Store;
use serde_json::json;

mod common;

/// A 16 MiB node on 127.0.0.`n`, seeded by 127.0.0.40.
fn node(n: u8, port: u16, extra: serde_json::Value) -> Store {
    let mut m = json!({"global_segment_size": "16mb"});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    common::node(n, 40, port, m)
}

#[test]
fn decode_waits_for_the_prefix_prefill_publishes() {
    let port = common::free_port();
    let prefill = node(40, port, json!({}));
    let decode = node(41, port, json!({"exists_wait_ms": 300}));
    assert!(prefill.wait_members(2, Duration::from_secs(10)));
    assert!(decode.wait_members(2, Duration::from_secs(10)));
    let keys: Vec<String> = (0..8).map(|i| format!("req-7-page-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 8 << 10]).collect();

    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let t0 = Instant::now();
            let n = decode
                .wait_for_full_prefix(&keys, Duration::from_secs(10))
                .unwrap();
            (n, Instant::now(), t0.elapsed())
        });
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        assert!(prefill.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
        let written = Instant::now();
        let (n, woke, waited) = waiter.join().unwrap();
        assert_eq!(n, 8);
        assert!(waited < Duration::from_secs(10));
        // Polling is at most 10 ms apart: the waiter sees the prefix soon after it lands.
        let lag = woke.saturating_duration_since(written);
        assert!(
            lag < Duration::from_millis(500),
            "woke {lag:?} after the write"
        );
    });
    common::assert_reads_back(&decode, &keys, &pages);

    // A prefix that never completes: the wait is bounded and reports the leading pages.
    let partial: Vec<String> = (0..5).map(|i| format!("req-8-page-{i}")).collect();
    let refs: Vec<&[u8]> = pages[..3].iter().map(|p| p.as_slice()).collect();
    assert!(
        prefill
            .batch_set(&partial[..3], &refs)
            .unwrap()
            .iter()
            .all(|&x| x)
    );
    let t0 = Instant::now();
    let n = decode
        .wait_for_full_prefix(&partial, Duration::from_millis(200))
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(n, 3);
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(700),
        "{took:?}"
    );
    // `exists_wait_ms` makes batch_exists itself wait (300 ms here), bounded the same way.
    let t0 = Instant::now();
    assert_eq!(decode.batch_exists(&partial).unwrap(), 3);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(900),
        "{took:?}"
    );
    // The prefill node (no wait configured) answers at once.
    let t0 = Instant::now();
    assert_eq!(prefill.batch_exists(&partial).unwrap(), 3);
    assert!(t0.elapsed() < Duration::from_millis(200));
    decode.shutdown();
    prefill.shutdown();
}

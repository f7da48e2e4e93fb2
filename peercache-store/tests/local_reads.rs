//! A node's reads of its own pages: large batches are copied out of the pool on several
//! threads side by side (`read::local_copy`); every page served must still be the page written,
//! also while a writer evicts around the reader.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde_json::json;

mod common;
use common::{free_port, node, page};

const PAGE: usize = 1 << 20;
const SEGS: usize = 4;

/// `keys` read on `s` into pages of `SEGS` segments each, every byte poisoned first: (hits,
/// pages).
fn read_segmented(s: &peercache_store::Store, keys: &[String]) -> (Vec<bool>, Vec<Vec<u8>>) {
    let mut out = vec![vec![0xA5u8; PAGE]; keys.len()];
    let mut segs: Vec<&mut [u8]> = out
        .iter_mut()
        .flat_map(|p| p.chunks_mut(PAGE / SEGS))
        .collect();
    let got = s
        .batch_get_segments(keys, &mut segs, &vec![SEGS; keys.len()])
        .unwrap();
    (got, out)
}

#[test]
fn a_large_local_read_lands_every_page_byte_exact_with_misses_between() {
    let s = node(61, 61, free_port(), json!({"global_segment_size": "128mb"}));
    let keys: Vec<String> = (0..24).map(|i| format!("big-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..24).map(|i| page(7000 + i, PAGE)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(s.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));

    // 24 MiB in one read (6 threads' worth, capped by the CPUs), a miss every sixth page.
    let mut asked = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        asked.push(k.clone());
        if i % 6 == 5 {
            asked.push(format!("never-written-{i}"));
        }
    }
    let (got, out) = read_segmented(&s, &asked);
    let mut next = 0;
    for (k, (hit, bytes)) in asked.iter().zip(got.iter().zip(&out)) {
        if k.starts_with("never-written") {
            assert!(!hit, "{k} was never written");
            continue;
        }
        assert!(hit, "{k} missed");
        assert!(bytes == &pages[next], "{k}: not the page written");
        next += 1;
    }
    assert_eq!(next, 24);
}

#[test]
fn a_large_local_read_racing_an_evicting_writer_never_serves_wrong_bytes() {
    // A few dozen 1 MiB pages fit: the writer evicts constantly while the reader copies 8-page
    // batches (8 MiB: two threads or more) of the pages it wrote last, until it is done, then
    // once more: the writer's last batch then stays, so that read must serve it.
    let s = node(62, 62, free_port(), json!({"global_segment_size": "34mb"}));
    let done = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let (mut served, mut missed) = (0u64, 0u64);
    let mut read_recent = |s: &peercache_store::Store| {
        let first = written.load(Ordering::Acquire).saturating_sub(8);
        let keys: Vec<String> = (first..first + 8).map(|i| format!("churn-{i}")).collect();
        let (got, out) = read_segmented(s, &keys);
        let mut hits = 0;
        for (j, (hit, bytes)) in got.iter().zip(&out).enumerate() {
            let i = first + j as u64;
            if *hit {
                assert!(
                    bytes == &page(i, PAGE),
                    "churn-{i}: served bytes that are not its page"
                );
                hits += 1;
            }
        }
        served += hits;
        missed += 8 - hits;
        hits
    };
    std::thread::scope(|t| {
        t.spawn(|| {
            for n in (0..1600u64).step_by(4) {
                let keys: Vec<String> = (n..n + 4).map(|i| format!("churn-{i}")).collect();
                let pages: Vec<Vec<u8>> = (n..n + 4).map(|i| page(i, PAGE)).collect();
                let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
                s.batch_set(&keys, &refs).unwrap();
                written.store(n + 4, Ordering::Release);
            }
            done.store(true, Ordering::Release);
        });
        while !done.load(Ordering::Acquire) {
            read_recent(&s);
        }
    });
    let last = read_recent(&s);
    assert!(
        last >= 4,
        "the last batch written, with no writer left, must serve: {last} of 8"
    );
    assert!(served >= 8, "served {served}, missed {missed}");
}

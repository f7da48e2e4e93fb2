//! The stale-page race: 1,000,000 publish/evict/read operations across threads on small pages
//! whose bytes derive from (key, write epoch). Every accepted page is compared in full. The
//! test must see 0 wrong pages accepted *and* a non-zero number of rejected reads (proof that
//! reads really raced slot reuse).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use peercache_pool::{
    PageWrite, Pool, PoolConfig, PoolError, PublishScratch, Published, ReplClass,
};
use peercache_wire::{Layout, PageKey};
use rand::{Rng, SeedableRng};

const PAGE: usize = 512;
const KEYS: u64 = 6000;
const TOTAL_OPS: u64 = 1_000_000;
/// The longest a run waits for its first race after TOTAL_OPS.
const RACE_DEADLINE: Duration = Duration::from_secs(30);

fn fill(key: PageKey, epoch: u64, out: &mut [u8]) {
    out[..8].copy_from_slice(&epoch.to_le_bytes());
    let mut x = key.lo() ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in &mut out[8..] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn key(i: u64) -> PageKey {
    PageKey::from_key(&format!("race-{i}"))
}

#[test]
fn no_wrong_page_is_ever_accepted_under_publish_evict_read_races() {
    // 1 MiB of 576-byte slots: ~1800 slots for 6000 keys, so slots are reused constantly.
    let pool = Arc::new(
        Pool::new(PoolConfig {
            slab_bytes: 1 << 20,
            ..PoolConfig::new(1 << 20)
        })
        .unwrap(),
    );
    let ops = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    // The run ends after TOTAL_OPS once a race has been seen (a stale or torn read rejected),
    // or after RACE_DEADLINE: on a loaded machine the threads may take longer to interleave.
    let done = {
        let rejected = rejected.clone();
        move |ops: u64| {
            ops >= TOTAL_OPS
                && (rejected.load(Ordering::Relaxed) > 0 || t0.elapsed() > RACE_DEADLINE)
        }
    };

    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (pool, ops, stop, done) = (pool.clone(), ops.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(w);
                let mut scratch = PublishScratch::default();
                let mut out = Vec::new();
                let mut evicted = Vec::new();
                let mut bufs = vec![[0u8; PAGE]; 16];
                let mut epoch = w << 56;
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<PageKey> =
                        (0..16).map(|_| key(rng.random_range(0..KEYS))).collect();
                    for (k, b) in keys.iter().zip(bufs.iter_mut()) {
                        epoch += 1;
                        fill(*k, epoch, b);
                    }
                    let segs: Vec<[&[u8]; 1]> = bufs.iter().map(|b| [&b[..]]).collect();
                    let pages: Vec<PageWrite<'_>> = keys
                        .iter()
                        .zip(&segs)
                        .map(|(k, s)| PageWrite {
                            key: *k,
                            segments: s,
                            valid_len: None,
                            layout: Layout::NONE,
                        })
                        .collect();
                    pool.publish_batch(
                        &pages,
                        ReplClass::Retained,
                        &mut scratch,
                        &mut out,
                        &mut evicted,
                    );
                    assert!(out.iter().all(|p| !matches!(p, Published::Failed(_))));
                    // Occasionally drop pages outright too (owner-side removal).
                    if rng.random_ratio(1, 8) {
                        let k = key(rng.random_range(0..KEYS));
                        pool.remove_batch(&[(k, None)]);
                    }
                    evicted.clear();
                    if done(ops.fetch_add(16, Ordering::Relaxed)) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    let readers: Vec<_> = (0..2u64)
        .map(|r| {
            let (pool, ops, stop, done) = (pool.clone(), ops.clone(), stop.clone(), done.clone());
            let (accepted, rejected, wrong) = (accepted.clone(), rejected.clone(), wrong.clone());
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + r);
                let mut locs = Vec::new();
                // Locations from the previous round, read again later: like a directory read
                // cache or an exists→get hand-off, they go stale while writers reuse slots.
                let mut old: Vec<(PageKey, peercache_pool::PageLocation)> = Vec::new();
                let mut buf = [0u8; PAGE];
                let mut expect = [0u8; PAGE];
                while !stop.load(Ordering::Relaxed) {
                    let keys: Vec<PageKey> =
                        (0..64).map(|_| key(rng.random_range(0..KEYS))).collect();
                    pool.lookup_batch(&keys, &mut locs);
                    let fresh: Vec<_> = keys
                        .iter()
                        .zip(&locs)
                        .filter_map(|(k, l)| l.map(|l| (*k, l)))
                        .collect();
                    for (k, loc) in fresh.iter().chain(&old) {
                        match pool.read_unleased(loc, *k, &mut buf) {
                            Ok(()) => {
                                let epoch = u64::from_le_bytes(buf[..8].try_into().unwrap());
                                fill(*k, epoch, &mut expect);
                                if buf != expect {
                                    wrong.fetch_add(1, Ordering::Relaxed);
                                }
                                accepted.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(PoolError::Verify { .. }) => {
                                rejected.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => panic!("unexpected error {e}"),
                        }
                    }
                    old = fresh;
                    if done(ops.fetch_add(64, Ordering::Relaxed)) {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();

    for t in writers.into_iter().chain(readers) {
        t.join().unwrap();
    }
    let (a, r, w) = (
        accepted.load(Ordering::Relaxed),
        rejected.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
    );
    let s = pool.stats();
    eprintln!(
        "race: {} ops in {:?}: accepted {a}, rejected {r} (stale/torn), wrong {w}, evictions {}",
        ops.load(Ordering::Relaxed),
        t0.elapsed(),
        s.evicted_retained
    );
    pool.check_invariants();
    assert_eq!(w, 0, "a wrong page was accepted");
    assert!(a > 10_000, "too few reads accepted to mean anything: {a}");
    assert!(r > 0, "no read was rejected: the test did not race");
    assert!(s.evicted_retained > 10_000, "eviction did not run");
}

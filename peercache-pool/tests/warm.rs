//! A pool warmed in the background: it takes publishes at once, every slab joins once it is
//! resident, the whole capacity is usable when warm, no publish or read takes a page fault on
//! pool memory, and a pool larger than the host is refused with the figures.

use std::time::Duration;

use peercache_pool::mem::MemfdAlloc;
use peercache_pool::{
    PageWrite, Pool, PoolConfig, PoolError, PublishScratch, Published, ReplClass,
};
use peercache_wire::{Layout, PageKey};

const PAGE: usize = 64 << 10;

fn key(space: &str, i: usize) -> PageKey {
    PageKey::from_key(&format!("warm/{space}/{i}"))
}

/// Minor page faults taken by the calling thread so far.
fn minor_faults() -> i64 {
    // SAFETY: a zeroed rusage is a valid out-parameter; getrusage writes only into it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD reports the calling thread alone.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    assert_eq!(rc, 0);
    u.ru_minflt
}

/// The keys of `n` pages of `space` and their one segment each (page `i` is buffer `i % 8`).
fn batch<'a>(space: &str, n: usize, bufs: &'a [Vec<u8>]) -> (Vec<PageKey>, Vec<[&'a [u8]; 1]>) {
    let keys = (0..n).map(|i| key(space, i)).collect();
    let segs = (0..n).map(|i| [&bufs[i % bufs.len()][..]]).collect();
    (keys, segs)
}

/// One retained write per key.
fn writes<'a>(keys: &[PageKey], segs: &'a [[&'a [u8]; 1]]) -> Vec<PageWrite<'a>> {
    keys.iter()
        .zip(segs)
        .map(|(k, s)| PageWrite {
            key: *k,
            segments: s,
            valid_len: None,
            layout: Layout::NONE,
        })
        .collect()
}

/// Publishes `n` pages of `space` (page `i` filled with byte `i`), one batch, reusing buffers.
fn publish(pool: &Pool, space: &str, n: usize, bufs: &[Vec<u8>], st: &mut Scratch) -> usize {
    let (keys, segs) = batch(space, n, bufs);
    let writes = writes(&keys, &segs);
    st.publish(pool, &writes);
    st.out
        .iter()
        .filter(|p| matches!(p, Published::New(_)))
        .count()
}

#[derive(Default)]
struct Scratch {
    scratch: PublishScratch,
    out: Vec<Published>,
    evicted: Vec<peercache_pool::Evicted>,
}

impl Scratch {
    /// One retained batch, its results in `out` and `evicted`.
    fn publish(&mut self, pool: &Pool, writes: &[PageWrite<'_>]) {
        pool.publish_batch(
            writes,
            ReplClass::Retained,
            &mut self.scratch,
            &mut self.out,
            &mut self.evicted,
        );
    }
}

fn bufs() -> Vec<Vec<u8>> {
    (0..8).map(|i| vec![i as u8 + 1; PAGE]).collect()
}

#[test]
fn a_warm_pool_offers_every_slab_and_publishes_into_all_of_it_without_evicting() {
    let cfg = PoolConfig {
        slab_bytes: 2 << 20,
        ..PoolConfig::new(512 << 20)
    };
    let pool = Pool::new(cfg).unwrap();
    let early = pool.readiness();
    assert!(
        early.ready_bytes >= 2 << 20,
        "the first slabs are in at once"
    );
    assert_eq!(early.total_bytes, 512 << 20);
    let r = pool.wait_ready(Duration::from_secs(120));
    assert!(r.is_ready(), "warm within the deadline: {r:?}");
    // 2 MiB slabs of 64 KiB + header pages hold 31 each: fill all 256 slabs.
    let (bufs, mut st) = (bufs(), Scratch::default());
    let n = 256 * 31;
    assert_eq!(publish(&pool, "all", n, &bufs, &mut st), n);
    assert!(st.evicted.is_empty(), "{} evicted", st.evicted.len());
    let s = pool.stats();
    assert_eq!(s.retained, n as u64);
    pool.check_invariants();
}

/// A shared pool of `size` bytes in 2 MiB slabs (4 KiB pages here: shmem gets no transparent
/// huge pages, so an unfaulted slab would cost one fault per 4 KiB written), waited warm.
fn warm_shared_pool(size: usize) -> Pool {
    let pool = Pool::with_alloc(
        PoolConfig {
            slab_bytes: 2 << 20,
            ..PoolConfig::new(size)
        },
        &MemfdAlloc::default(),
    )
    .unwrap();
    assert!(pool.wait_ready(Duration::from_secs(120)).is_ready());
    pool
}

#[test]
fn no_publish_or_read_takes_a_page_fault_on_pool_memory() {
    let pool = warm_shared_pool(256 << 20);
    let (bufs, mut st) = (bufs(), Scratch::default());
    // Warm the scratch vectors and the size class's first slab (heap, not pool memory).
    assert_eq!(publish(&pool, "first", 1, &bufs, &mut st), 1);
    let mut dst = vec![0u8; PAGE];
    dst.fill(1);
    // 64 MiB of pages into fresh slabs: 16 384 pool pages of 4 KiB written.
    let n = 1024;
    let (keys, segs) = batch("measured", n, &bufs);
    let writes = writes(&keys, &segs);
    let removals: Vec<(PageKey, Option<u64>)> = keys.iter().map(|k| (*k, None)).collect();
    st.out.reserve(n);
    let publish_all = |st: &mut Scratch| {
        let before = minor_faults();
        st.publish(&pool, &writes);
        assert!(st.out.iter().all(|p| matches!(p, Published::New(_))));
        minor_faults() - before
    };
    // 64 MiB of pages into fresh slabs: 16 384 pool pages of 4 KiB written. What faults is
    // the heap touched for the first time (the key index's reserved buckets, the slot tables
    // of the 33 slabs the class takes), a few hundred pages at most, never the pool.
    let first = publish_all(&mut st);
    assert!(first < 1024, "{first} minor faults publishing 64 MiB");
    // Every page of every slab was resident before anything was written to it.
    // Steady state: the same slots again, and the reads, fault nothing at all.
    pool.remove_batch(&removals);
    let again = publish_all(&mut st);
    assert_eq!(again, 0, "republishing 64 MiB into handed-out slabs");
    let mut read_all = || {
        let before = minor_faults();
        let leases = pool.lease_batch(&keys);
        for (i, k) in keys.iter().enumerate() {
            pool.read_leased(&leases, i, *k, &mut [&mut dst[..]])
                .unwrap();
            assert_eq!(dst[0], bufs[i % bufs.len()][0]);
        }
        drop(leases);
        minor_faults() - before
    };
    // The first round's lease table is fresh heap; after it, nothing.
    assert!(read_all() < 64);
    assert_eq!(read_all(), 0, "reading 64 MiB back");
}

#[test]
fn every_page_of_a_warm_pool_is_resident_before_it_is_written() {
    let pool = warm_shared_pool(384 << 20);
    let r = pool.readiness();
    assert!(r.is_ready());
    let pages = r.total_bytes as usize / 4096;
    let mut resident = vec![0u8; pages];
    // SAFETY: `resident` holds one byte per 4 KiB page of the pool's slabs, which lie at the
    // start of its mapping.
    let rc = unsafe {
        libc::mincore(
            pool.base().cast(),
            r.total_bytes as usize,
            resident.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    let missing = resident.iter().filter(|b| *b & 1 == 0).count();
    assert_eq!(missing, 0, "{missing} of {pages} pages not resident");
}

#[test]
fn a_pool_beyond_the_host_is_refused_at_start_unless_overcommit_is_allowed() {
    let e = Pool::new(PoolConfig::new(1 << 50)).unwrap_err();
    assert!(matches!(e, PoolError::HostTooSmall { .. }), "{e}");
    assert!(e.to_string().contains("MemAvailable"), "{e}");
    // Allowed explicitly, the mapping itself may still be refused by the kernel, but the
    // check is skipped: no HostTooSmall.
    let allowed = Pool::new(PoolConfig {
        allow_overcommit: true,
        background: true,
        ..PoolConfig::new(1 << 30)
    });
    assert!(allowed.is_ok());
}

#[test]
fn dropping_a_pool_that_is_still_warming_returns_at_once() {
    // The threads stop after their slab and unmap the memory as the last one leaves; the
    // drop never waits for them (an embedder's thread may hold a lock their logging needs).
    for _ in 0..3 {
        let pool = Pool::new(PoolConfig {
            fault_threads: 1,
            ..PoolConfig::new(2 << 30)
        })
        .unwrap();
        let r = pool.readiness();
        assert!(r.ready_bytes > 0 && r.ready_bytes <= r.total_bytes);
        let t = std::time::Instant::now();
        drop(pool);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}

/// Whether every 4 KiB page of `[ptr, ptr + len)` is resident.
fn all_resident(ptr: *const u8, len: usize) -> bool {
    let mut v = vec![0u8; len.div_ceil(4096)];
    // SAFETY: `v` holds one byte per 4 KiB page of the range, which lies inside a live
    // mapping (the caller's pool).
    let rc = unsafe { libc::mincore(ptr as *mut libc::c_void, len, v.as_mut_ptr()) };
    assert_eq!(rc, 0);
    v.iter().all(|b| b & 1 == 1)
}

#[test]
fn a_range_the_pool_calls_resident_is_in_memory_while_the_rest_still_warms() {
    // One thread warms 640 MiB of shared memory in 2 MiB slabs; the first 128 MiB are
    // faulted before `with_alloc` returns.
    let pool = Pool::with_alloc(
        PoolConfig {
            slab_bytes: 2 << 20,
            fault_threads: 1,
            ..PoolConfig::new(640 << 20)
        },
        &MemfdAlloc::default(),
    )
    .unwrap();
    let slab = 2u64 << 20;
    assert!(
        pool.wait_resident(0, 64 << 20, Duration::ZERO),
        "the part faulted at start is resident at once"
    );
    assert!(
        pool.wait_resident(900 << 20, 4096, Duration::ZERO),
        "past the slabs"
    );
    assert!(pool.wait_resident(0, 0, Duration::ZERO), "an empty range");
    // Every slab, in the order a registration takes them: each is in memory the moment the
    // pool says so (whether or not the rest of the pool is warm yet).
    let total = pool.readiness().total_bytes;
    let mut early = 0;
    for off in (0..total).step_by(32 * slab as usize) {
        assert!(pool.wait_resident(off, 32 * slab, Duration::from_secs(120)));
        // SAFETY: `off + 32 slabs` lies within the pool's mapping.
        let at = unsafe { pool.base().add(off as usize) };
        assert!(all_resident(at, 32 * slab as usize), "at {off}");
        early += usize::from(!pool.readiness().is_ready());
    }
    assert!(early > 0, "some range was ready before the whole pool");
    assert!(pool.wait_ready(Duration::from_secs(120)).is_ready());
}

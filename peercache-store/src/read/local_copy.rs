//! Copying a read's leased local pages into its destination: on the calling thread for a small
//! batch, on several threads side by side for a large one. A staged load of large pages (an
//! SGLang or vLLM engine's, 8 MiB each) is bound by this host copy, and one thread's copy runs
//! well below the memory's bandwidth.

use std::sync::OnceLock;

use peercache_pool::{Leases, Pool};
use peercache_wire::PageKey;
use smallvec::SmallVec;

use crate::read::dest::PageDest;
use crate::read::plan::ReadPlan;

/// Bytes each copy thread must have to itself before another is started: below it, a thread's
/// start costs more than its share of the copy saves.
pub(crate) const BYTES_PER_THREAD: u64 = 4 << 20;
/// The most threads one read copies with (the caller's included).
pub(crate) const MAX_THREADS: usize = 8;

/// One page to copy: its index in the read, the leases that hold it and its index there, and
/// its valid length (as leased).
pub(crate) struct LeasedPage<'l, 'p> {
    pub(crate) i: usize,
    pub(crate) leases: &'l Leases<'p>,
    pub(crate) at: usize,
    pub(crate) valid_len: u32,
}

/// How many threads copy `bytes` in `pages` pages when `cpus` CPUs are available: one per
/// [`BYTES_PER_THREAD`], at most one per page, per CPU and [`MAX_THREADS`]; at least one.
pub(crate) fn copy_threads(bytes: u64, pages: usize, cpus: usize) -> usize {
    let by_bytes = usize::try_from(bytes / BYTES_PER_THREAD).unwrap_or(usize::MAX);
    by_bytes.min(pages).min(cpus).clamp(1, MAX_THREADS)
}

/// The CPUs this process may run on, asked once.
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Copies each page of `jobs` (in increasing `i`) out of `pool` into `dest`, verified by the
/// pool; whether each was served.
pub(crate) fn copy_leased(
    pool: &Pool,
    keys: &[PageKey],
    jobs: &[LeasedPage<'_, '_>],
    dest: &mut PageDest<'_>,
) -> Vec<bool> {
    let bytes = jobs.iter().map(|j| dest.lens()[j.i]).sum();
    let threads = copy_threads(bytes, jobs.len(), cpus());
    if threads > 1 {
        let sizes: Vec<u64> = jobs.iter().map(|j| dest.lens()[j.i]).collect();
        let idx: Vec<usize> = jobs.iter().map(|j| j.i).collect();
        if let Some(mut views) = dest.pages_mut(&idx) {
            return side_by_side(pool, keys, jobs, &sizes, &mut views, threads);
        }
    }
    jobs.iter()
        .map(|j| {
            pool.read_leased(j.leases, j.at, keys[j.i], &mut dest.page_mut(j.i))
                .is_ok()
        })
        .collect()
}

/// [`copy_leased`], then each page copied marked served in `plan` with its leased valid
/// length: (bytes served, pages served).
pub(crate) fn serve_leased(
    pool: &Pool,
    keys: &[PageKey],
    jobs: &[LeasedPage<'_, '_>],
    dest: &mut PageDest<'_>,
    plan: &mut ReadPlan<'_>,
) -> (u64, u64) {
    let copied = copy_leased(pool, keys, jobs, dest);
    let (mut bytes, mut pages) = (0u64, 0u64);
    for (job, ok) in jobs.iter().zip(copied) {
        if ok {
            plan.served_local(job.i, job.valid_len);
            bytes += dest.lens()[job.i];
            pages += 1;
        }
    }
    (bytes, pages)
}

/// [`copy_leased`] on `threads` threads, each given a run of pages of about equal bytes; the
/// calling thread copies the last run.
fn side_by_side(
    pool: &Pool,
    keys: &[PageKey],
    jobs: &[LeasedPage<'_, '_>],
    sizes: &[u64],
    views: &mut [SmallVec<[&mut [u8]; 4]>],
    threads: usize,
) -> Vec<bool> {
    let mut ok = vec![false; jobs.len()];
    let share = sizes.iter().sum::<u64>().div_ceil(threads as u64);
    std::thread::scope(|s| {
        let (mut jobs, mut sizes, mut views, mut ok) = (jobs, sizes, views, &mut ok[..]);
        while !jobs.is_empty() {
            let mut n = 0;
            let mut bytes = 0;
            while n < jobs.len() && (n == 0 || bytes < share) {
                bytes += sizes[n];
                n += 1;
            }
            let (run, rest) = jobs.split_at(n);
            let (run_views, rest_views) = std::mem::take(&mut views).split_at_mut(n);
            let (run_ok, rest_ok) = std::mem::take(&mut ok).split_at_mut(n);
            (jobs, sizes, views, ok) = (rest, &sizes[n..], rest_views, rest_ok);
            let copy = move || {
                for ((j, v), o) in run.iter().zip(run_views).zip(run_ok) {
                    *o = pool.read_leased(j.leases, j.at, keys[j.i], v).is_ok();
                }
            };
            if jobs.is_empty() {
                copy();
            } else {
                s.spawn(copy);
            }
        }
    });
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_batches_stay_on_the_calling_thread() {
        assert_eq!(copy_threads(0, 0, 16), 1);
        assert_eq!(copy_threads(BYTES_PER_THREAD - 1, 100, 16), 1);
        assert_eq!(copy_threads(64 << 20, 1, 16), 1, "one page is one copy");
        assert_eq!(copy_threads(64 << 20, 8, 1), 1, "one CPU");
    }

    #[test]
    fn large_batches_take_a_thread_per_share_up_to_the_caps() {
        assert_eq!(copy_threads(2 * BYTES_PER_THREAD, 100, 16), 2);
        assert_eq!(copy_threads(64 << 20, 8, 16), 8);
        assert_eq!(copy_threads(64 << 20, 8, 2), 2);
        assert_eq!(copy_threads(1 << 40, 1 << 20, 1 << 10), MAX_THREADS);
    }
}

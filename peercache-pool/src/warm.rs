//! Warming a large pool in the background: threads fault its slabs in, one slab at a time,
//! and queue each one that is in; the pool takes queued slabs into use under its own lock
//! ([`Warmer::take`]), so a slab reaches a size class only once every page of it is resident
//! and no publish or read ever takes a page fault on pool memory. A node therefore serves at
//! once while the rest of its pool warms.
//!
//! On a host with several NUMA nodes the slabs are split into one contiguous range per node,
//! each faulted by threads pinned to that node's cores, so first touch spreads the pool evenly
//! over the host's memory instead of piling it onto the node the start thread ran on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use metrics::Gauge;
use parking_lot::{Condvar, Mutex};

use crate::mem::Mapping;
use crate::prefault::{fault, gib};

/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// One NUMA node's share of the slabs: `[next, end)` still to fault, and the cores to pin to.
struct Range {
    next: AtomicU32,
    end: u32,
    cpus: Vec<usize>,
}

struct Shared {
    /// Shared with the pool: the memory stays mapped until the pool and every thread let go.
    map: Arc<Mapping>,
    slab: usize,
    ranges: Vec<Range>,
    /// First slab this warmer faults (those before it were faulted before it started).
    first: u32,
    /// Last slab + 1.
    end: u32,
    /// One bit per slab of `[first, end)`, set once it is faulted in.
    faulted: Box<[AtomicU64]>,
    /// Slabs faulted so far; waiters for a slab's bit wait on `advanced` under it.
    done: Mutex<u64>,
    advanced: Condvar,
    /// Slabs faulted in and not yet taken by the pool.
    queue: Mutex<Vec<u32>>,
    /// Set when `queue` may be non-empty: the pool's write path checks this one atomic.
    pending: AtomicBool,
    ready_bytes: AtomicU64,
    total_bytes: u64,
    stop: AtomicBool,
    /// Threads still faulting; the last one out logs the total.
    running: AtomicU32,
    started: Instant,
    last_log: Mutex<Instant>,
    gauge: Gauge,
    /// Set (and `ended` signalled) when every thread has ended.
    finished: Mutex<bool>,
    ended: Condvar,
}

/// The background faulting of slabs `[first, end)` of a pool mapping. Dropping it tells the
/// threads to stop after the slab each is on and does not wait: they hold the mapping, which is
/// unmapped when the last of them lets go. (Waiting could deadlock an embedding runtime whose
/// log bridge a thread needs, such as Python's lock, held by the thread dropping the pool.)
pub(crate) struct Warmer {
    shared: Arc<Shared>,
}

impl Warmer {
    /// Starts `threads` threads (at least one per NUMA node with cores) faulting slabs
    /// `[first, end)` of `map`, `slab` bytes each. `ready_before` is the bytes
    /// already faulted (the slabs before `first`), reported in the gauge and the log.
    ///
    /// No one may write slabs `[first, end)` before [`Warmer::take`] hands them over.
    ///
    /// Fails only when not one thread could be spawned.
    pub(crate) fn start(
        map: Arc<Mapping>,
        slab: usize,
        (first, end): (u32, u32),
        threads: usize,
        ready_before: u64,
        gauge: Gauge,
    ) -> std::io::Result<Warmer> {
        let nodes = numa_nodes();
        let ranges = split(first, end, nodes.len())
            .into_iter()
            .zip(nodes)
            .map(|((lo, hi), cpus)| Range {
                next: AtomicU32::new(lo),
                end: hi,
                cpus,
            })
            .collect::<Vec<_>>();
        let threads = threads.max(ranges.len());
        let total_bytes = ready_before + (end - first) as u64 * slab as u64;
        gauge.set(ready_before as f64);
        tracing::info!(
            threads,
            numa_nodes = ranges.len(),
            "warming {:.1} GiB of pool memory in the background ({:.2} GiB ready)",
            gib(total_bytes),
            gib(ready_before)
        );
        let shared = Arc::new(Shared {
            map,
            slab,
            ranges,
            first,
            end,
            faulted: (0..(end - first).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            done: Mutex::new(0),
            advanced: Condvar::new(),
            queue: Mutex::new(Vec::with_capacity((end - first) as usize)),
            pending: AtomicBool::new(false),
            ready_bytes: AtomicU64::new(ready_before),
            total_bytes,
            stop: AtomicBool::new(false),
            running: AtomicU32::new(threads as u32),
            started: Instant::now(),
            last_log: Mutex::new(Instant::now()),
            gauge,
            finished: Mutex::new(false),
            ended: Condvar::new(),
        });
        let mut spawned = 0;
        let mut last_err = None;
        for i in 0..threads {
            let worker = shared.clone();
            match std::thread::Builder::new()
                .name(format!("pc-warm-{i}"))
                .spawn(move || worker.run(i % worker.ranges.len()))
            {
                Ok(_detached) => spawned += 1,
                Err(e) => {
                    shared.thread_ended();
                    last_err = Some(e);
                }
            }
        }
        match (spawned == 0, last_err) {
            (true, Some(e)) => Err(e),
            _ => Ok(Warmer { shared }),
        }
    }

    /// Hands every slab faulted since the last call to `give` (the pool adds it to its free
    /// slabs under its lock). One atomic load when there is nothing new.
    pub(crate) fn take(&self, mut give: impl FnMut(u32)) {
        if !self.shared.pending.load(Ordering::Acquire) {
            return;
        }
        let mut q = self.shared.queue.lock();
        self.shared.pending.store(false, Ordering::Release);
        for s in q.drain(..) {
            give(s);
        }
    }

    /// Bytes of the pool faulted in so far (including what was ready before the warmer).
    pub(crate) fn ready_bytes(&self) -> u64 {
        self.shared.ready_bytes.load(Ordering::Acquire)
    }

    /// Waits at most `timeout` until slabs `[lo, hi)` are faulted in (those outside the
    /// warmer's range always are); true when they are.
    pub(crate) fn wait_faulted(&self, lo: u32, hi: u32, timeout: Duration) -> bool {
        let sh = &*self.shared;
        let (lo, hi) = (lo.max(sh.first), hi.min(sh.end));
        if lo >= hi || sh.all_faulted(lo, hi) {
            return true;
        }
        let deadline = Instant::now() + timeout;
        let mut done = sh.done.lock();
        loop {
            // Checked under `done`, which a faulting thread takes after setting its bit: no
            // wake-up is lost between the check and the wait.
            if sh.all_faulted(lo, hi) {
                return true;
            }
            if sh.advanced.wait_until(&mut done, deadline).timed_out() {
                return sh.all_faulted(lo, hi);
            }
        }
    }

    /// Waits until every warming thread has ended or `timeout` passed.
    pub(crate) fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut finished = self.shared.finished.lock();
        while !*finished {
            if self
                .shared
                .ended
                .wait_until(&mut finished, deadline)
                .timed_out()
            {
                break;
            }
        }
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

impl Shared {
    /// Faults slabs of the home node's range, then helps with the others (so every slab is
    /// faulted even when a node's threads could not start).
    fn run(&self, home: usize) {
        pin_to(&self.ranges[home].cpus);
        let n = self.ranges.len();
        let mut r = 0;
        while r < n && !self.stop.load(Ordering::Acquire) {
            let range = &self.ranges[(home + r) % n];
            let s = range.next.fetch_add(1, Ordering::Relaxed);
            if s >= range.end {
                r += 1;
                continue;
            }
            let off = s as usize * self.slab;
            // SAFETY: slab `s` lies inside the mapping (the pool counts slabs from its
            // length), which `self.map` keeps alive; it is claimed by this thread alone, and
            // nobody writes it before `take` hands it over.
            fault(unsafe { self.map.ptr().add(off) }, self.slab);
            {
                let mut q = self.queue.lock();
                q.push(s);
                self.pending.store(true, Ordering::Release);
            }
            let ready = self
                .ready_bytes
                .fetch_add(self.slab as u64, Ordering::AcqRel)
                + self.slab as u64;
            // After the count: whoever sees the slab faulted sees it counted ready too.
            self.mark_faulted(s);
            self.gauge.set(ready as f64);
            self.progress(ready);
        }
        self.thread_ended();
    }

    /// Sets slab `s`'s bit and wakes whoever waits for slabs.
    fn mark_faulted(&self, s: u32) {
        let i = (s - self.first) as usize;
        self.faulted[i / 64].fetch_or(1 << (i % 64), Ordering::Release);
        *self.done.lock() += 1;
        self.advanced.notify_all();
    }

    /// Whether every slab of `[lo, hi)` (within the warmer's range) is faulted in.
    fn all_faulted(&self, lo: u32, hi: u32) -> bool {
        (lo..hi).all(|s| {
            let i = (s - self.first) as usize;
            self.faulted[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
        })
    }

    /// Counts one thread out; the last one logs the total and wakes the waiters.
    fn thread_ended(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            let ready = self.ready_bytes.load(Ordering::Acquire);
            if ready == self.total_bytes {
                let secs = self.started.elapsed().as_secs_f64();
                tracing::info!(
                    "pool memory ready: {:.1} GiB in {:.1} s ({:.2} GiB/s)",
                    gib(ready),
                    secs,
                    gib(ready) / secs.max(1e-9)
                );
            } else {
                tracing::info!(
                    "pool warming stopped at {:.1} of {:.1} GiB",
                    gib(ready),
                    gib(self.total_bytes)
                );
            }
            *self.finished.lock() = true;
            self.ended.notify_all();
        }
    }

    fn progress(&self, ready: u64) {
        if ready >= self.total_bytes {
            return;
        }
        let Some(mut last) = self.last_log.try_lock() else {
            return;
        };
        if last.elapsed() >= PROGRESS_EVERY {
            *last = Instant::now();
            tracing::info!(
                "pool memory warming: {:.1} of {:.1} GiB ready",
                gib(ready),
                gib(self.total_bytes)
            );
        }
    }
}

/// `[first, end)` cut into `parts` contiguous ranges as even as can be.
fn split(first: u32, end: u32, parts: usize) -> Vec<(u32, u32)> {
    let parts = parts.max(1) as u64;
    let n = (end - first) as u64;
    (0..parts)
        .map(|i| {
            let lo = first as u64 + n * i / parts;
            let hi = first as u64 + n * (i + 1) / parts;
            (lo as u32, hi as u32)
        })
        .collect()
}

/// The cores of each NUMA node that has any, from sysfs; one entry with no cores (no pinning)
/// on a host without NUMA nodes or when sysfs cannot say.
fn numa_nodes() -> Vec<Vec<usize>> {
    let mut nodes = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") {
        let mut ids: Vec<u32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
            .collect();
        ids.sort_unstable();
        for id in ids {
            let list =
                std::fs::read_to_string(format!("/sys/devices/system/node/node{id}/cpulist"))
                    .unwrap_or_default();
            let cpus = parse_cpulist(&list);
            if !cpus.is_empty() {
                nodes.push(cpus);
            }
        }
    }
    if nodes.len() < 2 {
        return vec![Vec::new()];
    }
    nodes
}

/// A sysfs CPU list (`0-3,8,10-11`) as core numbers; malformed parts are skipped.
fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>())
                    && a <= b
                    && b < 1 << 16
                {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<usize>().ok()),
        }
    }
    out
}

/// Pins the calling thread to `cpus` (nothing when empty); a refusal leaves it unpinned.
fn pin_to(cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: a zeroed `cpu_set_t` is the empty set; CPU_SET writes inside it for indices
    // below CPU_SETSIZE (checked), and sched_setaffinity reads exactly `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_slab_once() {
        for (first, end, parts) in [(0, 10, 1), (3, 10, 2), (1, 2, 4), (5, 5, 3), (0, 1000, 7)] {
            let r = split(first, end, parts);
            assert_eq!(r.len(), parts);
            assert_eq!(r[0].0, first);
            assert_eq!(r.last().unwrap().1, end);
            assert!(r.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 <= w[0].1));
        }
    }

    #[test]
    fn cpu_lists_parse_like_sysfs_writes_them() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert_eq!(parse_cpulist("7"), vec![7]);
        assert_eq!(parse_cpulist("3-1,x,2"), vec![2]);
    }
}

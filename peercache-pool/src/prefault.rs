//! Faulting a fresh mapping in before it serves, so no page fault lands on the hot path: the
//! per-range fault itself, and a parallel pass over a whole range on several threads with
//! progress in the log for a large one, so a long fault is never silent. A leaf: the mapping
//! and the pool's background warming call into it, never the other way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Populated per call; also how often progress can be checked.
const CHUNK: usize = 128 << 20;
/// Ranges from this size on log their pre-fault at INFO.
const LOUD_FROM: usize = 1 << 30;
/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);
/// At most this many faulting threads when the count is derived.
const MAX_AUTO_THREADS: usize = 16;

pub(crate) fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Faulting threads when none were configured: every core the process may run on, at most
/// 16 (faulting is bound by memory bandwidth long before that).
pub(crate) fn auto_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, MAX_AUTO_THREADS)
}

/// Asks for transparent huge pages; advice given before the first fault is what makes the
/// kernel back the range with them.
pub(crate) fn advise_huge(ptr: *mut u8, len: usize) {
    // SAFETY: advice on a range of a mapping the caller owns; failure is harmless.
    unsafe {
        libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
    }
}

/// Write-faults every page of `[ptr, ptr + len)`: `MADV_POPULATE_WRITE` per chunk where the
/// kernel has it (5.14+), a write per 4 KiB page elsewhere.
///
/// The caller owns the range: a writable mapping, nothing else writing it yet.
pub(crate) fn fault(ptr: *mut u8, len: usize) {
    let mut populate = true;
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off);
        // SAFETY: `off < len`, so the chunk starts inside the range and `n` keeps it inside.
        let chunk = unsafe { ptr.add(off) };
        if populate {
            // SAFETY: populating a range of the caller's writable mapping.
            populate = unsafe { libc::madvise(chunk.cast(), n, libc::MADV_POPULATE_WRITE) } == 0;
        }
        if !populate {
            touch(chunk, n);
        }
        off += n;
    }
}

/// A base pointer that may cross to a faulting thread: the scoped threads that use it end before
/// the mapping it points into is unmapped.
#[derive(Clone, Copy)]
struct Base(*mut u8);
// SAFETY: the pointer is only offset and handed to `fault` on ranges no one else touches yet;
// the owner of the mapping keeps it alive until every thread holding a copy has ended.
unsafe impl Send for Base {}
// SAFETY: as above; shared references only copy the pointer out.
unsafe impl Sync for Base {}

impl Base {
    /// The address `off` bytes in.
    ///
    /// # Safety
    /// `off` must lie inside the mapping.
    unsafe fn at(&self, off: usize) -> *mut u8 {
        // SAFETY: the caller keeps `off` inside the mapping.
        unsafe { self.0.add(off) }
    }
}

/// Advises huge pages, then faults `[ptr, ptr + len)` on `threads` threads (chunks claimed
/// from a shared counter), logging progress for a large range. Returns when every page is in.
pub(crate) fn prefault(ptr: *mut u8, len: usize, threads: usize) {
    advise_huge(ptr, len);
    let loud = len >= LOUD_FROM;
    let threads = threads.clamp(1, len.div_ceil(CHUNK).max(1));
    if loud {
        tracing::info!(
            threads,
            "pre-faulting {:.1} GiB of pool memory",
            gib(len as u64)
        );
    }
    let t0 = Instant::now();
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let base = Base(ptr);
    let work = || {
        let mut last = Instant::now();
        loop {
            let off = next.fetch_add(CHUNK, Ordering::Relaxed);
            if off >= len {
                break;
            }
            let n = CHUNK.min(len - off);
            // SAFETY: `off < len`: the chunk lies inside the caller's range; each chunk is
            // claimed by exactly one thread.
            fault(unsafe { base.at(off) }, n);
            let total = done.fetch_add(n, Ordering::Relaxed) + n;
            if loud && total < len && last.elapsed() >= PROGRESS_EVERY {
                tracing::info!(
                    "pre-faulted {:.1} of {:.1} GiB of pool memory",
                    gib(total as u64),
                    gib(len as u64)
                );
                last = Instant::now();
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    if loud {
        tracing::info!(
            "pool memory pre-faulted: {:.1} GiB in {:.1} s",
            gib(len as u64),
            t0.elapsed().as_secs_f64()
        );
    }
}

/// One write per 4 KiB page of `[ptr, ptr + len)`.
fn touch(ptr: *mut u8, len: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: `off < len`, inside the range the caller owns.
        unsafe { std::ptr::write_volatile(ptr.add(off), 0) };
        off += 4096;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_resident_and_zero_afterwards() {
        let len = CHUNK + 3 * 4096; // more than one chunk, not a whole number of them
        // SAFETY: a fresh anonymous private mapping, checked below and unmapped at the end.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        prefault(p.cast(), len, 2);
        let pages = len / 4096;
        let mut resident = vec![0u8; pages];
        // SAFETY: `resident` holds one byte per page of the mapping.
        let rc = unsafe { libc::mincore(p, len, resident.as_mut_ptr()) };
        assert_eq!(rc, 0);
        assert!(resident.iter().all(|r| r & 1 == 1), "every page resident");
        // SAFETY: the mapping is `len` bytes long and readable.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
        assert!(bytes.iter().step_by(4093).all(|b| *b == 0));
        // SAFETY: unmapping the mapping made above, once.
        unsafe { libc::munmap(p, len) };
    }
}

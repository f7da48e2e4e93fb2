//! Faulting a fresh mapping in before it serves, so no page fault lands on the hot path — with
//! progress in the log for a large pool (about a second per GiB on a small VM), so a long start
//! is never silent.

use std::time::{Duration, Instant};

/// Populated per call; also how often progress can be checked.
const CHUNK: usize = 128 << 20;
/// Pools from this size on log their pre-fault at INFO.
const LOUD_FROM: usize = 1 << 30;
/// Progress lines at most this often.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Asks for transparent huge pages first (advice given before the first fault is what makes the
/// kernel back the range with them), then write-faults every page: `MADV_POPULATE_WRITE` per
/// chunk where the kernel has it (5.14+), a write per 4 KiB page elsewhere.
pub(crate) fn prefault(ptr: *mut u8, len: usize) {
    // SAFETY: advice on a range the caller just mapped; failure is harmless.
    unsafe {
        libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
    }
    let loud = len >= LOUD_FROM;
    if loud {
        tracing::info!(
            "pre-faulting {:.1} GiB of pool memory (about a second per GiB)",
            gib(len)
        );
    }
    let t0 = Instant::now();
    let mut last = t0;
    let mut populate = true;
    let mut off = 0;
    while off < len {
        let n = CHUNK.min(len - off);
        // SAFETY: `off < len`, so the chunk starts inside the mapping and `n` keeps it inside.
        let chunk = unsafe { ptr.add(off) };
        if populate {
            // SAFETY: populating a range of the caller's fresh, writable mapping.
            populate = unsafe { libc::madvise(chunk.cast(), n, libc::MADV_POPULATE_WRITE) } == 0;
        }
        if !populate {
            touch(chunk, n);
        }
        off += n;
        if loud && off < len && last.elapsed() >= PROGRESS_EVERY {
            tracing::info!(
                "pre-faulted {:.1} of {:.1} GiB of pool memory",
                gib(off),
                gib(len)
            );
            last = Instant::now();
        }
    }
    if loud {
        tracing::info!(
            "pool memory pre-faulted: {:.1} GiB in {:.1} s",
            gib(len),
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
        prefault(p.cast(), len);
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

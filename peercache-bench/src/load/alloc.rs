//! A counting global allocator: the bench reports heap allocations per batch, and the bytes
//! a structure holds (live bytes before and after building it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counts every allocation, then defers to the system allocator.
#[derive(Debug)]
pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed (requested sizes, as the program sees them), while
/// [`TRACK`] is on.
static LIVE: AtomicU64 = AtomicU64::new(0);
/// Off unless a bench asks: one more shared counter on every allocation and free measurably
/// slows the many-thread rows of the main job.
static TRACK: AtomicBool = AtomicBool::new(false);

// SAFETY: defers every call to `System`, which upholds the `GlobalAlloc` contract; the counters
// are relaxed atomics and do not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        if TRACK.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if TRACK.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        if TRACK.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && TRACK.load(Ordering::Relaxed) {
            // On failure the old block stays allocated, at its old size.
            LIVE.fetch_add(new_size as u64, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        }
        p
    }
}

/// Allocations so far in this process.
pub fn count() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

/// Starts counting live bytes (for the rest of the process). A block allocated before and
/// freed after subtracts bytes it never added, so measure a structure built after this call.
pub fn track_bytes() {
    TRACK.store(true, Ordering::Relaxed);
}

/// Bytes allocated and not yet freed since [`track_bytes`], process-wide (sizes as requested;
/// the allocator's own rounding and headers are not included). Wrapping: subtract two readings.
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

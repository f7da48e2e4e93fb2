//! A counting global allocator: the bench reports heap allocations per batch, and the bytes
//! a structure holds (live bytes before and after building it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts every allocation, then defers to the system allocator.
#[derive(Debug)]
pub struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed (requested sizes, as the program sees them).
static LIVE: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers every call to `System`, which upholds the `GlobalAlloc` contract; the counters
// are relaxed atomics and do not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
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

/// Bytes allocated and not yet freed, process-wide (sizes as requested; the allocator's own
/// rounding and headers are not included). Wrapping: subtract two readings.
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

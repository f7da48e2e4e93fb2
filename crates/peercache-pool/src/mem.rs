//! Where the pool's memory comes from: one contiguous, pre-faulted mapping.

use crate::PoolError;

/// A source of pool memory. The default is [`MmapAlloc`]; a pinned or NUMA-placed allocator
/// can implement this trait later.
pub trait RegionAlloc: Send + Sync {
    /// Maps `len` bytes, every page already faulted in.
    fn map(&self, len: usize) -> Result<Mapping, PoolError>;
}

/// An anonymous private mapping; tries explicit huge pages when asked, falls back to normal
/// pages (with transparent-huge-page advice), and pre-faults with `MAP_POPULATE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapAlloc {
    /// Try `MAP_HUGETLB` first.
    pub hugepages: bool,
}

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    huge: bool,
}

// SAFETY: the mapping is plain memory owned by this value; synchronisation of its contents is
// the pool's job (slot headers, the pool lock).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Base address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty mapping (never produced).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether explicit huge pages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap and are unmapped exactly once.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

fn mmap(len: usize, extra: libc::c_int) -> Option<*mut u8> {
    // SAFETY: an anonymous private mapping with no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | extra,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as *mut u8)
}

impl RegionAlloc for MmapAlloc {
    fn map(&self, len: usize) -> Result<Mapping, PoolError> {
        if len == 0 {
            return Err(PoolError::Geometry("pool size is zero".into()));
        }
        if self.hugepages {
            let huge_len = len.div_ceil(2 << 20) * (2 << 20);
            if let Some(ptr) = mmap(huge_len, libc::MAP_HUGETLB) {
                return Ok(Mapping {
                    ptr,
                    len: huge_len,
                    huge: true,
                });
            }
            tracing::info!(len, "no explicit huge pages available; using normal pages");
        }
        let ptr = mmap(len, 0).ok_or_else(|| PoolError::Map {
            len,
            detail: std::io::Error::last_os_error().to_string(),
        })?;
        // SAFETY: advice on a range we just mapped; failure is harmless.
        unsafe {
            libc::madvise(ptr as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        // MAP_POPULATE is best effort; touch one byte per page so no fault lands on the hot path.
        let page = 4096;
        let mut off = 0;
        while off < len {
            // SAFETY: `off < len`, inside the mapping.
            unsafe { std::ptr::write_volatile(ptr.add(off), 0) };
            off += page;
        }
        Ok(Mapping {
            ptr,
            len,
            huge: false,
        })
    }
}

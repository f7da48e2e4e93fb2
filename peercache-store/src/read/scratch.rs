//! Caller memory by address ([`RawSeg`]) and the registered scratch memory one read batch
//! uses for page headers and staging ([`Scratch`]).

use parking_lot::Mutex;
use peercache_pool::HEADER_LEN;
use peercache_transport::{Access, RegionHandle, RegionKey, Transport};

use crate::StoreError;

/// One segment by address, for callers that hold raw memory (the Python facade).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawSeg {
    /// Start address.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
}

impl RawSeg {
    /// The segments of exclusively borrowed buffers, one each (for the safe read entry points,
    /// which keep the borrow for the whole call).
    pub(crate) fn of_mut(bufs: &mut [&mut [u8]]) -> Vec<RawSeg> {
        bufs.iter_mut()
            .map(|s| RawSeg {
                ptr: s.as_mut_ptr(),
                len: s.len(),
            })
            .collect()
    }
}

// SAFETY: a RawSeg is only an address and a length; the unsafe entry points that take them
// state the validity requirements.
unsafe impl Send for RawSeg {}
// SAFETY: as above.
unsafe impl Sync for RawSeg {}

/// Registered scratch memory of one batch: 64-byte header slots, then staging space for
/// destinations outside any registered host buffer.
pub(crate) struct Scratch {
    pub(crate) handle: RegionHandle,
    pub(crate) buf: Vec<u8>,
    pub(crate) headers: usize,
}

impl Scratch {
    pub(crate) fn new(
        transport: &Transport,
        headers: usize,
        staging: usize,
    ) -> Result<Scratch, StoreError> {
        let len = headers * HEADER_LEN + staging;
        let mut buf = vec![0u8; len.max(HEADER_LEN)];
        for i in (0..buf.len()).step_by(4096) {
            // Fault every page in now rather than on the read path.
            // SAFETY: `i` is in bounds.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 0) };
        }
        // SAFETY: `buf` lives in the same struct as the handle and is never reallocated; the
        // handle is dropped first (field order).
        let handle = unsafe { transport.register(buf.as_mut_ptr(), buf.len(), Access::LocalOnly) }?;
        Ok(Scratch {
            handle,
            buf,
            headers,
        })
    }

    pub(crate) fn fits(&self, headers: usize, staging: usize) -> bool {
        self.headers >= headers && self.buf.len() >= self.headers * HEADER_LEN + staging
    }

    pub(crate) fn header_addr(&self, i: usize) -> u64 {
        self.buf.as_ptr() as u64 + (i * HEADER_LEN) as u64
    }

    pub(crate) fn header(&self, i: usize) -> &[u8; HEADER_LEN] {
        self.buf[i * HEADER_LEN..(i + 1) * HEADER_LEN]
            .try_into()
            .expect("64 bytes")
    }

    /// The registered staging bytes at `off..off + len` (write sources for centralized writes).
    pub(crate) fn staging_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        let at = self.headers * HEADER_LEN + off;
        &mut self.buf[at..at + len]
    }

    /// The region key of the scratch buffer.
    pub(crate) fn key(&self) -> peercache_transport::RegionKey {
        self.handle.key()
    }

    pub(crate) fn staging_addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + (self.headers * HEADER_LEN + off) as u64
    }
}

/// The registered scratch buffers read batches check out and give back (registration is
/// costly, so buffers are kept between batches).
pub(crate) struct ScratchPool {
    free: Mutex<Vec<Scratch>>,
}

impl ScratchPool {
    /// No buffer yet.
    pub(crate) fn new() -> Self {
        ScratchPool {
            free: Mutex::new(Vec::new()),
        }
    }

    /// A buffer with room for `headers` header slots and `staging` bytes: a kept one that
    /// fits, else a new one registered with `transport`.
    pub(crate) fn checkout(
        &self,
        transport: &Transport,
        headers: usize,
        staging: usize,
    ) -> Result<Scratch, StoreError> {
        let mut free = self.free.lock();
        if let Some(pos) = free.iter().position(|s| s.fits(headers, staging)) {
            return Ok(free.swap_remove(pos));
        }
        drop(free);
        Scratch::new(transport, headers.max(64), staging.max(1 << 20))
    }

    /// Keeps `s` for a later batch.
    pub(crate) fn give_back(&self, s: Scratch) {
        self.free.lock().push(s);
    }

    /// Drops every kept buffer (their registrations first).
    pub(crate) fn clear(&self) {
        self.free.lock().clear();
    }
}

/// The region of the registered buffer among `bufs` that holds all of `[ptr, ptr + len)`.
pub(crate) fn host_region(bufs: &[RegionHandle], ptr: u64, len: u64) -> Option<RegionKey> {
    bufs.iter().find(|h| h.contains(ptr, len)).map(|h| h.key())
}

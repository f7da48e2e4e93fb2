//! Reading the pool: lookups, leases for local readers (eviction skips a leased page until its
//! [`Leases`] guard drops) and the two copies out — under a lease, and unleased the way a
//! remote reader sees a slot (header and payload verified after the copy).

use std::sync::atomic::{Ordering, fence};

use peercache_wire::PageKey;

use super::{PageLocation, Pool};
use crate::header::{self, HEADER_LEN};
use crate::state::{SlotRef, SlotState};
use crate::{PoolError, VerifyError};

impl Pool {
    /// Looks up resident pages (`None` = absent or still being written); refreshes hits.
    pub fn lookup_batch(&self, keys: &[PageKey], out: &mut Vec<Option<PageLocation>>) {
        out.clear();
        let mut st = self.state.lock();
        for k in keys {
            match st.index.get(&k.0).copied() {
                Some(r) if st.meta(r).state == SlotState::Live => {
                    st.refresh(r);
                    out.push(Some(self.location(&st, r)));
                }
                _ => out.push(None),
            }
        }
    }

    /// True if `key` is resident.
    pub fn contains(&self, key: PageKey) -> bool {
        let st = self.state.lock();
        st.index
            .get(&key.0)
            .is_some_and(|&r| st.meta(r).state == SlotState::Live)
    }

    /// The generation of a resident page (`None`: absent or being written).
    pub fn generation_of(&self, key: PageKey) -> Option<u64> {
        let st = self.state.lock();
        st.index
            .get(&key.0)
            .filter(|&&r| st.meta(r).state == SlotState::Live)
            .map(|&r| st.meta(r).generation)
    }

    /// Leases resident pages for local reading; eviction skips leased pages until the returned
    /// guard drops (which releases every lease under one lock).
    pub fn lease_batch(&self, keys: &[PageKey]) -> Leases<'_> {
        let mut st = self.state.lock();
        let mut held = Vec::with_capacity(keys.len());
        for k in keys {
            match st.index.get(&k.0).copied() {
                Some(r) if st.meta(r).state == SlotState::Live => {
                    st.meta_mut(r).leases += 1;
                    st.refresh(r);
                    held.push(Some((r, self.location(&st, r))));
                }
                _ => held.push(None),
            }
        }
        Leases { pool: self, held }
    }

    /// Copies a leased page into `dst` segments, re-checking the seqlock.
    pub fn read_leased(
        &self,
        leases: &Leases<'_>,
        i: usize,
        key: PageKey,
        dst: &mut [&mut [u8]],
    ) -> Result<(), PoolError> {
        let Some(Some((_, loc))) = leases.held.get(i) else {
            return Err(PoolError::NotFound(key));
        };
        let total: u64 = dst.iter().map(|d| d.len() as u64).sum();
        if total != loc.len as u64 {
            return Err(PoolError::LengthMismatch {
                key,
                dst: total,
                len: loc.len as u64,
            });
        }
        let seq = self.seq(loc.offset);
        let s1 = seq.load(Ordering::Acquire);
        let mut src = self.payload_ptr(loc.offset) as *const u8;
        for d in dst.iter_mut() {
            // SAFETY: the page is leased (no eviction, no rewrite) and `total == len`, so every
            // copy stays inside the slot payload.
            unsafe {
                std::ptr::copy_nonoverlapping(src, d.as_mut_ptr(), d.len());
                src = src.add(d.len());
            }
        }
        fence(Ordering::Acquire);
        if s1 & 1 == 1 || seq.load(Ordering::Relaxed) != s1 {
            self.reject(VerifyError::Torn);
            return Err(PoolError::Verify {
                key,
                reason: VerifyError::Torn,
            });
        }
        Ok(())
    }

    /// Copies a page without a lease, the way a remote reader does (header + payload in one
    /// sweep, racing writers), and verifies it. `hdr` receives the header bytes.
    pub fn read_unleased(
        &self,
        loc: &PageLocation,
        key: PageKey,
        dst: &mut [u8],
    ) -> Result<(), PoolError> {
        if dst.len() != loc.len as usize {
            return Err(PoolError::LengthMismatch {
                key,
                dst: dst.len() as u64,
                len: loc.len as u64,
            });
        }
        if loc.offset + HEADER_LEN as u64 + loc.len as u64 > self.map.len() as u64 {
            return Err(PoolError::NotFound(key));
        }
        let seq = self.seq(loc.offset);
        let s1 = seq.load(Ordering::Acquire);
        let mut hdr = [0u8; HEADER_LEN];
        // SAFETY: the range was bounds-checked against the mapping above. The slot may be
        // rewritten concurrently; the copy is treated as untrusted bytes and verified below
        // (seqlock + generation + key + checksum), exactly as a remote one-sided read is.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.ptr().add(loc.offset as usize),
                hdr.as_mut_ptr(),
                HEADER_LEN,
            );
            std::ptr::copy_nonoverlapping(
                self.payload_ptr(loc.offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        fence(Ordering::Acquire);
        let s2 = seq.load(Ordering::Relaxed);
        let res = if s1 != s2 || s1 & 1 == 1 {
            Err(VerifyError::Torn)
        } else {
            header::verify(&hdr, dst, &loc.expect(key)).map(|_| ())
        };
        res.map_err(|reason| {
            self.reject(reason);
            PoolError::Verify { key, reason }
        })
    }

    fn reject(&self, reason: VerifyError) {
        self.metrics.verify_rejects[reason.kind()].add(1);
    }
}

/// Leases on resident pages; dropping releases them all under one lock.
pub struct Leases<'a> {
    pool: &'a Pool,
    held: Vec<Option<(SlotRef, PageLocation)>>,
}

impl Leases<'_> {
    /// The location of leased page `i` (`None` if it was not resident).
    pub fn location(&self, i: usize) -> Option<PageLocation> {
        self.held.get(i).and_then(|h| h.map(|(_, l)| l))
    }
    /// Number of entries (one per key asked for).
    pub fn len(&self) -> usize {
        self.held.len()
    }
    /// True if no key was asked for.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

impl Drop for Leases<'_> {
    fn drop(&mut self) {
        if self.held.iter().all(|h| h.is_none()) {
            return;
        }
        let mut st = self.pool.state.lock();
        for (r, _) in self.held.iter().flatten() {
            let m = st.meta_mut(*r);
            m.leases -= 1;
        }
    }
}

//! Writing pages into the pool: [`Pool::publish_batch`] (gathered from the caller's segments)
//! and the reserve → commit / abort protocol for payloads a peer writes in place
//! ([`Pool::reserve_batch`]). Every batch takes the lock once to reserve and once to commit;
//! the copies run without it, on slots invisible to readers and evictors until committed.

use std::sync::atomic::{Ordering, fence};

use peercache_wire::{Layout, PageKey};

use super::{Evicted, PageLocation, PageWrite, Pool, Published, ReplClass, Reservation, Reserved};
use crate::PoolError;
use crate::header::{self, HEADER_LEN, SlotHeader};
use crate::state::{SlotRef, SlotState, State};

/// Scratch a caller reuses across batches so publishing allocates nothing per page.
#[derive(Debug, Default)]
pub struct PublishScratch {
    reserved: Vec<Option<SlotRef>>,
    offsets: Vec<u64>,
    checksums: Vec<u64>,
}

impl Pool {
    fn check_write(&self, w: &PageWrite<'_>) -> Result<(u32, u32), PoolError> {
        let len: u64 = w.segments.iter().map(|s| s.len() as u64).sum();
        self.check_lengths(w.key, len, w.valid_len)
    }

    fn check_lengths(
        &self,
        key: PageKey,
        len: u64,
        valid_len: Option<u32>,
    ) -> Result<(u32, u32), PoolError> {
        if len == 0 {
            return Err(PoolError::EmptyPage(key));
        }
        if len > self.max_payload {
            return Err(PoolError::TooLarge {
                key,
                len,
                max: self.max_payload,
            });
        }
        let valid = valid_len.unwrap_or(len as u32);
        if valid > len as u32 {
            return Err(PoolError::BadValidLength {
                key,
                valid,
                len: len as u32,
            });
        }
        Ok((len as u32, valid))
    }

    /// Publishes a batch of pages: one lock to reserve slots, copies without the lock, one lock
    /// to commit. Pages evicted to make room are appended to `evicted`.
    pub fn publish_batch(
        &self,
        pages: &[PageWrite<'_>],
        class: ReplClass,
        scratch: &mut PublishScratch,
        out: &mut Vec<Published>,
        evicted: &mut Vec<Evicted>,
    ) {
        out.clear();
        scratch.reserved.clear();
        scratch.offsets.clear();
        scratch.checksums.clear();
        {
            let mut st = self.lock_for_write();
            for w in pages {
                let (len, valid) = match self.check_write(w) {
                    Ok(v) => v,
                    Err(e) => {
                        metrics::counter!(crate::metrics::REJECTS_TOTAL, "reason" => "bad_page")
                            .increment(1);
                        out.push(Published::Failed(e));
                        scratch.reserved.push(None);
                        scratch.offsets.push(0);
                        continue;
                    }
                };
                if let Some(&r) = st.index.get(&w.key.0) {
                    let m = *st.meta(r);
                    // The same key in another layout (the caller's layout changed, or a
                    // disk-tier page from a previous deployment): the new page replaces it.
                    let replaced =
                        m.layout != w.layout && st.remove(w.key, Some(m.generation)) && {
                            evicted.push(Evicted {
                                key: w.key,
                                generation: m.generation,
                                class: m.repl,
                            });
                            true
                        };
                    if !replaced {
                        st.refresh(r);
                        let loc = self.location(&st, r);
                        out.push(Published::Duplicate(loc));
                        scratch.reserved.push(None);
                        scratch.offsets.push(0);
                        self.metrics.duplicates.increment(1);
                        continue;
                    }
                }
                match st.reserve(w.key, len, valid, w.layout, class, evicted) {
                    Ok(r) => {
                        let off = st.offset(r);
                        self.mark_writing(off);
                        scratch.reserved.push(Some(r));
                        scratch.offsets.push(off);
                        out.push(Published::New(PageLocation {
                            offset: off,
                            len,
                            valid_len: valid,
                            generation: st.meta(r).generation,
                            checksum: 0,
                            layout: w.layout,
                            class,
                        }));
                    }
                    Err(e) => {
                        metrics::counter!(crate::metrics::REJECTS_TOTAL, "reason" => "full")
                            .increment(1);
                        out.push(Published::Failed(e));
                        scratch.reserved.push(None);
                        scratch.offsets.push(0);
                    }
                }
            }
        }
        // Copy payloads outside the lock; reserved slots are invisible to readers and evictors.
        for (i, w) in pages.iter().enumerate() {
            if scratch.reserved[i].is_none() {
                scratch.checksums.push(0);
                continue;
            }
            let dst = self.payload_ptr(scratch.offsets[i]);
            // SAFETY: the slot is reserved for this call (state Writing: no other writer, no
            // eviction) and the page fits its class payload.
            let sum = unsafe { crate::fused::copy_and_checksum(w.segments, dst) };
            scratch.checksums.push(sum);
        }
        let mut st = self.state.lock();
        let mut new = 0u64;
        for (i, w) in pages.iter().enumerate() {
            let Some(r) = scratch.reserved[i] else {
                continue;
            };
            self.commit_slot(&mut st, r, scratch.offsets[i], w.key, scratch.checksums[i]);
            if let Published::New(loc) = &mut out[i] {
                loc.checksum = scratch.checksums[i];
            }
            new += 1;
        }
        self.metrics.published.increment(new);
        self.publish_gauges(&st);
    }

    /// Odd seq: readers that race the write about to happen reject what they copy.
    fn mark_writing(&self, off: u64) {
        let seq = self.seq(off);
        let s = seq.load(Ordering::Relaxed);
        seq.store(
            (s | 1).wrapping_add(if s & 1 == 1 { 2 } else { 0 }),
            Ordering::Relaxed,
        );
        fence(Ordering::Release);
    }

    /// Writes the header of a written slot, makes its seq even and the page live.
    fn commit_slot(&self, st: &mut State, r: SlotRef, off: u64, key: PageKey, checksum: u64) {
        let m = *st.meta(r);
        let seq = self.seq(off);
        let odd = seq.load(Ordering::Relaxed);
        let hdr = SlotHeader {
            seq: odd,
            flags: m.repl as u16,
            generation: m.generation,
            key,
            payload_len: m.len,
            valid_len: m.valid_len,
            checksum,
            layout: m.layout,
        };
        self.write_header_fields(off, &hdr);
        fence(Ordering::Release);
        seq.store(odd.wrapping_add(1), Ordering::Release);
        st.commit(r, checksum);
    }

    /// Reserves slots whose payload will be written by someone else (a peer's one-sided
    /// write into a storage server). Reserved slots are invisible to readers and evictors until
    /// [`Pool::commit_reserved`] or [`Pool::abort_reserved`]. Pages already resident come back
    /// as [`Reserved::Duplicate`].
    pub fn reserve_batch(
        &self,
        pages: &[(PageKey, u32, Option<u32>)],
        layout: Layout,
        class: ReplClass,
        out: &mut Vec<Reserved>,
        evicted: &mut Vec<Evicted>,
    ) {
        out.clear();
        let mut st = self.lock_for_write();
        for &(key, len, valid) in pages {
            let (len, valid) = match self.check_lengths(key, len as u64, valid) {
                Ok(v) => v,
                Err(e) => {
                    out.push(Reserved::Failed(e));
                    continue;
                }
            };
            if let Some(&r) = st.index.get(&key.0) {
                if st.meta(r).state != SlotState::Live {
                    out.push(Reserved::Failed(PoolError::Busy(key)));
                    continue;
                }
                st.refresh(r);
                out.push(Reserved::Duplicate(self.location(&st, r)));
                continue;
            }
            match st.reserve(key, len, valid, layout, class, evicted) {
                Ok(r) => {
                    let offset = st.offset(r);
                    self.mark_writing(offset);
                    out.push(Reserved::Slot(Reservation {
                        key,
                        offset,
                        payload_addr: self.map.ptr() as u64 + offset + HEADER_LEN as u64,
                        len,
                        generation: st.meta(r).generation,
                        slot: r,
                    }));
                }
                Err(e) => out.push(Reserved::Failed(e)),
            }
        }
        self.publish_gauges(&st);
    }

    /// Makes reserved slots live after their payload was written: checksums the payload in
    /// place, writes the header, publishes. A reservation that was aborted (or reused) since
    /// gives `None`.
    pub fn commit_reserved(&self, res: &[Reservation], out: &mut Vec<Option<PageLocation>>) {
        self.commit_checked(res, None, out);
    }

    /// [`Pool::commit_reserved`], committing only slots whose payload checksum equals the
    /// writer's (`expected[i]` for `res[i]`); a slot that differs — a torn or stray remote
    /// write — is released instead and gives `None`.
    pub fn commit_reserved_verified(
        &self,
        res: &[Reservation],
        expected: &[u64],
        out: &mut Vec<Option<PageLocation>>,
    ) {
        self.commit_checked(res, Some(expected), out);
    }

    fn commit_checked(
        &self,
        res: &[Reservation],
        expected: Option<&[u64]>,
        out: &mut Vec<Option<PageLocation>>,
    ) {
        out.clear();
        let sums: Vec<u64> = res
            .iter()
            .map(|r| {
                // SAFETY: the slot's payload lies inside the mapping; it is reserved, so no
                // local writer or evictor touches it (a racing remote writer only makes the
                // checksum disagree with what readers later see, which they then reject).
                header::checksum(unsafe {
                    std::slice::from_raw_parts(self.payload_ptr(r.offset), r.len as usize)
                })
            })
            .collect();
        let mut st = self.state.lock();
        let mut new = 0;
        for (i, (r, sum)) in res.iter().zip(sums).enumerate() {
            let m = *st.meta(r.slot);
            if m.state != SlotState::Writing || m.generation != r.generation || m.key != r.key {
                out.push(None);
                continue;
            }
            if expected.is_some_and(|e| e.get(i) != Some(&sum)) {
                st.abort(r.slot);
                out.push(None);
                continue;
            }
            self.commit_slot(&mut st, r.slot, r.offset, r.key, sum);
            out.push(Some(self.location(&st, r.slot)));
            new += 1;
        }
        self.metrics.published.increment(new);
        self.publish_gauges(&st);
    }

    /// Releases reserved slots that will not be committed (the writer failed or timed out).
    /// Returns how many were released.
    pub fn abort_reserved(&self, res: &[Reservation]) -> usize {
        let mut st = self.state.lock();
        let mut n = 0;
        for r in res {
            let m = *st.meta(r.slot);
            if m.state == SlotState::Writing && m.generation == r.generation && m.key == r.key {
                st.abort(r.slot);
                n += 1;
            }
        }
        self.publish_gauges(&st);
        n
    }

    /// Writes every header field except seq (bytes 8..64).
    fn write_header_fields(&self, offset: u64, h: &SlotHeader) {
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        // SAFETY: the slot belongs to this writer (Writing state); bytes 8..64 of its header
        // are inside the mapping and never accessed atomically.
        unsafe {
            std::ptr::copy_nonoverlapping(
                b.as_ptr().add(8),
                self.map.ptr().add(offset as usize + 8),
                HEADER_LEN - 8,
            );
        }
    }
}

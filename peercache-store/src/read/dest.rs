//! [`PageDest`]: the caller's memory one read batch lands in, checked once at the API.
//!
//! The public raw entry points (`batch_get_raw`, the client API's reply buffer) take segments by
//! address. They build a `PageDest` once — the one `unsafe` step, where the caller's promise
//! (valid, unaliased memory for the call) is taken over — and everything below reads and writes
//! the pages through it safely: shared views through `&self`, writable ones through `&mut self`,
//! so the borrow checker keeps the two apart. Only the transport, which writes to the addresses
//! itself, still needs an `unsafe` block, and that block cites this type's invariant.

use std::marker::PhantomData;

use smallvec::SmallVec;

use crate::StoreError;
use crate::read::scratch::RawSeg;

/// The segments of one read batch (page `i` has `counts[i]` of them, in order), each valid for
/// reads and writes of its length and overlapping no other, for `'a`.
pub(crate) struct PageDest<'a> {
    segs: &'a [RawSeg],
    counts: &'a [usize],
    starts: Vec<usize>,
    lens: Vec<u64>,
    /// The memory is borrowed exclusively, as if through `&'a mut [u8]`s.
    _memory: PhantomData<&'a mut [u8]>,
}

impl<'a> PageDest<'a> {
    /// Checks that `counts` fit `pages` pages and `segs` segments, and takes over the caller's
    /// memory.
    ///
    /// # Safety
    /// Every segment must be valid for reads and writes of `len` bytes, and overlap no other
    /// segment of `segs`, for `'a`; nothing else may touch that memory meanwhile.
    pub(crate) unsafe fn new(
        pages: usize,
        segs: &'a [RawSeg],
        counts: &'a [usize],
    ) -> Result<Self, StoreError> {
        check_counts(pages, segs.len(), counts)?;
        let (starts, lens) = page_spans(segs, counts);
        Ok(PageDest {
            segs,
            counts,
            starts,
            lens,
            _memory: PhantomData,
        })
    }

    /// Each page's length in bytes (over all its segments).
    pub(crate) fn lens(&self) -> &[u64] {
        &self.lens
    }

    /// Page `i`'s segments, as addresses (transport segments, region lookups).
    pub(crate) fn segs(&self, i: usize) -> &'a [RawSeg] {
        &self.segs[self.starts[i]..self.starts[i] + self.counts[i]]
    }

    /// Every segment of the batch, as addresses.
    pub(crate) fn all_segs(&self) -> &'a [RawSeg] {
        self.segs
    }

    /// Page `i`'s bytes, segment by segment.
    pub(crate) fn page(&self, i: usize) -> SmallVec<[&[u8]; 4]> {
        self.segs(i)
            .iter()
            // SAFETY: the type's invariant; `&self` keeps writable views away meanwhile.
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect()
    }

    /// Page `i`'s bytes, writable.
    pub(crate) fn page_mut(&mut self, i: usize) -> SmallVec<[&mut [u8]; 4]> {
        self.segs(i)
            .iter()
            // SAFETY: the type's invariant (segments do not overlap); `&mut self` keeps every
            // other view away meanwhile.
            .map(|s| unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) })
            .collect()
    }

    /// Pages `idx` writable all at once (each page's segments in order), for copies that run
    /// side by side; `None` unless `idx` is strictly increasing and in range, so no page is
    /// handed out twice.
    pub(crate) fn pages_mut(&mut self, idx: &[usize]) -> Option<Vec<SmallVec<[&mut [u8]; 4]>>> {
        let increasing = idx.windows(2).all(|w| w[0] < w[1]);
        if !increasing || idx.last().is_some_and(|&i| i >= self.counts.len()) {
            return None;
        }
        Some(
            idx.iter()
                .map(|&i| {
                    self.segs(i)
                        .iter()
                        // SAFETY: the type's invariant (segments do not overlap) and distinct
                        // pages (checked above); `&mut self` keeps every other view away for
                        // as long as these live.
                        .map(|s| unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) })
                        .collect()
                })
                .collect(),
        )
    }

    /// The bytes of pages `idx`, all at once (segments of each page in order, pages in the
    /// order of `idx`).
    pub(crate) fn views(&self, idx: &[usize]) -> Vec<&[u8]> {
        idx.iter()
            .flat_map(|&i| self.segs(i).iter())
            // SAFETY: as in `page`.
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect()
    }

    /// Copies `src` (the page's bytes, at least its length) into page `i`'s segments.
    pub(crate) fn fill(&mut self, i: usize, src: &[u8]) {
        let mut at = 0;
        for d in self.page_mut(i) {
            d.copy_from_slice(&src[at..at + d.len()]);
            at += d.len();
        }
    }

    /// Zeroes page `i`: a miss never leaves another key's bytes behind.
    pub(crate) fn scrub(&mut self, i: usize) {
        for d in self.page_mut(i) {
            d.fill(0);
        }
    }
}

/// Where each page's segments start in `segs` (page `i` has `counts[i]` of them) and each
/// page's length in bytes; `counts` already checked by [`check_counts`].
pub(crate) fn page_spans(segs: &[RawSeg], counts: &[usize]) -> (Vec<usize>, Vec<u64>) {
    let mut starts = Vec::with_capacity(counts.len());
    let mut lens = Vec::with_capacity(counts.len());
    let mut at = 0usize;
    for &c in counts {
        starts.push(at);
        lens.push(segs[at..at + c].iter().map(|s| s.len as u64).sum::<u64>());
        at += c;
    }
    (starts, lens)
}

/// Checks that `counts` (segments per page) fit `n` pages and `segs` segments.
pub(crate) fn check_counts(n: usize, segs: usize, counts: &[usize]) -> Result<(), StoreError> {
    if counts.len() != n {
        return Err(StoreError::BadRequest(format!(
            "{} segment counts for {n} keys",
            counts.len()
        )));
    }
    let total: usize = counts.iter().sum();
    if total != segs {
        return Err(StoreError::BadRequest(format!(
            "segment counts add up to {total}, {segs} segments given"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_must_match_the_pages_and_segments() {
        let mut a = [0u8; 8];
        let raw = [RawSeg {
            ptr: a.as_mut_ptr(),
            len: 8,
        }];
        // SAFETY: `a` is borrowed for the test and only reached through `raw`.
        assert!(unsafe { PageDest::new(2, &raw, &[1]) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { PageDest::new(1, &raw, &[2]) }.is_err());
        // SAFETY: as above.
        let d = unsafe { PageDest::new(1, &raw, &[1]) }.unwrap();
        assert_eq!(d.lens(), &[8]);
    }

    #[test]
    fn pages_read_write_fill_and_scrub_through_their_segments() {
        let mut buf = [0u8; 12];
        let raw: Vec<RawSeg> = buf
            .chunks_exact_mut(4)
            .map(|s| RawSeg {
                ptr: s.as_mut_ptr(),
                len: s.len(),
            })
            .collect();
        // SAFETY: three distinct chunks of `buf`, reached only through `d` until it is dropped.
        let mut d = unsafe { PageDest::new(3, &raw, &[1, 1, 1]) }.unwrap();
        assert_eq!(d.lens(), &[4, 4, 4]);
        d.fill(1, b"abcd");
        assert_eq!(d.page(1).concat(), b"abcd");
        assert_eq!(d.views(&[1, 0]).concat(), b"abcd\0\0\0\0");
        d.scrub(1);
        assert_eq!(d.page(1).concat(), [0u8; 4]);
        d.fill(2, b"wxyz");
        drop(d);
        assert_eq!(&buf[8..], b"wxyz");
    }
}

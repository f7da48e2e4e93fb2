//! [`Pool`]: the published host-memory pool.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use parking_lot::Mutex;
use peercache_wire::{Layout, PageKey};

use crate::header::{self, Expect, HEADER_LEN, SlotHeader};
use crate::mem::{Mapping, MmapAlloc, RegionAlloc};
use crate::state::{SlotRef, SlotState, State};
use crate::warm::Warmer;
use crate::{PoolError, VerifyError};

/// Replacement class of a resident page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplClass {
    /// Published locally or promoted from disk: evicted last.
    Retained = 0,
    /// A copy fetched from a peer, or demoted by the "≥3 live owners" hint: evicted first.
    Reclaimable = 1,
}

/// Pool geometry.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Bytes of pool memory.
    pub size: usize,
    /// Slab size (0 = derive: size / 64, clamped to 2–64 MiB). The largest page is one slab
    /// minus the header.
    pub slab_bytes: usize,
    /// Try explicit huge pages first.
    pub hugepages: bool,
    /// Threads faulting the pool's memory in (0: one per core, at most 16).
    pub fault_threads: usize,
    /// Fault only the first slabs (about 128 MiB) before [`Pool::with_alloc`] returns and
    /// the rest on background threads, each slab used once it is in (see
    /// [`Pool::readiness`]); `false` faults the whole pool first.
    pub background: bool,
    /// Accept a pool larger than the host's `MemAvailable` (refused by default: faulting it
    /// would push the host into reclaim or the OOM killer).
    pub allow_overcommit: bool,
}

impl PoolConfig {
    /// A pool of `size` bytes with derived slabs, normal pages, warmed in the background.
    pub fn new(size: usize) -> Self {
        PoolConfig {
            size,
            slab_bytes: 0,
            hugepages: false,
            fault_threads: 0,
            background: true,
            allow_overcommit: false,
        }
    }

    fn effective_slab(&self) -> usize {
        if self.slab_bytes != 0 {
            return self.slab_bytes;
        }
        ((self.size / 64).clamp(2 << 20, 64 << 20) / 4096) * 4096
    }
}

/// Where a resident page lives inside the pool region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLocation {
    /// Offset of the slot header from the region base; the payload follows the header.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
    /// Bytes holding data (partial tail pages).
    pub valid_len: u32,
    /// Generation of the slot at publish time.
    pub generation: u64,
    /// xxh3-64 of the payload.
    pub checksum: u64,
    /// Layout fingerprint the page was published with.
    pub layout: Layout,
    /// Replacement class.
    pub class: ReplClass,
}

impl PageLocation {
    /// Offset of the payload.
    pub fn payload_offset(&self) -> u64 {
        self.offset + HEADER_LEN as u64
    }
    /// What a reader must find.
    pub fn expect(&self, key: PageKey) -> Expect {
        Expect {
            key,
            generation: self.generation,
            len: self.len,
            layout: self.layout,
        }
    }
}

/// A page that left the pool (for the caller to tell the directory, in the background).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// The page.
    pub key: PageKey,
    /// The generation that is gone.
    pub generation: u64,
    /// Its class when evicted.
    pub class: ReplClass,
}

/// Result of publishing one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Published {
    /// Written into a new slot.
    New(PageLocation),
    /// Already resident (or being written by another caller); recency refreshed.
    Duplicate(PageLocation),
    /// Refused.
    Failed(PoolError),
}

/// A slot reserved for a payload written by someone else (see [`Pool::reserve_batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The page key.
    pub key: PageKey,
    /// Offset of the slot (its header) in the region.
    pub offset: u64,
    /// Address of the payload (header + 64), where the writer puts the page.
    pub payload_addr: u64,
    /// Payload bytes.
    pub len: u32,
    /// The slot's generation.
    pub generation: u64,
    slot: SlotRef,
}

/// Result of reserving one page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// A fresh slot to write into.
    Slot(Reservation),
    /// Already resident.
    Duplicate(PageLocation),
    /// Refused (bad length, pool full).
    Failed(PoolError),
}

/// One page to publish: its key and the segments its bytes are gathered from, in order.
#[derive(Clone, Copy, Debug)]
pub struct PageWrite<'a> {
    /// Page key.
    pub key: PageKey,
    /// Source segments (K then V, or layer by layer).
    pub segments: &'a [&'a [u8]],
    /// Bytes that hold data, when the page is a partial tail (`None` = full).
    pub valid_len: Option<u32>,
    /// The page's layout fingerprint ([`Layout::NONE`] when the caller declares none).
    pub layout: Layout,
}

/// Counters of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Region bytes.
    pub capacity: u64,
    /// Payload bytes resident.
    pub bytes_used: u64,
    /// Retained pages.
    pub retained: u64,
    /// Reclaimable pages.
    pub reclaimable: u64,
    /// Retained pages evicted.
    pub evicted_retained: u64,
    /// Reclaimable pages evicted.
    pub evicted_reclaimable: u64,
    /// Slabs moved between size classes.
    pub slab_steals: u64,
    /// Reads rejected by verification.
    pub verify_rejects: u64,
}

/// Faulted before [`Pool::with_alloc`] returns when the rest warms in the background.
const SYNC_BYTES: usize = 128 << 20;

/// How much of a pool is faulted in: slabs join the pool as they are, so a pool serves (and
/// takes publishes into its ready part) before it is fully ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Bytes faulted in and usable.
    pub ready_bytes: u64,
    /// Bytes of the whole pool (whole slabs).
    pub total_bytes: u64,
}

impl Readiness {
    /// Every slab is faulted in.
    pub fn is_ready(&self) -> bool {
        self.ready_bytes >= self.total_bytes
    }
}

/// The published pool: one contiguous pre-faulted region cut into size-class slabs, every slot
/// with a verified header, two-class LRU eviction, leases for local readers.
///
/// # Example
///
/// Publish a page gathered from two segments (K and V), then read it back under a lease the
/// way a local reader does:
///
/// ```
/// use peercache_pool::{PageWrite, Pool, PoolConfig, PublishScratch, Published, ReplClass};
/// use peercache_wire::{Layout, PageKey};
///
/// let pool = Pool::new(PoolConfig::new(8 << 20))?;
/// let key = PageKey::from_key("model/layer0/page42");
/// let (k, v) = (vec![1u8; 2048], vec![2u8; 2048]);
/// let segments: [&[u8]; 2] = [&k, &v];
///
/// // Scratch and output vectors are reused across batches: no allocation per page.
/// let (mut scratch, mut out, mut evicted) = (PublishScratch::default(), Vec::new(), Vec::new());
/// pool.publish_batch(
///     &[PageWrite { key, segments: &segments, valid_len: None, layout: Layout::NONE }],
///     ReplClass::Retained,
///     &mut scratch,
///     &mut out,
///     &mut evicted,
/// );
/// assert!(matches!(out[0], Published::New(_)));
///
/// let leases = pool.lease_batch(&[key]);
/// let mut page = vec![0u8; 4096];
/// pool.read_leased(&leases, 0, key, &mut [&mut page[..]])?;
/// assert_eq!(&page[..2048], &k[..]);
/// assert_eq!(&page[2048..], &v[..]);
/// # Ok::<(), peercache_pool::PoolError>(())
/// ```
pub struct Pool {
    /// Stops the warming threads when the pool goes; they share `map`.
    warm: Option<Warmer>,
    map: std::sync::Arc<Mapping>,
    /// Bytes of the slabs (the mapping's tail beyond the last whole slab is never used).
    slab_total: u64,
    state: Mutex<State>,
    max_payload: u64,
    metrics: crate::metrics::Handles,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("base", &self.map.ptr())
            .field("len", &self.map.len())
            .finish()
    }
}

/// Scratch a caller reuses across batches so publishing allocates nothing per page.
#[derive(Debug, Default)]
pub struct PublishScratch {
    reserved: Vec<Option<SlotRef>>,
    offsets: Vec<u64>,
    checksums: Vec<u64>,
}

impl Pool {
    /// Maps and pre-faults a pool with plain mmap (huge pages if configured).
    pub fn new(cfg: PoolConfig) -> Result<Pool, PoolError> {
        Self::with_alloc(
            cfg.clone(),
            &MmapAlloc {
                hugepages: cfg.hugepages,
            },
        )
    }

    /// Maps a pool with a custom allocator.
    pub fn with_alloc(cfg: PoolConfig, alloc: &dyn RegionAlloc) -> Result<Pool, PoolError> {
        let slab = cfg.effective_slab();
        if slab < 4096 || !slab.is_multiple_of(64) {
            return Err(PoolError::Geometry(format!(
                "slab size {slab} must be a multiple of 64 and at least 4096"
            )));
        }
        if cfg.size < slab {
            return Err(PoolError::Geometry(format!(
                "pool size {} is smaller than one slab ({slab})",
                cfg.size
            )));
        }
        if !cfg.allow_overcommit {
            crate::host::check_available(cfg.size as u64)?;
        }
        let mut map = alloc.map_unfaulted(cfg.size)?;
        let slabs = (map.len() / slab) as u32;
        let threads = match cfg.fault_threads {
            0 => crate::prefault::auto_threads(),
            n => n,
        };
        // Faulted before returning: everything, or the first slabs (at least one) so the pool
        // takes publishes at once; the rest warms in the background.
        let now = if map.is_populated() || !cfg.background {
            slabs
        } else {
            (SYNC_BYTES / slab).clamp(1, slabs as usize) as u32
        };
        let metrics = crate::metrics::Handles::register(map.len() as u64);
        let warm = if now < slabs {
            crate::prefault::prefault(map.ptr(), now as usize * slab, threads);
            // Huge-page advice for the rest before any of it is touched.
            let rest = now as usize * slab;
            // SAFETY: `rest` is at most the mapping's length.
            crate::prefault::advise_huge(unsafe { map.ptr().add(rest) }, map.len() - rest);
            let mut shared = std::sync::Arc::new(map);
            let started = Warmer::start(
                shared.clone(),
                slab,
                (now, slabs),
                threads,
                now as u64 * slab as u64,
                metrics.ready_bytes.clone(),
            );
            match started {
                Ok(w) => (Some(w), shared),
                Err(e) => {
                    tracing::warn!(error = %e, "no thread to warm the pool; faulting it now");
                    // No thread holds the mapping when none started.
                    if let Some(m) = std::sync::Arc::get_mut(&mut shared) {
                        m.populate(threads);
                    }
                    (None, shared)
                }
            }
        } else {
            map.populate(threads);
            (None, std::sync::Arc::new(map))
        };
        let (warm, map) = warm;
        let ready = if warm.is_some() { now } else { slabs };
        let slab_total = slabs as u64 * slab as u64;
        if warm.is_none() {
            metrics.ready_bytes.set(slab_total as f64);
        }
        let first_generation = peercache_wire::Incarnation::fresh().0 & 0x0000_ffff_ffff_ffff;
        let state = State::new(map.len() as u64, slab as u64, ready, first_generation);
        tracing::debug!(
            size = map.len(),
            slab,
            huge = map.is_huge(),
            background = warm.is_some(),
            "pool mapped"
        );
        Ok(Pool {
            warm,
            max_payload: slab as u64 - HEADER_LEN as u64,
            map,
            slab_total,
            state: Mutex::new(state),
            metrics,
        })
    }

    /// The pool lock, with every slab the background warming finished since the last call
    /// added to the free slabs first: the write paths take slots through this.
    fn lock_for_write(&self) -> parking_lot::MutexGuard<'_, State> {
        let mut st = self.state.lock();
        if let Some(w) = &self.warm {
            w.take(|s| st.add_free_slab(s));
        }
        st
    }

    /// Waits (at most `timeout`) until the whole pool is faulted in, and says how far it got.
    pub fn wait_ready(&self, timeout: std::time::Duration) -> Readiness {
        if let Some(w) = &self.warm {
            w.wait(timeout);
        }
        self.readiness()
    }

    /// Waits at most `timeout` until every byte of `[offset, offset + len)` of the pool's
    /// mapping is faulted in; true when it is. Bytes past the last whole slab (never used) and
    /// a pool with nothing left to warm always are. The RDMA registration of a warming pool
    /// waits on this, so pinning never first-touches pool memory itself.
    pub fn wait_resident(&self, offset: u64, len: u64, timeout: std::time::Duration) -> bool {
        let Some(w) = &self.warm else {
            return true;
        };
        let slab = self.slab_bytes();
        let end = offset.saturating_add(len).min(self.slab_total);
        if offset >= end {
            return true;
        }
        let (lo, hi) = (offset / slab, end.div_ceil(slab));
        w.wait_faulted(lo as u32, hi as u32, timeout)
    }

    /// How much of the pool's memory is faulted in and usable.
    pub fn readiness(&self) -> Readiness {
        let ready = self
            .warm
            .as_ref()
            .map_or(self.slab_total, Warmer::ready_bytes);
        Readiness {
            ready_bytes: ready,
            total_bytes: self.slab_total,
        }
    }

    /// Slab size in bytes: no page spans two slabs, so a registration of whole slabs holds
    /// every page it touches.
    pub fn slab_bytes(&self) -> u64 {
        self.max_payload + HEADER_LEN as u64
    }

    /// Region base (register this with the transport).
    pub fn base(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Region length.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The sealed memory file behind the pool when it was mapped by
    /// [`crate::mem::MemfdAlloc`] (offset 0 is [`Pool::base`]); share it with the transport's
    /// host-local path.
    pub fn shared_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.map.shared_fd()
    }

    /// True if the region is empty (never).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Largest page accepted.
    pub fn max_page_bytes(&self) -> u64 {
        self.max_payload
    }

    fn seq(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: `offset` is a slot offset inside the mapping, 64-byte aligned (slabs start at
        // multiples of the slab size, strides are multiples of 64), and the mapping lives as
        // long as `self`. All accesses to the seq word go through this atomic view.
        unsafe { &*(self.map.ptr().add(offset as usize) as *const AtomicU64) }
    }

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

    fn publish_gauges(&self, st: &State) {
        self.metrics.pages[0].set(st.pages[0] as f64);
        self.metrics.pages[1].set(st.pages[1] as f64);
        self.metrics.bytes_used.set(st.bytes_used as f64);
        self.metrics.evictions[0].absolute(st.evictions[0]);
        self.metrics.evictions[1].absolute(st.evictions[1]);
        self.metrics.slab_steals.absolute(st.slab_steals);
    }

    fn payload_ptr(&self, offset: u64) -> *mut u8 {
        // SAFETY: slot offsets plus the header stay inside the mapping.
        unsafe { self.map.ptr().add(offset as usize + HEADER_LEN) }
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

    fn location(&self, st: &State, r: SlotRef) -> PageLocation {
        let m = st.meta(r);
        PageLocation {
            offset: st.offset(r),
            len: m.len,
            valid_len: m.valid_len,
            generation: m.generation,
            checksum: m.checksum,
            layout: m.layout,
            class: m.repl,
        }
    }

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

    /// Refreshes recency of resident pages (cache hits served elsewhere).
    pub fn touch(&self, keys: &[PageKey]) {
        let mut st = self.state.lock();
        for k in keys {
            if let Some(&r) = st.index.get(&k.0) {
                st.refresh(r);
            }
        }
    }

    /// Demotes resident retained pages to reclaimable. Returns how many moved.
    pub fn mark_reclaimable(&self, keys: &[PageKey]) -> usize {
        let mut st = self.state.lock();
        let mut n = 0;
        for k in keys {
            if let Some(&r) = st.index.get(&k.0) {
                n += st.demote(r) as usize;
            }
        }
        self.publish_gauges(&st);
        n
    }

    /// Appends every live page and its location to `out` (one pass under the state lock) — for
    /// re-announcing this pool's pages to the directory after a ring change.
    pub fn live_pages(&self, out: &mut Vec<(PageKey, PageLocation)>) {
        let st = self.state.lock();
        out.reserve(st.index.len());
        for (&k, &r) in st.index.iter() {
            if st.meta(r).state == SlotState::Live {
                out.push((PageKey(k), self.location(&st, r)));
            }
        }
    }

    /// Removes pages (only of the given generation, when given). Leased pages stay.
    pub fn remove_batch(&self, keys: &[(PageKey, Option<u64>)]) -> usize {
        let mut st = self.state.lock();
        let n = keys.iter().filter(|(k, g)| st.remove(*k, *g)).count();
        self.publish_gauges(&st);
        n
    }

    /// Reads pages back from the disk tier into the pool as *retained* (verified on the way;
    /// a corrupt record is deleted by the tier and reported `Failed`). Pages already resident
    /// are `Duplicate`. Evicted pages are appended to `evicted`.
    pub fn promote_batch(
        &self,
        disk: &crate::disk::DiskTier,
        keys: &[PageKey],
        scratch: &mut PublishScratch,
        out: &mut Vec<Published>,
        evicted: &mut Vec<Evicted>,
    ) {
        // Read every record first (one reused buffer per batch), then publish them together.
        let mut lens = Vec::with_capacity(keys.len());
        let mut layouts = Vec::with_capacity(keys.len());
        let mut buf = Vec::new();
        let mut failed: Vec<Option<PoolError>> = Vec::with_capacity(keys.len());
        for k in keys {
            layouts.push(Layout::NONE);
            if self.contains(*k) {
                lens.push(0usize);
                failed.push(None);
                continue;
            }
            let Some(len) = disk.len_of(*k) else {
                lens.push(0);
                failed.push(Some(PoolError::NotFound(*k)));
                continue;
            };
            let start = buf.len();
            buf.resize(start + len as usize, 0);
            match disk.read(*k, &mut [&mut buf[start..]]) {
                Ok(h) => {
                    *layouts.last_mut().expect("pushed above") = h.layout;
                    lens.push(len as usize);
                    failed.push(None);
                }
                Err(_) => {
                    buf.truncate(start);
                    lens.push(0);
                    failed.push(Some(PoolError::NotFound(*k)));
                }
            }
        }
        let mut segs: Vec<[&[u8]; 1]> = Vec::with_capacity(keys.len());
        let mut at = 0;
        for &l in &lens {
            segs.push([&buf[at..at + l]]);
            at += l;
        }
        let pages: Vec<PageWrite<'_>> = keys
            .iter()
            .zip(&segs)
            .zip(&layouts)
            .map(|((k, s), &layout)| PageWrite {
                key: *k,
                segments: s,
                valid_len: None,
                layout,
            })
            .collect();
        let todo: Vec<PageWrite<'_>> = pages
            .iter()
            .zip(&failed)
            .filter(|(p, f)| f.is_none() && !p.segments[0].is_empty())
            .map(|(p, _)| *p)
            .collect();
        let mut published = Vec::new();
        self.publish_batch(&todo, ReplClass::Retained, scratch, &mut published, evicted);
        let mut it = published.into_iter();
        out.clear();
        for (p, f) in pages.iter().zip(failed) {
            match f {
                Some(e) => out.push(Published::Failed(e)),
                None if p.segments[0].is_empty() => {
                    let mut locs = Vec::new();
                    self.lookup_batch(&[p.key], &mut locs);
                    out.push(match locs[0] {
                        Some(l) => Published::Duplicate(l),
                        None => Published::Failed(PoolError::NotFound(p.key)),
                    });
                }
                None => out.push(
                    it.next()
                        .unwrap_or(Published::Failed(PoolError::NotFound(p.key))),
                ),
            }
        }
        let promoted = out
            .iter()
            .filter(|p| matches!(p, Published::New(_)))
            .count();
        metrics::counter!(crate::metrics::PROMOTES_TOTAL).increment(promoted as u64);
    }

    /// Removes every unleased page; returns them (for the caller to tell the directory).
    pub fn clear(&self) -> Vec<Evicted> {
        let mut st = self.state.lock();
        let keys: Vec<(PageKey, u64, ReplClass)> = st
            .index
            .values()
            .map(|&r| {
                let m = st.meta(r);
                (m.key, m.generation, m.repl)
            })
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for (key, generation, class) in keys {
            if st.remove(key, Some(generation)) {
                out.push(Evicted {
                    key,
                    generation,
                    class,
                });
            }
        }
        self.publish_gauges(&st);
        out
    }

    /// The generation of a resident page (`None`: absent or being written).
    pub fn generation_of(&self, key: PageKey) -> Option<u64> {
        let st = self.state.lock();
        st.index
            .get(&key.0)
            .filter(|&&r| st.meta(r).state == SlotState::Live)
            .map(|&r| st.meta(r).generation)
    }

    /// Counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.state.lock();
        PoolStats {
            capacity: self.map.len() as u64,
            bytes_used: st.bytes_used,
            retained: st.pages[0],
            reclaimable: st.pages[1],
            evicted_retained: st.evictions[0],
            evicted_reclaimable: st.evictions[1],
            slab_steals: st.slab_steals,
            verify_rejects: self
                .metrics
                .verify_rejects
                .iter()
                .map(peercache_wire::tally::Tally::get)
                .sum(),
        }
    }

    /// Asserts the internal invariants (every live page indexed once, on its class list).
    pub fn check_invariants(&self) {
        self.state.lock().check_invariants();
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

//! [`Pool`]: the published host-memory pool — its mapping and warming, the slot geometry every
//! part shares, and its counters. Writing (`write`), reading (`read`), managing resident pages
//! (`manage`) and promotion from disk (`promote`) live beside it, each an `impl Pool` of its own.

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use crate::PoolError;
use crate::header::HEADER_LEN;
use crate::mem::{Mapping, MmapAlloc, RegionAlloc};
use crate::state::{SlotRef, State};
use crate::warm::Warmer;

mod manage;
mod promote;
mod read;
mod types;
mod write;

pub use read::Leases;
pub use types::{
    Evicted, PageLocation, PageWrite, PoolConfig, PoolStats, Published, Readiness, ReplClass,
    Reservation, Reserved,
};
pub use write::PublishScratch;

/// Faulted before [`Pool::with_alloc`] returns when the rest warms in the background.
const SYNC_BYTES: usize = 128 << 20;

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

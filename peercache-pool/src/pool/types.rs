//! The pool's plain data: its geometry, where a page lives, what a publish, a reservation or an
//! eviction reports, its counters and readiness.

use peercache_wire::{Layout, PageKey};

use crate::PoolError;
use crate::header::{Expect, HEADER_LEN};
use crate::state::SlotRef;

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
    /// Fault only the first slabs (about 128 MiB) before
    /// [`Pool::with_alloc`](super::Pool::with_alloc) returns and the rest on background
    /// threads, each slab used once it is in (see [`Pool::readiness`](super::Pool::readiness));
    /// `false` faults the whole pool first.
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

    pub(super) fn effective_slab(&self) -> usize {
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

/// A slot reserved for a payload written by someone else (see
/// [`Pool::reserve_batch`](super::Pool::reserve_batch)).
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
    pub(super) slot: SlotRef,
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

//! `peercache-pool`: the memory a PeerCache node publishes.
//!
//! Peers read pages straight out of this pool with one-sided reads, so its layout is part of
//! the wire contract: every slot starts with a 64-byte [`header`] (seqlock word, generation,
//! key, lengths, payload checksum) followed by the payload, and a location handed to the
//! directory carries the slot's generation. A reader that fetched header + payload checks
//! generation, key and checksum ([`header::verify`]); a slot reused since the location was
//! handed out is rejected, never served as another key's bytes.
//!
//! * One contiguous region, mapped once ([`mem`]) and faulted in before it serves: the first
//!   slabs at once, the rest on background threads, each slab used only once it is resident
//!   ([`Pool::readiness`]), so a large pool serves at once and no publish takes a page fault.
//!   A pool larger than the host's available memory is refused unless overcommit is allowed.
//! * Size classes ([`class`]) carve it into slabs so mixed page sizes do not fragment it; a
//!   class that runs dry takes a slab from the largest class.
//! * Two replacement classes ([`ReplClass`]): local publishes are *retained*, copies fetched
//!   from peers are *reclaimable*; pressure evicts reclaimable LRU, then retained LRU. Hits and
//!   duplicate inserts refresh recency within their class and never migrate;
//!   [`Pool::mark_reclaimable`] demotes.
//! * A page (all its components) is one slot, so K and V are evicted together.
//! * Local readers hold leases ([`Pool::lease_batch`]); eviction skips leased pages.
//! * Evictions come back to the caller in batches ([`Evicted`]); nothing calls out per page.
//! * [`disk`] — the L4 tier: bounded write-through, checksummed records, recovery by scan.

pub mod class;
pub mod disk;
mod error;
mod fused;
pub mod header;
mod host;
pub mod mem;
pub mod metrics;
mod pool;
mod prefault;
pub mod slotmap;
mod state;
mod warm;

pub use error::PoolError;
pub use header::{Expect, HEADER_LEN, SlotHeader, VerifyError};
pub use pool::{
    Evicted, Leases, PageLocation, PageWrite, Pool, PoolConfig, PoolStats, PublishScratch,
    Published, Readiness, ReplClass, Reservation, Reserved,
};

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

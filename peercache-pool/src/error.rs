//! The pool's error type.

use peercache_wire::PageKey;
use thiserror::Error;

/// Everything the pool can refuse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// A page of zero bytes.
    #[error("page {0} is empty")]
    EmptyPage(PageKey),
    /// A page larger than the largest slot.
    #[error("page {key} of {len} bytes exceeds the largest slot payload of {max}")]
    TooLarge {
        /// The page.
        key: PageKey,
        /// Its length.
        len: u64,
        /// Largest payload.
        max: u64,
    },
    /// A valid length larger than the page.
    #[error("page {key}: valid length {valid} exceeds page length {len}")]
    BadValidLength {
        /// The page.
        key: PageKey,
        /// Valid bytes.
        valid: u32,
        /// Page bytes.
        len: u32,
    },
    /// No slot could be freed: everything evictable is leased or being written.
    #[error("pool is full: no evictable slot for {len}-byte pages")]
    Full {
        /// Payload size asked for.
        len: u64,
    },
    /// The key is not in the pool.
    #[error("page {0} is not in the pool")]
    NotFound(PageKey),
    /// The page is reserved and still being written (by a remote writer).
    #[error("page {0} is being written")]
    Busy(PageKey),
    /// The destination does not match the page length.
    #[error("destination holds {dst} bytes, page {key} has {len}")]
    LengthMismatch {
        /// The page.
        key: PageKey,
        /// Destination bytes.
        dst: u64,
        /// Page bytes.
        len: u64,
    },
    /// A pool geometry that cannot work.
    #[error("bad pool geometry: {0}")]
    Geometry(String),
    /// The operating system refused the memory.
    #[error("cannot map {len} bytes: {detail}")]
    Map {
        /// Bytes asked for.
        len: usize,
        /// OS error.
        detail: String,
    },
    /// More memory asked for than the host has available (`MemAvailable`).
    #[error(
        "a pool of {:.1} GiB is more than this host's available memory ({:.1} GiB MemAvailable); \
         ask for less, or allow overcommit explicitly",
        *asked as f64 / (1u64 << 30) as f64,
        *available as f64 / (1u64 << 30) as f64
    )]
    HostTooSmall {
        /// Bytes asked for.
        asked: u64,
        /// `MemAvailable` in bytes when asked.
        available: u64,
    },
    /// A read did not verify (stale slot, torn copy, wrong key or checksum).
    #[error("page {key} failed verification: {reason:?}")]
    Verify {
        /// The page.
        key: PageKey,
        /// Why.
        reason: crate::VerifyError,
    },
}

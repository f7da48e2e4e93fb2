//! The disk tier's plain data: its settings, its errors and its counters.

use std::path::PathBuf;

use peercache_wire::PageKey;
use thiserror::Error;

use super::private::UnsafeFolder;
use super::record::RecordError;

/// Why the disk tier refused something.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The folder could not be created or read.
    #[error("disk tier folder {path}: {source}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The key is not on disk.
    #[error("page {0} is not on disk")]
    NotFound(PageKey),
    /// The destination does not match the page.
    #[error("destination holds {dst} bytes, page has {len}")]
    LengthMismatch {
        /// Destination bytes.
        dst: u64,
        /// Page bytes.
        len: u64,
    },
    /// The record failed verification (it has been dropped from the index).
    #[error("record of page {key} is corrupt: {reason:?}")]
    Corrupt {
        /// The page.
        key: PageKey,
        /// Why.
        reason: RecordError,
    },
    /// I/O on a record.
    #[error("disk i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The folder is not private to this user, so its contents cannot be trusted (see
    /// [`UnsafeFolder`]); nothing in it is read.
    #[error(
        "disk tier folder {path} refused: {why}; use a folder of this user's with mode 0700 (disk_path)"
    )]
    UnsafeFolder {
        /// The folder.
        path: PathBuf,
        /// What is wrong with it.
        why: UnsafeFolder,
    },
}

/// Disk tier settings.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The tier's folder (already specific to the node, e.g. `<disk_path>/<node_id>`).
    pub dir: PathBuf,
    /// Bytes of segments kept.
    pub capacity: u64,
    /// Pages that may wait for the writer thread; beyond it writes are skipped and counted.
    pub queue_depth: usize,
    /// Segment size (0: capacity / 16, clamped to 1–256 MiB). Eviction works a segment at a
    /// time, so smaller segments follow LRU more closely.
    pub segment_bytes: u64,
}

impl DiskConfig {
    /// A tier in `dir` of `capacity` bytes with a 256-page queue and derived segments.
    pub fn new(dir: PathBuf, capacity: u64) -> Self {
        DiskConfig {
            dir,
            capacity,
            queue_depth: 256,
            segment_bytes: 0,
        }
    }

    pub(super) fn segment_size(&self) -> u64 {
        if self.segment_bytes != 0 {
            return self.segment_bytes;
        }
        (self.capacity / 16).clamp(1 << 20, 256 << 20)
    }
}

/// Counters of the tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Records indexed.
    pub keys: u64,
    /// Bytes of segments on disk.
    pub bytes: u64,
    /// Segments on disk.
    pub segments: u64,
    /// Records written.
    pub writes: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Writes skipped (queue full, tier disabled).
    pub dropped: u64,
    /// Records dropped with their segment to stay within capacity.
    pub evictions: u64,
    /// Torn or corrupt records found.
    pub corrupt: u64,
    /// Records found by the recovery scan (counted when it ends).
    pub recovered: u64,
    /// True while the recovery scan of a previous run's segments goes on.
    pub recovering: bool,
    /// True once a failed write disabled the tier.
    pub disabled: bool,
    /// Reads served.
    pub reads: u64,
}

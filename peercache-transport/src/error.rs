//! Typed errors: per-op ([`OpError`]) and per-batch ([`TransportError`]).

use std::net::SocketAddr;
use std::time::Duration;

use thiserror::Error;

use crate::RegionKey;

/// Why one op of a batch failed. The connection stays usable after any of these.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum OpError {
    /// The region key is not registered (on the peer for a remote range, here for a segment).
    #[error("unknown region {0:?}")]
    UnknownRegion(RegionKey),
    /// The range leaves its region.
    #[error("range {addr:#x}+{len} is outside region {region:?} ({region_len} bytes)")]
    OutOfRegion {
        /// Region key.
        region: RegionKey,
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
        /// Region length.
        region_len: u64,
    },
    /// The region's access level forbids this op (e.g. a remote write into read-only memory).
    #[error("region {0:?} does not allow this access")]
    AccessDenied(RegionKey),
    /// The op is larger than `max_op_bytes`, or zero-length.
    #[error("op of {len} bytes is outside 1..={max}")]
    BadLength {
        /// Requested length.
        len: u64,
        /// Limit.
        max: u64,
    },
    /// The local segments do not add up to the remote length.
    #[error("local segments hold {segments} bytes but the remote range is {remote}")]
    LengthMismatch {
        /// Sum of segment lengths.
        segments: u64,
        /// Remote length.
        remote: u64,
    },
    /// The region is device memory: only the RDMA path reaches it (sent over TCP as
    /// [`OpError::AccessDenied`]'s code).
    #[error("region {0:?} is device memory, reachable only over RDMA")]
    DeviceOnly(RegionKey),
    /// The batch as a whole failed (see the batch error); reported per op for callers that
    /// only look at per-op results.
    #[error("batch failed: {0}")]
    Batch(String),
}

impl OpError {
    /// Wire code of this error (0 is success).
    pub(crate) fn code(&self) -> u8 {
        match self {
            OpError::UnknownRegion(_) => 1,
            OpError::OutOfRegion { .. } => 2,
            OpError::AccessDenied(_) | OpError::DeviceOnly(_) => 3,
            OpError::BadLength { .. } => 4,
            OpError::LengthMismatch { .. } => 5,
            OpError::Batch(_) => 6,
        }
    }

    /// Every [`OpError::label`], indexed by [`OpError::kind`].
    pub const KINDS: [&'static str; 7] = [
        "unknown_region",
        "out_of_region",
        "access_denied",
        "device_only",
        "bad_length",
        "length_mismatch",
        "batch",
    ];

    /// This error's index in [`OpError::KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            OpError::UnknownRegion(_) => 0,
            OpError::OutOfRegion { .. } => 1,
            OpError::AccessDenied(_) => 2,
            OpError::DeviceOnly(_) => 3,
            OpError::BadLength { .. } => 4,
            OpError::LengthMismatch { .. } => 5,
            OpError::Batch(_) => 6,
        }
    }

    /// Short label for metrics.
    pub fn label(&self) -> &'static str {
        Self::KINDS[self.kind()]
    }
}

/// Why a whole batch failed.
#[derive(Debug, Error)]
pub enum TransportError {
    /// No answer within the deadline; the peer is now suspect.
    #[error("peer {peer} did not answer within {after:?}")]
    Timeout {
        /// The peer.
        peer: SocketAddr,
        /// The deadline that passed.
        after: Duration,
    },
    /// The peer timed out recently; failing fast until the suspect period ends.
    #[error("peer {peer} is suspect for another {remaining:?}")]
    Suspect {
        /// The peer.
        peer: SocketAddr,
        /// Time left in the suspect period.
        remaining: Duration,
    },
    /// Could not connect or handshake.
    #[error("cannot reach {peer}: {source}")]
    Connect {
        /// The peer.
        peer: SocketAddr,
        /// Cause.
        #[source]
        source: peercache_wire::WireError,
    },
    /// The connection broke or desynchronised mid-batch.
    #[error("connection to {peer} failed: {source}")]
    Connection {
        /// The peer.
        peer: SocketAddr,
        /// Cause.
        #[source]
        source: peercache_wire::WireError,
    },
    /// The peer rejected the batch as a whole (too many ops, too many bytes).
    #[error("peer {peer} rejected the batch: {reason}")]
    Rejected {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// The batch is larger than `max_batch_ops`.
    #[error("batch of {ops} ops exceeds the limit of {max}")]
    BatchTooLarge {
        /// Ops in the batch.
        ops: usize,
        /// Limit.
        max: usize,
    },
    /// Registration failed (null pointer, zero length, overlapping).
    #[error("cannot register region: {0}")]
    Register(&'static str),
    /// Device memory could not be registered (no RDMA path, or a missing prerequisite, named).
    #[error("cannot register device memory: {0}")]
    Device(String),
    /// Binding the data server failed.
    #[error("cannot bind data server: {0}")]
    Bind(#[source] std::io::Error),
    /// The transport was shut down.
    #[error("transport is shut down")]
    Shutdown,
}

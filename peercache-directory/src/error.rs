//! The directory's error type.

use peercache_wire::{NodeId, WireError};
use thiserror::Error;

/// Why a directory operation failed as a whole.
#[derive(Debug, Error)]
pub enum DirError {
    /// The ring is empty: membership has not arrived yet.
    #[error("no directory members known yet")]
    NoMembers,
    /// A ring owner has no known control endpoint.
    #[error("member {0} has no known control endpoint")]
    UnknownMember(NodeId),
    /// Network or decoding failure talking to a shard.
    #[error("directory rpc failed: {0}")]
    Wire(#[from] WireError),
}

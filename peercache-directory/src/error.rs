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
    /// The call names another node's copies: a node inserts, removes and marks only its own
    /// (shards refuse the rest from peers too).
    #[error("{action} names {target}'s copies; this node ({me}) may {action} only its own")]
    NotYours {
        /// `insert`, `remove` or `mark`.
        action: &'static str,
        /// The node named.
        target: NodeId,
        /// This node.
        me: NodeId,
    },
    /// Network or decoding failure talking to a shard.
    #[error("directory rpc failed: {0}")]
    Wire(#[from] WireError),
}

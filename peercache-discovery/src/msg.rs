//! Discovery messages on the wire (kinds `0x01xx`).

use peercache_wire::envelope::Message;
use peercache_wire::{Incarnation, NodeId};
use serde::{Deserialize, Serialize};

use crate::info::NodeInfo;

/// Client → discovery server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiscRequest {
    /// Announce (or re-announce) a member.
    Register(NodeInfo),
    /// Keep a registration alive; members are returned when `known_version` is stale.
    Heartbeat {
        /// Who.
        node: NodeId,
        /// Which life.
        incarnation: Incarnation,
        /// Membership version the client last saw from this server.
        known_version: u64,
    },
    /// Leave now (clean shutdown).
    Deregister {
        /// Who.
        node: NodeId,
        /// Which life.
        incarnation: Incarnation,
    },
    /// The current members.
    Members,
    /// A heartbeat that takes the changes since `known_version` instead of the whole table
    /// ([`DiscReply::Changes`]). Sent only to servers that answered it before; a server of an
    /// earlier release cannot decode it, and is then sent [`DiscRequest::Heartbeat`].
    Sync {
        /// Who.
        node: NodeId,
        /// Which life.
        incarnation: Incarnation,
        /// Membership version the client last saw from this server.
        known_version: u64,
    },
}

impl Message for DiscRequest {
    const KIND: u16 = 0x0101;
    const NAME: &'static str = "DiscRequest";
}

/// Discovery server → client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DiscReply {
    /// The members this server holds, at `version`.
    Members {
        /// Membership version.
        version: u64,
        /// Members.
        members: Vec<NodeInfo>,
    },
    /// Heartbeat answer.
    Heartbeat {
        /// False: this server does not know the node (it must register again).
        known: bool,
        /// Current membership version.
        version: u64,
        /// Members, when the client's version was stale.
        members: Option<Vec<NodeInfo>>,
    },
    /// Done.
    Ok,
    /// Answer to [`DiscRequest::Sync`] whose `known_version` the server's change log still
    /// covers: only what changed since then (the whole table otherwise, as a
    /// [`DiscReply::Heartbeat`]).
    Changes {
        /// False: this server does not know the node (it must register again).
        known: bool,
        /// The version the changes lead from (the client's `known_version`).
        since: u64,
        /// Current membership version.
        version: u64,
        /// Members added or changed since `since`, as they are now.
        upserted: Vec<NodeInfo>,
        /// Members gone since `since`.
        removed: Vec<NodeId>,
    },
}

impl Message for DiscReply {
    const KIND: u16 = 0x0102;
    const NAME: &'static str = "DiscReply";
}

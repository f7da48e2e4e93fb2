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
}

impl Message for DiscReply {
    const KIND: u16 = 0x0102;
    const NAME: &'static str = "DiscReply";
}

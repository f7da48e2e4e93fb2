//! What a discovery server admits: a member speaks only for itself, and no member can grow the
//! table (or the reply that carries it) past fixed bounds.

use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};
use thiserror::Error;

use crate::info::NodeInfo;
use crate::msg::DiscRequest;

/// Largest discovery frame either side accepts (requests and replies).
pub const MAX_FRAME: usize = 8 << 20;

/// Bounds on what members may announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Members one table holds.
    pub max_members: usize,
    /// Encoded bytes of one announcement.
    pub max_info_bytes: usize,
    /// Attributes of one announcement.
    pub max_attrs: usize,
    /// Data endpoints (rails) of one announcement.
    pub max_data_endpoints: usize,
    /// Encoded bytes of the whole table: the members reply must fit in [`MAX_FRAME`].
    pub max_table_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_members: 4096,
            max_info_bytes: 16 << 10,
            max_attrs: 64,
            max_data_endpoints: 64,
            max_table_bytes: MAX_FRAME - (64 << 10),
        }
    }
}

/// Why a discovery server refused a request.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// The request acts for another node (or another life of it) than the connection's own.
    #[error(
        "{action} for {target} refused: this connection belongs to {caller}, and a member may \
         act only for itself"
    )]
    NotYours {
        /// `register`, `heartbeat` or `deregister`.
        action: &'static str,
        /// The node (and incarnation) the request named.
        target: String,
        /// Who the connection belongs to.
        caller: String,
    },
    /// The table holds `max` members already.
    #[error(
        "the membership table is full ({max} members); raise the limit or check for a registration storm"
    )]
    TooManyMembers {
        /// The limit.
        max: usize,
    },
    /// One announcement is out of bounds.
    #[error("announcement of {node} has {n} {what}, at most {max} are accepted")]
    Oversized {
        /// The announcing node.
        node: NodeId,
        /// What is too large (`bytes`, `attributes`, `data endpoints`).
        what: &'static str,
        /// How many.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// Admitting the announcement would make the members reply larger than a frame.
    #[error("the membership table would exceed {max} bytes, the largest members reply")]
    TableFull {
        /// The limit.
        max: usize,
    },
}

impl Refusal {
    /// True when the request acted for someone else (counted as an identity refusal).
    pub fn is_identity(&self) -> bool {
        matches!(self, Refusal::NotYours { .. })
    }

    /// A short label for the refusal counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NotYours { .. } => "not_yours",
            Refusal::TooManyMembers { .. } => "too_many_members",
            Refusal::Oversized { .. } => "oversized",
            Refusal::TableFull { .. } => "table_full",
        }
    }
}

/// Checks that `from` may send `req`: registrations, heartbeats and deregistrations only for
/// the node and incarnation the connection's handshake announced.
pub fn check_identity(from: &Peer, req: &DiscRequest) -> Result<(), Refusal> {
    let (action, node, incarnation): (&'static str, &NodeId, Incarnation) = match req {
        DiscRequest::Register(info) => ("register", &info.node, info.incarnation),
        DiscRequest::Heartbeat {
            node, incarnation, ..
        }
        | DiscRequest::Sync {
            node, incarnation, ..
        } => ("heartbeat", node, *incarnation),
        DiscRequest::Deregister { node, incarnation } => ("deregister", node, *incarnation),
        DiscRequest::Members => return Ok(()),
    };
    if from.is_life(node, incarnation) {
        return Ok(());
    }
    Err(Refusal::NotYours {
        action,
        target: format!("{node} (incarnation {:#x})", incarnation.0),
        caller: match &from.node {
            Some(n) => format!("{n} (incarnation {:#x})", from.incarnation.0),
            None => from.label(),
        },
    })
}

/// Checks one announcement against `limits`; returns its encoded size.
pub fn check_info(info: &NodeInfo, limits: &Limits) -> Result<usize, Refusal> {
    let oversized = |what, n, max| Refusal::Oversized {
        node: info.node.clone(),
        what,
        n,
        max,
    };
    if info.attrs.len() > limits.max_attrs {
        return Err(oversized("attributes", info.attrs.len(), limits.max_attrs));
    }
    if info.data.len() > limits.max_data_endpoints {
        return Err(oversized(
            "data endpoints",
            info.data.len(),
            limits.max_data_endpoints,
        ));
    }
    let bytes = postcard::to_allocvec(info).map_or(usize::MAX, |v| v.len());
    if bytes > limits.max_info_bytes {
        return Err(oversized("bytes", bytes, limits.max_info_bytes));
    }
    Ok(bytes)
}

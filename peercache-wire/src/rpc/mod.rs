//! Request/response RPC on framed, handshaken connections — the shape every control plane
//! (discovery, directory, store control) shares.
//!
//! * [`RpcServer`]: a small tokio runtime that accepts connections, runs the handshake, and
//!   answers each request frame with the handler's reply frame. A frame the handler cannot
//!   decode gets an [`RpcError`] reply and the connection is closed (the stream is not trusted
//!   any more); the server and every other connection keep going.
//! * [`RpcClient`]: a blocking client with a per-peer connection pool and a deadline on every
//!   call; [`RpcClient::call_many`] writes requests to several peers before reading any reply,
//!   so fan-out costs one round trip, not one per peer.

//!
//! The server lives in `server`, the client in `client` (its pooled connections in `conn`);
//! what both speak — replies, errors, the peer a handshake established — here.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::envelope::{Envelope, Message};
use crate::{Incarnation, NodeId, WireError};

mod client;
mod conn;
mod server;

pub use client::{ClientConfig, RpcClient};
pub use server::{RpcServer, ServerConfig, ServerCounters};

/// A generic error reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcError {
    /// Machine-readable code (see the `CODE_*` constants).
    pub code: u16,
    /// Human-readable detail.
    pub message: String,
}

impl RpcError {
    /// The request did not decode.
    pub const CODE_MALFORMED: u16 = 1;
    /// The request kind is not served here.
    pub const CODE_UNKNOWN_KIND: u16 = 2;
    /// The request was valid but refused (limits, state).
    pub const CODE_REFUSED: u16 = 3;
    /// The server is shutting down.
    pub const CODE_SHUTDOWN: u16 = 4;
    /// The request acts for another member than the one this connection belongs to (see
    /// [`Peer`]): refused, counted in [`IDENTITY_REFUSED_TOTAL`].
    pub const CODE_FORBIDDEN: u16 = 5;
}

impl Message for RpcError {
    const KIND: u16 = 0x0003;
    const NAME: &'static str = "RpcError";
}

/// What a handler returns: a reply frame, or an error reply (and whether to close).
pub enum Reply {
    /// An encoded reply envelope.
    Frame(Vec<u8>),
    /// Answer with an [`RpcError`]; `close` drops the connection afterwards.
    Error {
        /// The error to send.
        error: RpcError,
        /// Close the connection after sending.
        close: bool,
    },
}

/// Who is on the other end of a connection, as its handshake established it.
///
/// With a cluster secret, `authenticated` is true and the peer has proven it is a **member**;
/// `node` is the id that member claimed in its Hello (covered by its proof, so it cannot be
/// changed on the way, but every member could claim any id — the secret proves membership,
/// not identity). Services bind the connection to that claim: a request that acts for
/// another node is refused with [`RpcError::CODE_FORBIDDEN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The node id the peer announced (None: a tool such as `status` or the bench driver).
    pub node: Option<NodeId>,
    /// The peer's incarnation.
    pub incarnation: Incarnation,
    /// Where the connection comes from.
    pub addr: SocketAddr,
    /// Whether the peer proved the cluster secret (false in an open cluster).
    pub authenticated: bool,
    /// What its proof granted: [`Grant::ReadOnly`](crate::auth::Grant::ReadOnly) for a
    /// read-only client token, on a server whose `auth` accepts one.
    pub grant: crate::auth::Grant,
    /// Whether the peer proved `node` with a node certificate ([`crate::identity`]); without
    /// one `node` is the peer's claim.
    pub verified: bool,
}

impl Peer {
    /// Whether this connection belongs to `node`.
    pub fn is(&self, node: &NodeId) -> bool {
        self.node.as_ref() == Some(node)
    }

    /// Whether this connection belongs to `node` in its life `incarnation`.
    pub fn is_life(&self, node: &NodeId, incarnation: Incarnation) -> bool {
        self.is(node) && self.incarnation == incarnation
    }

    /// The peer for display: its node id, or `anonymous@addr`.
    pub fn label(&self) -> String {
        match &self.node {
            Some(n) => n.to_string(),
            None => format!("anonymous@{}", self.addr),
        }
    }
}

/// The reply refusing a request that acts for another node than `peer`.
pub fn forbidden(peer: &Peer, what: &str) -> Reply {
    Reply::Error {
        error: RpcError {
            code: RpcError::CODE_FORBIDDEN,
            message: format!(
                "{what}: this connection belongs to {}, and a member may act only for itself",
                peer.label()
            ),
        },
        close: false,
    }
}

/// The request handler of a server: called with the connection's [`Peer`] and the request.
pub type Handler = Arc<dyn Fn(&Peer, Envelope<'_>) -> Reply + Send + Sync>;

pub use crate::metrics::{
    CONNECTIONS_REFUSED_TOTAL, FRAME_BUDGET_REFUSED_TOTAL, HANDSHAKE_FAILURES_TOTAL,
    IDENTITY_REFUSED_TOTAL, MALFORMED_FRAMES_TOTAL, SEALED_REFUSED_TOTAL,
};
pub use crate::shares::Shares;

/// Decodes a reply frame as `M`; an [`RpcError`] reply becomes [`WireError::Remote`].
pub fn decode_reply<M: Message>(frame: &[u8]) -> Result<M, WireError> {
    let env = Envelope::parse(frame)?;
    if env.kind == RpcError::KIND {
        let e: RpcError = env.decode()?;
        return Err(WireError::Remote {
            code: e.code,
            message: e.message,
        });
    }
    env.decode()
}

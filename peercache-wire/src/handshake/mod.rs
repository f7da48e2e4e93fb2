//! The connection handshake every PeerCache connection starts with.
//!
//! The client sends [`Hello`] (the version range it speaks, which plane it wants, who it is);
//! the server answers [`HelloReply::Accept`] with the chosen version, or
//! [`HelloReply::Reject`] with a reason, before any request is served. With a cluster secret
//! ([`Auth`]) a mutual challenge–response runs between the two, **the client proving first**
//! (see [`crate::auth`]): a stranger learns nothing from the server but a random nonce, so it
//! cannot collect material to guess the secret offline.
//!
//! The exchange itself is versioned ([`HANDSHAKE_VERSION`], carried in the Hello's
//! [`EXT_HANDSHAKE_VERSION`] extension). Version 1 (releases before this one) had the server
//! prove first; a version-2 node and a version-1 node still talk in an open cluster (the
//! exchange without a secret did not change) and refuse each other with a typed
//! [`WireError::HandshakeVersion`] when a secret is set.
//!
//! [`ClientHandshake`] and [`ServerHandshake`] are the sans-IO state machines; the `*_sync` and
//! `*_async` functions drive them over blocking and tokio sockets under one deadline.

use serde::{Deserialize, Serialize};

use crate::auth::TAG_LEN;
use crate::envelope::{MIN_WIRE_VERSION, Message, WIRE_VERSION};
use crate::{Auth, Incarnation, NodeId, WireError};

mod client;
mod drive;
mod server;
#[cfg(test)]
mod tests;

pub use client::ClientHandshake;
pub use drive::{client_async, client_sync, server_async, server_sync};
pub use server::ServerHandshake;

/// Envelope extension of a [`Hello`] carrying the client's 32-byte authentication nonce.
/// Not critical: a server without a secret ignores it (and the client then refuses that
/// server, which cannot prove the secret).
pub const EXT_AUTH_NONCE: u16 = 0x0010;

/// Envelope extension of a [`Hello`]: one byte, the handshake version the client runs. Absent
/// in version 1. Not critical, so a version-1 server ignores it (and answers in version 1,
/// which the client recognises and refuses with [`WireError::HandshakeVersion`]).
pub const EXT_HANDSHAKE_VERSION: u16 = 0x0011;

/// Envelope extension of a [`HelloReply::Accept`]: the server's 32-byte proof of the secret,
/// sent only after the client has proven it.
pub const EXT_SERVER_PROOF: u16 = 0x0012;

/// Envelope extension of a [`Hello`] (client) or [`HelloReply::Accept`] (server): the
/// sender's node certificate ([`crate::identity::NodeCert`], wire form). Not critical.
pub const EXT_NODE_CERT: u16 = 0x0013;

/// Envelope extension of an [`AuthProof`] (client) or [`HelloReply::Accept`] (server): the
/// sender's Ed25519 signature of the exchange with its node key. Not critical.
pub const EXT_NODE_SIGNATURE: u16 = 0x0014;

/// What a node key signs in the handshake: the side, both nonces and the messages so far
/// (the Hello; the server's acceptance too), each length-prefixed.
fn identity_message(side: &[u8], nc: &[u8], ns: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m =
        Vec::with_capacity(64 + side.len() + parts.iter().map(|p| p.len() + 8).sum::<usize>());
    m.extend_from_slice(b"peercache identity v1 ");
    m.extend_from_slice(side);
    m.extend_from_slice(nc);
    m.extend_from_slice(ns);
    for p in parts {
        m.extend_from_slice(&(p.len() as u64).to_be_bytes());
        m.extend_from_slice(p);
    }
    m
}

/// The handshake version this build runs: 2, the client proves the secret first.
pub const HANDSHAKE_VERSION: u8 = 2;

/// Largest handshake frame.
pub const MAX_HANDSHAKE_FRAME: usize = 4096;

/// Reject reasons that start with this are authentication failures.
const AUTH_REASON_PREFIX: &str = "authentication";
/// Reject reasons that start with this are sealing disagreements.
const SEAL_REASON_PREFIX: &str = "encryption in transit";
/// Reject reasons that start with this are handshake-version mismatches.
const VERSION_REASON_PREFIX: &str = "handshake version";
/// In a version reject reason, what precedes the server's version.
const SERVER_RUNS: &str = "this server runs handshake version ";

/// The reason a server gives a client whose handshake version it does not run.
fn version_reason(client: u8) -> String {
    format!(
        "{VERSION_REASON_PREFIX} {client} refused: {SERVER_RUNS}{HANDSHAKE_VERSION} (since \
         version 2 the client proves the cluster secret first); run the same PeerCache release \
         on every node"
    )
}

/// Which plane a connection is for. The server refuses a plane it does not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Plane {
    /// Discovery (membership) on the meta port.
    Discovery,
    /// Directory and store control RPCs on the control port.
    Control,
    /// The TCP data plane (one-sided reads and writes).
    Data,
    /// RDMA queue-pair bootstrap.
    RdmaBootstrap,
    /// Host-local (shared-memory) bootstrap: where a peer on the same host attaches to this
    /// node's shared regions.
    HostLocal,
}

impl Plane {
    /// Whether connections on this plane are sealed when the handshake agrees to
    /// ([`crate::seal`]): every plane that carries requests, not the bootstraps that hand over
    /// to RDMA or shared memory.
    pub fn seals(self) -> bool {
        matches!(self, Plane::Discovery | Plane::Control | Plane::Data)
    }
}

/// First message on every connection, client → server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Oldest envelope version the client speaks.
    pub min_version: u8,
    /// Newest envelope version the client speaks.
    pub max_version: u8,
    /// The plane requested.
    pub plane: Plane,
    /// Who is connecting (None for tools such as the bench driver).
    pub node: Option<NodeId>,
    /// The client's incarnation.
    pub incarnation: Incarnation,
    /// Feature bits the client offers (none defined in version 1).
    pub features: u64,
}

impl Message for Hello {
    const KIND: u16 = 0x0001;
    const NAME: &'static str = "Hello";
}

/// Server → client answer to [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Accepted: the version both use from now on.
    Accept {
        /// Negotiated envelope version.
        version: u8,
        /// The server's id (None for a bare tool server).
        node: Option<NodeId>,
        /// The server's incarnation.
        incarnation: Incarnation,
        /// Feature bits both sides support.
        features: u64,
    },
    /// Refused, with a reason for the client's log.
    Reject {
        /// Why.
        reason: String,
    },
}

impl Message for HelloReply {
    const KIND: u16 = 0x0002;
    const NAME: &'static str = "HelloReply";
}

/// Server → client (version 2): the server's fresh nonce, and nothing that depends on the
/// secret — the server proves itself only after the client has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthChallenge {
    /// The server's fresh nonce.
    pub nonce: [u8; TAG_LEN],
}

impl Message for AuthChallenge {
    const KIND: u16 = 0x0006;
    const NAME: &'static str = "AuthChallenge";
}

/// Server → client in handshake version 1: the server's nonce and its proof, sent before the
/// client proved anything. A version-2 client recognises it only to refuse the server with
/// [`WireError::HandshakeVersion`]; it never answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthChallengeV1 {
    /// The server's nonce.
    pub nonce: [u8; TAG_LEN],
    /// MAC of the transcript by the server.
    pub proof: [u8; TAG_LEN],
}

impl Message for AuthChallengeV1 {
    const KIND: u16 = 0x0004;
    const NAME: &'static str = "AuthChallengeV1";
}

/// Client → server: the client's proof of the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthProof {
    /// MAC of the transcript by the client.
    pub proof: [u8; TAG_LEN],
}

impl Message for AuthProof {
    const KIND: u16 = 0x0005;
    const NAME: &'static str = "AuthProof";
}

impl Hello {
    /// A hello for `plane` from `node`, speaking every version this build knows.
    pub fn new(plane: Plane, node: Option<NodeId>, incarnation: Incarnation) -> Self {
        Hello {
            min_version: MIN_WIRE_VERSION,
            max_version: WIRE_VERSION,
            plane,
            node,
            incarnation,
            features: 0,
        }
    }
}

/// The server's side of the decision, without I/O: which version to speak, or why not.
pub fn accept(
    hello: &Hello,
    serves: &[Plane],
    node: Option<NodeId>,
    incarnation: Incarnation,
) -> HelloReply {
    if !serves.contains(&hello.plane) {
        return HelloReply::Reject {
            reason: format!("this port does not serve the {:?} plane", hello.plane),
        };
    }
    let version = hello.max_version.min(WIRE_VERSION);
    if version < hello.min_version || version < MIN_WIRE_VERSION {
        return HelloReply::Reject {
            reason: format!(
                "no common version: client speaks {}..={}, server {}..={}",
                hello.min_version, hello.max_version, MIN_WIRE_VERSION, WIRE_VERSION
            ),
        };
    }
    HelloReply::Accept {
        version,
        node,
        incarnation,
        features: 0,
    }
}

/// What the client learns from a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Negotiated version.
    pub version: u8,
    /// Server id.
    pub node: Option<NodeId>,
    /// Server incarnation.
    pub incarnation: Incarnation,
    /// The connection's keys when it is sealed from here on ([`crate::seal`]).
    pub channel: Option<crate::seal::ChannelKeys>,
    /// The server proved the node id it named with a node certificate ([`crate::identity`]).
    pub verified: bool,
}

/// What the server learns from a successful handshake.
#[derive(Clone, Debug)]
pub struct Established {
    /// The client's hello.
    pub hello: Hello,
    /// What the client's proof granted it.
    pub grant: crate::auth::Grant,
    /// The connection's keys when it is sealed from here on ([`crate::seal`]).
    pub channel: Option<crate::seal::ChannelKeys>,
    /// The client proved the node id its Hello names with a node certificate
    /// ([`crate::identity`]); false for a Hello that names no node.
    pub verified: bool,
}

/// What a server announces and checks: the planes it serves, who it is, and its secret.
#[derive(Clone, Debug)]
pub struct Acceptor {
    /// Planes served on this port.
    pub planes: Vec<Plane>,
    /// This node (None for a bare tool server).
    pub node: Option<NodeId>,
    /// This process's incarnation.
    pub incarnation: Incarnation,
    /// Cluster authentication.
    pub auth: Auth,
}

/// The next thing a handshake driver must do.
#[derive(Debug)]
pub enum Step<T> {
    /// Send this frame, then read the peer's next frame.
    Send(Vec<u8>),
    /// Send this frame (may be empty: nothing to send) and finish with the result.
    Finish(Vec<u8>, Result<T, WireError>),
}

//! The one error type of the wire crate.

use thiserror::Error;

/// Everything that can go wrong while framing, decoding or handshaking.
#[derive(Debug, Error)]
pub enum WireError {
    /// The first bytes were not the PeerCache magic: not our protocol, or a desynchronised stream.
    #[error("bad magic {found:02x?}: not a PeerCache frame")]
    BadMagic {
        /// The two bytes found where the magic belongs.
        found: [u8; 2],
    },
    /// The peer speaks an envelope version this build cannot read.
    #[error("unsupported wire version {got} (this build reads {min}..={max})")]
    UnsupportedVersion {
        /// Version in the frame.
        got: u8,
        /// Oldest version this build reads.
        min: u8,
        /// Newest version this build reads.
        max: u8,
    },
    /// The frame is shorter than its header says.
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A frame length above the configured maximum; rejected before any allocation.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// The envelope carries a different message kind than the caller expected.
    #[error("unexpected message kind {got:#06x}, expected {expected:#06x}")]
    UnexpectedKind {
        /// Kind found.
        got: u16,
        /// Kind expected.
        expected: u16,
    },
    /// An extension marked critical that this build does not understand.
    #[error("unknown critical extension tag {tag:#06x}")]
    UnknownCriticalExtension {
        /// The tag.
        tag: u16,
    },
    /// The body did not decode as the expected message.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Decoder detail.
        detail: String,
    },
    /// A node id that breaks the grammar.
    #[error("invalid node id {id:?}: {reason}")]
    InvalidNodeId {
        /// The offending id (truncated to 64 chars).
        id: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The handshake failed: the peer rejected us or sent something unexpected.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The peer runs another version of the handshake and the two cannot agree (with a
    /// cluster secret set, version 2 — the client proves first — and version 1 refuse each
    /// other).
    #[error(
        "handshake version mismatch: this node runs handshake version {ours}, the peer \
         {theirs} (since version 2 the client proves the cluster secret first); run the same \
         PeerCache release on every node of the cluster"
    )]
    HandshakeVersion {
        /// The version this node runs.
        ours: u8,
        /// The version the peer runs (0: not stated).
        theirs: u8,
    },
    /// The peer answered the request with an error ([`crate::rpc::RpcError`]): `code` is one
    /// of its `CODE_*` constants (e.g. `CODE_FORBIDDEN` when the request acted for another
    /// member).
    #[error("peer refused the request (code {code}): {message}")]
    Remote {
        /// Machine-readable code.
        code: u16,
        /// The peer's explanation.
        message: String,
    },
    /// A network wait passed its deadline.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The peer timed out recently; calls to it fail fast until the suspect period ends.
    #[error("peer {peer} is suspect for another {remaining:?}")]
    PeerSuspect {
        /// The peer.
        peer: std::net::SocketAddr,
        /// Time left.
        remaining: std::time::Duration,
    },
    /// Authentication failed or is missing on one side (wrong or absent `cluster_secret`).
    #[error("not authenticated: {0}")]
    Unauthenticated(String),
    /// A `cluster_secret` too short to be a secret.
    #[error("cluster secret of {len} bytes is too short (at least {min})")]
    WeakSecret {
        /// Bytes given.
        len: usize,
        /// Bytes required.
        min: usize,
    },
    /// A sealed frame or record failed its integrity check (encryption in transit): changed,
    /// dropped, replayed or reordered on the path. The connection is closed.
    #[error("integrity: {0}")]
    Integrity(String),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl WireError {
    /// True for errors after which the byte stream can no longer be trusted (close the connection).
    pub fn is_desync(&self) -> bool {
        matches!(
            self,
            WireError::BadMagic { .. }
                | WireError::FrameTooLarge { .. }
                | WireError::Truncated { .. }
                | WireError::Closed
                | WireError::Io(_)
                | WireError::Timeout(_)
        )
    }
}

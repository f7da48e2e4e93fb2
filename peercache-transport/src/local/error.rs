//! [`LocalError`]: why the same-host path could not attach or use a peer's region.

use peercache_wire::WireError;

/// Why the same-host path could not attach to a peer or use one of its regions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocalError {
    /// A socket step failed (connect, timeouts, token, reading the table).
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The data port's handshake or invitation frame failed.
    #[error("{step}: {source}")]
    Wire {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: WireError,
    },
    /// The peer's abstract socket is not reachable: it runs on another host or network
    /// namespace.
    #[error("not on this host: {0}")]
    NotOnThisHost(#[source] std::io::Error),
    /// The bytes are not what this build of the path sends.
    #[error("not a host-local {0}")]
    NotOurs(&'static str),
    /// The peer speaks another version of the path.
    #[error("host-local version {got} (this build speaks {ours})")]
    Version {
        /// The version received.
        got: u8,
        /// The version this build speaks.
        ours: u8,
    },
    /// A message ended early.
    #[error("truncated host-local {0}")]
    Truncated(&'static str),
    /// The invitation's socket name is not UTF-8.
    #[error("socket name is not UTF-8")]
    BadName,
    /// More descriptors than a table may carry.
    #[error("too many descriptors in the region table")]
    TooManyDescriptors,
    /// The table's count and the descriptors that came with it disagree.
    #[error("region table names {count} regions but carried {fds} descriptors")]
    CountMismatch {
        /// Regions named.
        count: usize,
        /// Descriptors received.
        fds: usize,
    },
    /// A memory file is not sealed against shrinking and writing (a mapping could lose pages,
    /// or a peer could change the pool).
    #[error(
        "memory file is not sealed against shrinking and writing (F_SEAL_SHRINK + F_SEAL_FUTURE_WRITE)"
    )]
    Unsealed,
    /// A descriptor to be shared is open for writing.
    #[error("a shared memory file must be handed out through a read-only descriptor")]
    Writable,
    /// A memory file cannot hold the region at its offset.
    #[error("memory file of {size} bytes cannot hold {len} bytes at offset {offset}")]
    BadFileRange {
        /// File size.
        size: u64,
        /// Region length.
        len: u64,
        /// Offset in the file (page-aligned when valid).
        offset: u64,
    },
}

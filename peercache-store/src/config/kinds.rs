//! The value types of [`PeerCacheConfig`](super::PeerCacheConfig)'s settings and its error.

use std::collections::BTreeMap;
use std::path::PathBuf;

use thiserror::Error;

/// A setting that could not be accepted.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// A value of the wrong type or out of range.
    #[error("config key `{key}` = {value}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value given (as text).
        value: String,
        /// What is accepted.
        reason: String,
    },
    /// A required key is missing.
    #[error("config key `{0}` is required (e.g. \"discovery_addr\": \"10.0.0.1:31998\")")]
    Missing(&'static str),
    /// No cluster secret, yet the node would be reachable beyond loopback.
    #[error(
        "no cluster_secret set, but this node is reachable beyond loopback ({}): set \
         cluster_secret (or PEERCACHE_CLUSTER_SECRET / cluster_secret_file, ≥ 16 bytes, e.g. \
         `openssl rand -hex 32`) on every node, or bind to 127.0.0.x, or accept an open node \
         with insecure = true",
        reachable.join(", ")
    )]
    Unauthenticated {
        /// The settings that make it reachable.
        reachable: Vec<String>,
    },
    /// The config file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A command-line override that is not `KEY=VALUE`.
    #[error("--set {0}: expected KEY=VALUE (keys as in docs/configuration.md)")]
    Override(String),
}

/// Deployment mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every node publishes its own pages; reads go peer to peer.
    P2p,
    /// p2p plus storage servers, by `write_policy`.
    Hybrid,
    /// Inference nodes write into storage servers.
    Centralized,
    /// Directory-free slot placement.
    Slotmap,
}

/// Where the membership is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiscoveryKind {
    /// PeerCache's own multi-master discovery at `discovery_addr`.
    Builtin,
    /// Leases and a watch in an etcd cluster (`etcd_endpoints`; build feature `etcd`).
    Etcd,
}

/// Whether a node's connections are encrypted in transit (`encrypt_in_transit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transit {
    /// Sealed only when the other side prefers or requires it.
    Off,
    /// Sealed whenever both sides can, if the node is reachable beyond loopback (a peer of a
    /// release before sealing is served unsealed); as `Off` on loopback.
    Auto,
    /// Always sealed; a side that cannot seal is refused.
    On,
}

/// Where hybrid mode writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePolicy {
    /// Local pool (p2p).
    Local,
    /// Storage servers.
    Storage,
    /// Both.
    Both,
}

/// What a node is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Decided by the binary: inference in the store, storage in the storage server.
    Auto,
    /// An inference rank.
    Inference,
    /// A storage server.
    Storage,
}

/// Data-plane protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RDMA, falling back to TCP with one log line when no device exists.
    Rdma,
    /// TCP.
    Tcp,
}

/// Which RDMA backend `protocol = "rdma"` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaBackend {
    /// rdma-core devices (feature `rdma`).
    Verbs,
    /// The in-process software fabric (tests, demos).
    Soft,
}

/// RDMA devices, one rail each: one list for every rank, or one list per local rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Devices {
    /// The same devices on every rank (empty: `device_name`, else the first found).
    List(Vec<String>),
    /// Devices per local rank (`pp_rank × tp_size + tp_rank`).
    PerRank(BTreeMap<u32, Vec<String>>),
}

impl Default for Devices {
    fn default() -> Self {
        Devices::List(Vec::new())
    }
}

impl Devices {
    /// The devices of local rank `rank` (`None`: a per-rank map without that rank).
    pub fn for_rank(&self, rank: u32) -> Option<&[String]> {
        match self {
            Devices::List(l) => Some(l),
            Devices::PerRank(m) => m.get(&rank).map(Vec::as_slice),
        }
    }
}

/// The shared cluster secret. `Debug` prints `<redacted>`, and errors never echo it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret from text.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret text (empty: none set).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<none>"
        } else {
            "<redacted>"
        })
    }
}

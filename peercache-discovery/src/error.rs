//! The discovery error type.

use std::net::SocketAddr;
use std::time::Duration;

use peercache_wire::WireError;
use thiserror::Error;

/// Why discovery could not do what was asked.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// No seed address was configured.
    #[error("discovery_addr names no seed")]
    NoSeeds,
    /// A seed did not parse.
    #[error("bad discovery address {0:?}: expected host:port[,host:port…] sharing one port")]
    BadSeed(String),
    /// No discovery server registered this node in time.
    #[error(
        "no discovery server answered within {after:?} (seeds {seeds:?}); is a peercache-meta or node running there?"
    )]
    NotReady {
        /// How long we waited.
        after: Duration,
        /// Seeds tried.
        seeds: Vec<SocketAddr>,
    },
    /// `discovery = "etcd"` without an endpoint.
    #[error("etcd_endpoints names no endpoint")]
    NoEtcdEndpoints,
    /// etcd did not take this member in time.
    #[error(
        "etcd at {endpoints:?} did not take this member within {after:?}; is etcd running there, \
         and are etcd_user / etcd_password / the TLS files right?"
    )]
    EtcdNotReady {
        /// How long we waited.
        after: Duration,
        /// Endpoints tried.
        endpoints: Vec<String>,
    },
    /// A TLS file for etcd could not be read.
    #[error("reading {path}: {source}")]
    EtcdFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A client certificate without its key, or a key without its certificate.
    #[error("etcd_cert_file and etcd_key_file go together: set both or neither")]
    EtcdIdentityIncomplete,
    /// This build has no etcd client.
    #[error(
        "discovery = \"etcd\" needs a build with etcd support: \
         cargo build --release -p peercache-store --features etcd (needs protoc)"
    )]
    EtcdNotBuilt,
    /// The client was shut down.
    #[error("discovery client stopped")]
    Stopped,
    /// Network failure.
    #[error("discovery: {0}")]
    Wire(#[from] WireError),
}

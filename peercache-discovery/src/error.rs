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
    /// The client was shut down.
    #[error("discovery client stopped")]
    Stopped,
    /// Network failure.
    #[error("discovery: {0}")]
    Wire(#[from] WireError),
}

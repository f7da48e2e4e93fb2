//! `peercache-discovery`: who is alive.
//!
//! Multi-master soft state with no single point of failure. Every node tries to host a
//! discovery server on the cluster-wide meta port (a co-located rank that finds the port taken
//! is a client only). The masters are the `max_masters` live hosts that run a server: the
//! seeds of `discovery_addr`, pinned first in their order while alive, then the others in
//! address order. Every client registers and heartbeats to every master and every seed,
//! merges their answers, re-registers where a server does not know it, and publishes join,
//! leave and master-change events. Servers drop members whose heartbeats stop for a TTL;
//! a clean stop deregisters at once.
//!
//! * [`server_core`] and [`client_core`] — the protocol as pure state machines over
//!   `(state, message, now)`, tested with a simulated clock and hundreds of nodes.
//! * [`DiscoveryServer`] and [`DiscoveryClient`] — the socket shell on `peercache-wire`.
//! * [`Membership`] — either that client or, with the `etcd` feature, `EtcdClient`: members as
//!   etcd leases under `<prefix>/members/<node id>` and a watch on that prefix, for operators who
//!   already run etcd (`discovery = "etcd"`).
//! * [`derive_node_id`] — stable identities (never ephemeral ports or randomness);
//!   [`peercache_wire::Incarnation`] tells a restarted node's lives apart.

#![forbid(unsafe_code)]

pub mod admission;
mod client;
pub mod client_core;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod etcd_config;
#[cfg(feature = "etcd")]
mod etcd_view;
mod info;
mod membership;
pub mod metrics;
pub mod msg;
pub mod server_core;
mod service;

pub use admission::{Limits, Refusal};
pub use client::{DiscoveryClient, DiscoveryConfig};
pub use client_core::{ClientCore, Event, choose_masters};
pub use error::DiscoveryError;
#[cfg(feature = "etcd")]
pub use etcd::EtcdClient;
pub use etcd_config::{EtcdConfig, EtcdTls};
pub use info::{NodeInfo, derive_node_id};
pub use membership::{Membership, Source};
pub use msg::{DiscReply, DiscRequest};
pub use server_core::ServerCore;
pub use service::{DiscoveryServer, Hosting, META_FRAME_BUDGET};

/// Parses `discovery_addr`: `host:port` or a comma-separated seed list sharing one port.
pub fn parse_seeds(addr: &str) -> Result<Vec<std::net::SocketAddr>, DiscoveryError> {
    use std::net::ToSocketAddrs;
    let mut out = Vec::new();
    for part in addr.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let a = part
            .to_socket_addrs()
            .map_err(|_| DiscoveryError::BadSeed(part.to_string()))?
            .next()
            .ok_or_else(|| DiscoveryError::BadSeed(part.to_string()))?;
        out.push(a);
    }
    if out.is_empty() {
        return Err(DiscoveryError::NoSeeds);
    }
    if out.iter().any(|a| a.port() != out[0].port()) {
        return Err(DiscoveryError::BadSeed(format!(
            "{addr}: every seed must use the same meta port"
        )));
    }
    Ok(out)
}

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

//! `peercache-transport`: the PeerCache data plane.
//!
//! A node registers memory regions with an [`Access`] level; peers read from and write into
//! them by `(region key, address, length)` without the owner's code touching each page. The
//! unit of work is a [`Batch`]: each op names one remote range and a list of local segments
//! (scatter/gather), so a header and a payload, K and V, or many layers land where they belong
//! in one call.
//!
//! The TCP engine ([`TcpTransport`]) serves only registered regions with the right access
//! (bounds, key and access checked per op), keeps a per-peer pool of connections, streams
//! payloads with vectored I/O straight between registered memory and the socket (no
//! intermediate buffer, no per-page allocation) and bounds every wait with `op_timeout`.
//! After a timeout the peer is marked suspect for a short time so callers fail fast.

mod batch;
mod client;
mod config;
mod error;
mod iov;
pub mod metrics;
mod proto;
pub mod rdma;
mod region;
mod server;
mod stats;
mod tcp;

pub use batch::{Batch, OpDesc, RemoteRange, Segment};
pub use config::TransportConfig;
pub use error::{OpError, TransportError};
pub use region::{Access, RegionHandle, RegionKey};
pub use stats::{PeerStats, TransportStats};
pub use tcp::TcpTransport;

/// Per-op outcome of a batch, in op order.
pub type OpResults = Vec<Result<(), OpError>>;

//! `peercache-store`: a PeerCache node.
//!
//! Composes the four lower crates — transport (data plane), pool (published memory),
//! directory (where pages live) and discovery (who is alive) — into a node runtime with the
//! HiCache-shaped, blocking, thread-safe API of [`Store`]:
//!
//! * **write** — copy into the pool as *retained*, insert into the directory with one batched
//!   call per shard; a key already stored is answered locally; eviction notices go through a
//!   background batcher flushed on shutdown;
//! * **exists** — one directory fan-out; the leading present pages' locations are primed for
//!   the next get;
//! * **read** — local owner: copy under a lease; remote owner: one transport batch per owner
//!   straight into the destination, then verification of generation, key and checksum (a
//!   mismatch is a counted miss, never wrong bytes);
//! * **device read** — [`Store::batch_get_device`]: remote pages one-sided over RDMA straight
//!   into registered GPU memory (GPUDirect), verified by their slot header read before and
//!   after the payload.
//!
//! [`PeerCacheConfig`] holds every setting; the binaries in `src/bin/` are thin wrappers over
//! [`tools::cli`] (with the [`tools::status`], [`tools::drive`] and [`tools::locate`] tools). [`client`] lets a process that does not
//! embed a node put, get and check pages through one (`client_enabled`).

pub mod client;
pub mod config;
pub mod control;
mod error;
mod events;
pub mod layout;
mod modes;
mod node;
pub mod observe;
mod read;
mod serve;
mod tasks;
pub mod tools;

pub use config::{
    ConfigError, DiscoveryKind, Mode, PeerCacheConfig, Protocol, RdmaBackend, Role, WritePolicy,
};
pub use error::StoreError;
pub use node::keys::Keyspace;
pub use node::stats::StoreStats;
pub use node::store::Store;
pub use peercache_transport::DeviceMemory;
pub use read::prefix::{PrefixRun, prefix_json, prefix_runs, prefix_runs_in, prefix_runs_of};
pub use read::scratch::RawSeg;

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

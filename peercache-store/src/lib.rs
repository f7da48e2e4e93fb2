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
//! [`cli`] (with the [`status`], [`drive`] and [`locate`] tools). [`client`] lets a process that does not
//! embed a node put, get and check pages through one (`client_enabled`).

mod base;
mod central;
pub mod cli;
pub mod client;
pub mod config;
pub mod control;
mod device_read;
pub mod drive;
mod error;
mod evict;
mod exists;
mod fdlimit;
mod http;
pub mod keys;
pub mod locate;
pub mod metrics;
mod mode_state;
mod node;
pub mod observe;
pub mod page_layout;
mod parts;
mod prefix;
mod prime;
mod promote;
mod promotion;
mod read;
mod read_plan;
pub mod read_timing;
mod republish;
mod scratch;
pub mod slot_layout;
mod slotmode;
mod start;
pub mod status;
mod storage_view;
mod store;
mod store_rpc;
pub mod tool;
mod write;

pub use config::{
    ConfigError, DiscoveryKind, Mode, PeerCacheConfig, Protocol, RdmaBackend, Role, WritePolicy,
};
pub use error::StoreError;
pub use keys::Keyspace;
pub use peercache_transport::DeviceMemory;
pub use prefix::{PrefixRun, prefix_runs};
pub use scratch::RawSeg;
pub use store::{Store, StoreStats};

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

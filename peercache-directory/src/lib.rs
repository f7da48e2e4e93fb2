//! `peercache-directory`: where pages live.
//!
//! Every node holds one [`Shard`] of a directory that maps a page key to the locations of its
//! data owners; the shards that own a key are found on a consistent-hash [`Ring`] of the live
//! members (`directory_replicas` owners per entry). There is no central metadata server.
//!
//! * [`ring`] — our own ring on `xxh3_64`, with committed test vectors.
//! * [`shard`] — the sans-IO shard: insert (with the "≥3 live owners" reclaimable hint),
//!   lookup, exists, owner-conditional remove, mark non-resident, bounded memory; each owner's
//!   node, incarnation, rails and page layout are kept once per owner, not per entry.
//! * [`changes`] — the shard's journal of copies that appeared and went, for a node's KV
//!   events.
//! * [`msg`] — the wire messages and their non-critical extensions (hand-off hints, layouts).
//! * [`handoff`] — which entries move when the ring changes (only those whose owners changed).
//! * [`service`] and [`client`] — the thin RPC shell on `peercache-wire`: the client groups
//!   keys by shard, sends one request per shard per batch to all shards at once, splits large
//!   batches, and falls back to replicas.
//! * `testbed` (feature `testbed`) — a fleet of shards on loopback in one process, for
//!   recovery tests and the bench: a node killed or restarted, what moved, what a reader sees.

#![forbid(unsafe_code)]

pub mod admission;
mod arena;
pub mod changes;
pub mod client;
mod error;
pub mod handoff;
pub mod holding;
mod key_index;
pub mod location;
pub mod metrics;
pub mod msg;
mod owner_table;
mod receiving;
pub mod ring;
pub mod service;
pub mod shard;
#[cfg(feature = "testbed")]
pub mod testbed;

pub use changes::{Change, ChangeKind};
pub use client::{ClientConfig, DirectoryClient, HandoffReport, Member};
pub use error::DirError;
pub use holding::{Holding, KeyHolders};
pub use location::{CopyClass, Location, Owners, Rail};
pub use msg::{DirReply, DirRequest, OwnerRef};
pub use receiving::SENDER_WAIT;
pub use ring::Ring;
pub use service::DirectoryService;
pub use shard::{InsertOutcome, Shard, ShardConfig};

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

//! Metric names of the directory.

/// Entries in this node's shard.
pub const SHARD_ENTRIES: &str = "peercache_directory_shard_entries";
/// Directory RPCs sent, label `op`.
pub const RPCS_TOTAL: &str = "peercache_directory_rpcs_total";
/// Directory RPCs that failed.
pub const RPC_ERRORS_TOTAL: &str = "peercache_directory_rpc_errors_total";
/// Lookups retried on a replica.
pub const FALLBACKS_TOTAL: &str = "peercache_directory_fallbacks_total";
/// Entries handed off to new owners.
pub const HANDOFF_SENT_TOTAL: &str = "peercache_directory_handoff_sent_total";
/// Entries dropped after their ownership moved.
pub const HANDOFF_DROPPED_TOTAL: &str = "peercache_directory_handoff_dropped_total";
/// Malformed directory requests.
pub const MALFORMED_TOTAL: &str = "peercache_directory_malformed_total";

//! [`StoreStats`]: a node's counters at one moment ([`Store::stats`](crate::Store::stats)).

/// Counters of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Pages resident in the pool.
    pub pool_pages: u64,
    /// Pages evicted from the pool.
    pub pool_evictions: u64,
    /// Eviction notices queued.
    pub evictions_queued: u64,
    /// Eviction notices delivered.
    pub evictions_notified: u64,
    /// Directory requests sent over the network.
    pub directory_rpcs: u64,
    /// Directory requests answered by the local shard.
    pub directory_local_calls: u64,
    /// Entries in this node's directory shard.
    pub shard_entries: u64,
    /// Bytes read from peers by the transport.
    pub transport_read_bytes: u64,
    /// Of `transport_read_bytes`: bytes copied from a same-host peer's shared memory.
    pub transport_local_read_bytes: u64,
    /// Members known.
    pub members: u64,
    /// Locations primed by `batch_exists` and not yet consumed.
    pub primed: u64,
    /// Remote pages rejected by verification (stale, torn, wrong key or checksum).
    pub verify_rejects: u64,
    /// Pages found but refused because their layout fingerprint is not this node's (another
    /// deployment's pages under the same keys, or pages written before layouts existed).
    pub layout_mismatches: u64,
    /// Pages read through registered staging memory and then copied to the caller, because
    /// the caller's destination lies outside every registered host buffer (or the mode reads
    /// into staging to verify first, as slotmap does). 0 on the zero-copy paths.
    pub staged_reads: u64,
    /// Bytes read over the RDMA path (0 on TCP).
    pub rdma_read_bytes: u64,
    /// Read batches the RDMA path handed to TCP (peers without RDMA).
    pub rdma_fallbacks: u64,
    /// Requests refused because they acted for another member: store requests for another
    /// writer's reservations, and directory requests on this node's shard naming another
    /// node's copies or a range the sender never held.
    pub identity_refused: u64,
    /// Slotmap layouts of peers refused as out of this node's bounds (their keys are misses).
    pub layouts_refused: u64,
    /// Pages the disk tier recovered after a restart that the directory took back (re-published
    /// as this node's disk-only copies).
    pub disk_republished: u64,
    /// Pages a router's hint located: read from the hinted node, no directory lookup
    /// ([`Store::batch_get_hinted`](crate::Store::batch_get_hinted)).
    pub read_hint_hits: u64,
    /// Pages a hint named that the hinted node did not hold (looked up in the directory).
    pub read_hint_misses: u64,
}

//! Metric names of the store (kept from the original so existing dashboards work) and the
//! handles resolved once per node (every series carries `node=<id>`).

use peercache_wire::tally::Tally;

peercache_wire::metric_names! {
    /// Connections the metrics HTTP port closed at accept because it held its connection cap.
    pub const HTTP_REFUSED: &str = "peercache_http_connections_refused_total";
    /// Requests for `/cluster` refused because they did not carry the `http_token_file` token.
    pub const HTTP_UNAUTHORIZED: &str = "peercache_http_unauthorized_total";
    /// KV-event batches published (docs/routing.md).
    pub const KV_EVENT_BATCHES: &str = "peercache_kv_event_batches_total";
    /// KV-event batches a slow subscriber missed (the sequence numbers show it the gap).
    pub const KV_EVENT_MISSED: &str = "peercache_kv_event_batches_missed_total";
    /// Shard changes past the journal's cap: subscribers were told to start over and sent the
    /// state.
    pub const KV_EVENT_LOST: &str = "peercache_kv_event_changes_lost_total";
    /// KV-event replay requests served.
    pub const KV_EVENT_REPLAYS: &str = "peercache_kv_event_replays_total";
    /// KV-event connections refused: over the cap, a failed greeting or a wrong socket type.
    pub const KV_EVENT_REFUSED: &str = "peercache_kv_event_connections_refused_total";
    /// KV-event subscribers connected now.
    pub const KV_EVENT_SUBSCRIBERS: &str = "peercache_kv_event_subscribers";
    /// Pages asked for by `batch_get`.
    pub const READ_REQUESTS: &str = "peercache_read_requests_total";
    /// Pages served.
    pub const READ_HITS: &str = "peercache_read_hits_total";
    /// Pages not served.
    pub const READ_MISSES: &str = "peercache_read_misses_total";
    /// Pages served from this node's pool.
    pub const READ_LOCAL_HITS: &str = "peercache_read_local_hits_total";
    /// Pages served from a peer.
    pub const READ_REMOTE_HITS: &str = "peercache_read_remote_hits_total";
    /// Pages served from this node's disk tier.
    pub const READ_DISK_HITS: &str = "peercache_read_disk_hits_total";
    /// Disk-tier pages promoted back into the pool: `side="owner"` counts promotions this node
    /// did (for itself or a peer), `side="reader"` pages this node asked a peer to promote.
    pub const DISK_PROMOTES: &str = "peercache_disk_promotes_total";
    /// Pages fetched from peers and kept as local reclaimable replicas (`replicate_on_read`).
    pub const READ_REPLICAS: &str = "peercache_read_replicas_total";
    /// Pages written into storage servers (centralized / hybrid), and of those sent by the ingest
    /// fallback after a failed one-sided write.
    pub const STORAGE_WRITES: &str = "peercache_storage_writes_total";
    /// Pages sent with their bytes after a failed one-sided write into a storage server.
    pub const STORAGE_INGESTS: &str = "peercache_storage_ingests_total";
    /// Storage-server commits refused because the slot's bytes differ from the writer's checksum
    /// (a torn or stray one-sided write).
    pub const COMMIT_REJECTS: &str = "peercache_storage_commit_rejects_total";
    /// Slotmap layouts announced by peers and refused because they fall outside the bounds this
    /// node's own configuration allows (that member's keys are misses).
    pub const LAYOUTS_REFUSED: &str = "peercache_slotmap_layouts_refused_total";
    /// Storage-server reservations released because the writer never committed.
    pub const RESERVATIONS_EXPIRED: &str = "peercache_storage_reservations_expired_total";
    /// Page locations announced to directory replicas that a ring change added.
    pub const DIRECTORY_REANNOUNCES: &str = "peercache_directory_reannounced_total";
    /// Pages re-published to the directory (recovered from the disk tier after a restart).
    pub const DIRECTORY_REPUBLISHES: &str = "peercache_directory_republishes_total";
    /// Pages resident in the pool.
    pub const POOL_KEYS: &str = "peercache_pool_keys";
    /// Read hits / read requests since start.
    pub const READ_HIT_RATE: &str = "peercache_read_hit_rate";
    /// Seconds since the node started.
    pub const UPTIME: &str = "peercache_uptime_seconds";
    /// Pages found in the directory whose read failed (network, or verification).
    pub const READ_FAILURES: &str = "peercache_read_failures_total";
    /// Remote pages rejected by verification (stale slot, torn copy, wrong key or checksum).
    pub const VERIFY_REJECTS: &str = "peercache_verify_rejects_total";
    /// Pages found but refused because their layout fingerprint (model, KV dtype, geometry,
    /// ranks) is not the reader's: a counted miss, never bytes of the wrong shape.
    pub const LAYOUT_MISMATCHES: &str = "peercache_layout_mismatch_total";
    /// Pages read through staging memory and copied to the caller (destination not registered).
    pub const STAGED_READS: &str = "peercache_read_staged_pages_total";
    /// `batch_set` calls.
    pub const WRITE_REQUESTS: &str = "peercache_write_requests_total";
    /// Payload bytes read.
    pub const BYTES_READ: &str = "peercache_bytes_read_total";
    /// Payload bytes written into the pool.
    pub const BYTES_WRITTEN: &str = "peercache_bytes_written_total";
    /// Client-API pages refused because another node already holds the key with other bytes.
    pub const CLIENT_OVERWRITES_REFUSED: &str = "peercache_client_overwrites_refused_total";
    /// Read batches whose directory lookup failed (shard owners unreachable or timed out):
    /// their pages missed.
    pub const LOOKUP_FAILURES: &str = "peercache_read_lookup_failures_total";
    /// Pages evicted from the pool.
    pub const EVICTIONS: &str = "peercache_evictions_total";
    /// Eviction notices sent to the directory.
    pub const EVICTION_NOTICES: &str = "peercache_eviction_notices_total";
    /// Evicted pages queued for an eviction notice.
    pub const EVICTION_NOTICES_QUEUED: &str = "peercache_eviction_notices_queued_total";
    /// Eviction notices the directory did not take (the entries fail verification and expire).
    pub const EVICTION_NOTICES_FAILED: &str = "peercache_eviction_notices_failed_total";
    /// Pages looked up without the directory: answered by this node's own pool, or by the
    /// exists → get hand-off or the read cache.
    pub const LOOKUPS_SAVED: &str = "peercache_directory_lookups_saved_total";
    /// Pages a router's hint located (read from the hinted node, no directory lookup).
    pub const READ_HINT_HITS: &str = "peercache_read_hint_hits_total";
    /// Pages a router's hint named that the hinted node did not hold (looked up in the
    /// directory instead).
    pub const READ_HINT_MISSES: &str = "peercache_read_hint_misses_total";
    /// `batch_exists` calls.
    pub const EXISTS_REQUESTS: &str = "peercache_exists_requests_total";
    /// Leading pages found by `batch_exists`.
    pub const EXISTS_PAGES_FOUND: &str = "peercache_exists_pages_found_total";
    /// Latency of one API call (a batch), label `op` = `read` | `write` | `exists`.
    pub const OP_LATENCY: &str = "peercache_op_latency_seconds";
    /// Members seen by discovery.
    pub const MEMBERS: &str = "peercache_members";
    /// Members with `role = "storage"` (storage servers of the centralized and hybrid modes).
    pub const STORAGE_NODES: &str = "peercache_storage_nodes";
    /// Pages indexed by this node's disk tier (0 with the tier off).
    pub const DISK_KEYS: &str = "peercache_disk_keys";
    /// Bytes of the disk tier's segments on disk.
    pub const DISK_BYTES_USED: &str = "peercache_disk_bytes_used";
    /// The disk tier's capacity in bytes (`disk_capacity`; 0 with the tier off).
    pub const DISK_CAPACITY: &str = "peercache_disk_capacity_bytes";
}

/// Describes every series of this crate and the ones below it (their `# HELP` lines), in
/// the recorder installed for the call.
pub(crate) fn describe_all() {
    use peercache_wire::describe::describe;
    describe(DESCRIPTIONS);
    describe(peercache_wire::metrics::DESCRIPTIONS);
    describe(peercache_transport::metrics::DESCRIPTIONS);
    describe(peercache_transport::metrics::rdma::DESCRIPTIONS);
    describe(peercache_transport::metrics::rdma::compat::DESCRIPTIONS);
    describe(peercache_directory::metrics::DESCRIPTIONS);
    describe(peercache_discovery::metrics::DESCRIPTIONS);
    describe(peercache_pool::metrics::DESCRIPTIONS);
}

/// Registers at 0 the series the lower crates create only when their part runs — the RDMA
/// path, the disk tier, authentication — so a dashboard, an alert or a newcomer's grep finds
/// every documented series on every node from its start. (A counter registered twice is one
/// series: the part that runs later counts into the same one.)
fn register_idle_series(node: &str) {
    let zero = |name: &'static str| {
        metrics::counter!(name, "node" => node.to_string()).increment(0);
    };
    // Runs under the node's recorder, which adds `node`.
    peercache_transport::metrics::register_rdma_series();
    peercache_pool::metrics::DISK_COUNTERS
        .iter()
        .chain(&[
            peercache_wire::metrics::AUTH_REJECTED_TOTAL,
            peercache_discovery::metrics::ETCD_SESSIONS_TOTAL,
        ])
        .for_each(|name| zero(name));
    // Added to, not set: a disk tier that already disabled itself keeps its 1, one still
    // scanning its previous run keeps its 1.
    for gauge in [
        peercache_pool::metrics::DISK_DISABLED,
        peercache_pool::metrics::DISK_RECOVERING,
    ] {
        metrics::gauge!(gauge, "node" => node.to_string()).increment(0.0);
    }
    // 0 with the built-in discovery; the etcd client moves the same series.
    metrics::gauge!(peercache_discovery::metrics::STALE, "node" => node.to_string()).increment(0.0);
}

/// Handles of one node.
#[derive(Clone)]
pub(crate) struct Handles {
    pub(crate) read_requests: Tally,
    pub(crate) read_hits: Tally,
    pub(crate) read_misses: Tally,
    pub(crate) read_local_hits: Tally,
    pub(crate) read_remote_hits: Tally,
    pub(crate) read_failures: Tally,
    /// Read batches whose directory lookup failed ([`LOOKUP_FAILURES`]).
    pub(crate) lookup_failures: Tally,
    pub(crate) verify_rejects: Tally,
    pub(crate) layout_mismatches: Tally,
    pub(crate) staged_reads: Tally,
    pub(crate) write_requests: Tally,
    pub(crate) bytes_read: Tally,
    pub(crate) bytes_written: Tally,
    pub(crate) evictions: Tally,
    pub(crate) lookups_saved: Tally,
    pub(crate) read_hint_hits: Tally,
    pub(crate) read_hint_misses: Tally,
    pub(crate) exists_requests: Tally,
    pub(crate) exists_pages_found: Tally,
    pub(crate) read_latency: metrics::Histogram,
    pub(crate) write_latency: metrics::Histogram,
    pub(crate) exists_latency: metrics::Histogram,
    pub(crate) members: metrics::Gauge,
    pub(crate) storage_nodes: metrics::Gauge,
    pub(crate) disk_keys: metrics::Gauge,
    pub(crate) disk_bytes_used: metrics::Gauge,
    /// Set once the disk tier opened (0 without one).
    pub(crate) disk_capacity: metrics::Gauge,
    pub(crate) read_disk_hits: Tally,
    pub(crate) promotes_owner: Tally,
    pub(crate) replicas: Tally,
    pub(crate) reannounced: Tally,
    pub(crate) storage_writes: Tally,
    pub(crate) storage_ingests: Tally,
    pub(crate) commit_rejects: Tally,
    /// Store requests that acted for another writer
    /// (`peercache_identity_refused_total{service="store"}`).
    pub(crate) identity_refused: Tally,
    /// Peers' slotmap layouts refused as out of bounds ([`LAYOUTS_REFUSED`]).
    pub(crate) layouts_refused: Tally,
    /// Client puts of keys another node holds with other bytes ([`CLIENT_OVERWRITES_REFUSED`]).
    pub(crate) overwrites_refused: Tally,
    pub(crate) reservations_expired: Tally,
    pub(crate) promotes_asked: Tally,
    pub(crate) republishes: Tally,
    pub(crate) pool_keys: metrics::Gauge,
    pub(crate) hit_rate: metrics::Gauge,
    pub(crate) uptime: metrics::Gauge,
    pub(crate) started: std::time::Instant,
}

impl Handles {
    /// Refreshes the derived gauges (called about once per heartbeat).
    pub(crate) fn refresh(&self, pool_keys: u64, disk: Option<&peercache_pool::disk::DiskStats>) {
        self.uptime.set(self.started.elapsed().as_secs_f64());
        self.pool_keys.set(pool_keys as f64);
        if let Some(d) = disk {
            self.disk_keys.set(d.keys as f64);
            self.disk_bytes_used.set(d.bytes as f64);
        }
        let req = self.read_requests.get();
        if req > 0 {
            self.hit_rate.set(self.read_hits.get() as f64 / req as f64);
        }
    }

    pub(crate) fn register(node: &str) -> Self {
        register_idle_series(node);
        let n = node.to_string();
        let c = |name: &'static str| Tally::new(metrics::counter!(name, "node" => n.clone()));
        Handles {
            read_requests: c(READ_REQUESTS),
            read_hits: c(READ_HITS),
            read_misses: c(READ_MISSES),
            read_local_hits: c(READ_LOCAL_HITS),
            read_remote_hits: c(READ_REMOTE_HITS),
            read_failures: c(READ_FAILURES),
            lookup_failures: c(LOOKUP_FAILURES),
            verify_rejects: c(VERIFY_REJECTS),
            layout_mismatches: c(LAYOUT_MISMATCHES),
            staged_reads: c(STAGED_READS),
            write_requests: c(WRITE_REQUESTS),
            bytes_read: c(BYTES_READ),
            bytes_written: c(BYTES_WRITTEN),
            evictions: c(EVICTIONS),
            lookups_saved: c(LOOKUPS_SAVED),
            read_hint_hits: c(READ_HINT_HITS),
            read_hint_misses: c(READ_HINT_MISSES),
            exists_requests: c(EXISTS_REQUESTS),
            exists_pages_found: c(EXISTS_PAGES_FOUND),
            read_latency: metrics::histogram!(OP_LATENCY, "op" => "read", "node" => n.clone()),
            write_latency: metrics::histogram!(OP_LATENCY, "op" => "write", "node" => n.clone()),
            exists_latency: metrics::histogram!(OP_LATENCY, "op" => "exists", "node" => n.clone()),
            members: metrics::gauge!(MEMBERS, "node" => n.clone()),
            storage_nodes: metrics::gauge!(STORAGE_NODES, "node" => n.clone()),
            disk_keys: metrics::gauge!(DISK_KEYS, "node" => n.clone()),
            disk_bytes_used: metrics::gauge!(DISK_BYTES_USED, "node" => n.clone()),
            disk_capacity: metrics::gauge!(DISK_CAPACITY, "node" => n.clone()),
            read_disk_hits: c(READ_DISK_HITS),
            replicas: c(READ_REPLICAS),
            reannounced: c(DIRECTORY_REANNOUNCES),
            storage_writes: c(STORAGE_WRITES),
            storage_ingests: c(STORAGE_INGESTS),
            commit_rejects: c(COMMIT_REJECTS),
            identity_refused: Tally::new(metrics::counter!(
                peercache_wire::metrics::IDENTITY_REFUSED_TOTAL,
                "service" => "store",
                "node" => n.clone()
            )),
            reservations_expired: c(RESERVATIONS_EXPIRED),
            layouts_refused: c(LAYOUTS_REFUSED),
            overwrites_refused: c(CLIENT_OVERWRITES_REFUSED),
            promotes_owner: Tally::new(
                metrics::counter!(DISK_PROMOTES, "side" => "owner", "node" => n.clone()),
            ),
            promotes_asked: Tally::new(
                metrics::counter!(DISK_PROMOTES, "side" => "reader", "node" => n.clone()),
            ),
            republishes: c(DIRECTORY_REPUBLISHES),
            pool_keys: metrics::gauge!(POOL_KEYS, "node" => n.clone()),
            hit_rate: metrics::gauge!(READ_HIT_RATE, "node" => n.clone()),
            uptime: metrics::gauge!(UPTIME, "node" => n.clone()),
            started: std::time::Instant::now(),
        }
    }
}

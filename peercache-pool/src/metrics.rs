//! Metric names of the pool, and handles resolved once at construction.

use metrics::{Counter, Gauge};
use peercache_wire::tally::Tally;

use crate::header::VerifyError;

peercache_wire::metric_names! {
    /// Pages resident, label `class` = `retained` | `reclaimable`.
    pub const PAGES: &str = "peercache_pool_pages";
    /// Bytes of payload resident.
    pub const BYTES_USED: &str = "peercache_pool_bytes_used";
    /// Pool capacity in bytes.
    pub const CAPACITY: &str = "peercache_pool_capacity_bytes";
    /// Pool bytes faulted in and usable (equal to the capacity's whole slabs once warm).
    pub const READY_BYTES: &str = "peercache_pool_ready_bytes";
    /// Pages evicted, label `class`.
    pub const EVICTIONS_TOTAL: &str = "peercache_pool_evictions_total";
    /// Pages published (new).
    pub const PUBLISHED_TOTAL: &str = "peercache_pool_published_total";
    /// Publishes of a key already present (answered locally).
    pub const DUPLICATES_TOTAL: &str = "peercache_pool_duplicates_total";
    /// Slabs moved from one size class to another.
    pub const SLAB_STEALS_TOTAL: &str = "peercache_pool_slab_steals_total";
    /// Reads rejected by verification, label `reason`.
    pub const VERIFY_REJECTS_TOTAL: &str = "peercache_pool_verify_rejects_total";
    /// Requests refused with a typed error, label `reason`.
    pub const REJECTS_TOTAL: &str = "peercache_pool_rejects_total";

    /// Records written to the disk tier.
    pub const DISK_WRITES_TOTAL: &str = "peercache_disk_writes_total";
    /// Payload bytes written to the disk tier.
    pub const DISK_BYTES_WRITTEN_TOTAL: &str = "peercache_disk_bytes_written_total";
    /// Records read back from the disk tier.
    pub const DISK_READS_TOTAL: &str = "peercache_disk_reads_total";
    /// Records deleted with their segment to stay within the disk tier's capacity.
    pub const DISK_EVICTIONS_TOTAL: &str = "peercache_disk_evictions_total";
    /// Records found by the disk tier's recovery scan at start.
    pub const DISK_RECOVERED_TOTAL: &str = "peercache_disk_recovered_total";
    /// Disk writes skipped because the queue was full.
    pub const DISK_DROPPED_TOTAL: &str = "peercache_disk_dropped_total";
    /// 1 once a failed write disabled the disk tier.
    pub const DISK_DISABLED: &str = "peercache_disk_disabled";
    /// Pages promoted from the disk tier back into the pool.
    pub const PROMOTES_TOTAL: &str = "peercache_promotes_total";
    /// Torn or corrupt disk records found.
    pub const DISK_CORRUPT_TOTAL: &str = "peercache_disk_corrupt_total";
    /// 1 while the disk tier's recovery scan of a previous run's segments runs (the node
    /// serves meanwhile; the scanned pages are re-published once it ends), else 0.
    pub const DISK_RECOVERING: &str = "peercache_disk_recovering";
}

/// The disk tier's counters: a node with the tier off registers them at 0, so a dashboard finds
/// the same series on every node.
pub const DISK_COUNTERS: &[&str] = &[
    DISK_WRITES_TOTAL,
    DISK_BYTES_WRITTEN_TOTAL,
    DISK_READS_TOTAL,
    DISK_EVICTIONS_TOTAL,
    DISK_RECOVERED_TOTAL,
    DISK_DROPPED_TOTAL,
    DISK_CORRUPT_TOTAL,
    PROMOTES_TOTAL,
];

#[derive(Clone)]
pub(crate) struct Handles {
    pub(crate) pages: [Gauge; 2],
    pub(crate) evictions: [Counter; 2],
    pub(crate) bytes_used: Gauge,
    pub(crate) published: Counter,
    pub(crate) duplicates: Counter,
    pub(crate) slab_steals: Counter,
    pub(crate) ready_bytes: Gauge,
    /// Reads rejected by verification, by [`VerifyError::kind`].
    pub(crate) verify_rejects: [Tally; VerifyError::KINDS.len()],
}

impl Handles {
    pub(crate) fn register(capacity: u64) -> Self {
        metrics::gauge!(CAPACITY).set(capacity as f64);
        Handles {
            pages: [
                metrics::gauge!(PAGES, "class" => "retained"),
                metrics::gauge!(PAGES, "class" => "reclaimable"),
            ],
            evictions: [
                metrics::counter!(EVICTIONS_TOTAL, "class" => "retained"),
                metrics::counter!(EVICTIONS_TOTAL, "class" => "reclaimable"),
            ],
            bytes_used: metrics::gauge!(BYTES_USED),
            published: metrics::counter!(PUBLISHED_TOTAL),
            duplicates: metrics::counter!(DUPLICATES_TOTAL),
            slab_steals: metrics::counter!(SLAB_STEALS_TOTAL),
            ready_bytes: metrics::gauge!(READY_BYTES),
            verify_rejects: VerifyError::KINDS
                .map(|r| Tally::new(metrics::counter!(VERIFY_REJECTS_TOTAL, "reason" => r))),
        }
    }
}

/// The disk tier's counters.
pub(crate) struct DiskCounters {
    pub(crate) writes: Tally,
    pub(crate) bytes_written: Tally,
    pub(crate) dropped: Tally,
    pub(crate) evictions: Tally,
    pub(crate) corrupt: Tally,
    pub(crate) recovered: Tally,
    pub(crate) reads: Tally,
    /// [`DISK_RECOVERING`].
    pub(crate) recovering: Gauge,
}

impl DiskCounters {
    pub(crate) fn register() -> Self {
        let t = |name: &'static str| Tally::new(metrics::counter!(name));
        DiskCounters {
            writes: t(DISK_WRITES_TOTAL),
            bytes_written: t(DISK_BYTES_WRITTEN_TOTAL),
            dropped: t(DISK_DROPPED_TOTAL),
            evictions: t(DISK_EVICTIONS_TOTAL),
            corrupt: t(DISK_CORRUPT_TOTAL),
            recovered: t(DISK_RECOVERED_TOTAL),
            reads: t(DISK_READS_TOTAL),
            recovering: metrics::gauge!(DISK_RECOVERING),
        }
    }
}

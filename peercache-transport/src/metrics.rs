//! Every metric name of the transport, and the [`Tally`] counters behind both the series and
//! [`crate::Transport::stats`] (the store installs the recorder).
//!
//! Counters are incremented once per batch with the batch's totals, never per page.

use peercache_wire::tally::Tally;

use crate::{Batch, OpError, OpResults};

peercache_wire::metric_names! {
    /// Ops served or issued, label `op` = `read` | `write`, `side` = `client` | `server`.
    pub const OPS_TOTAL: &str = "peercache_transport_ops_total";
    /// Payload bytes moved, same labels as [`OPS_TOTAL`].
    pub const BYTES_TOTAL: &str = "peercache_transport_bytes_total";
    /// Failed ops, label `kind` = the [`crate::OpError::label`], `connection` (a batch lost with
    /// its connection) or `served_op` (an op this node's server refused).
    pub const ERRORS_TOTAL: &str = "peercache_transport_errors_total";
    /// Batches that hit their deadline.
    pub const TIMEOUTS_TOTAL: &str = "peercache_transport_timeouts_total";
    /// Times a peer was marked suspect.
    pub const SUSPECT_MARKS_TOTAL: &str = "peercache_transport_suspect_marks_total";
    /// Batches failed fast because their peer was suspect.
    pub const SUSPECT_REJECTS_TOTAL: &str = "peercache_transport_suspect_rejects_total";
    /// Connections opened to peers.
    pub const CONNECTS_TOTAL: &str = "peercache_transport_connects_total";
    /// Connections to peers dropped after an error.
    pub const CONN_DISCARDS_TOTAL: &str = "peercache_transport_conn_discards_total";
    /// Inbound data connections closed because the stream could not be trusted.
    pub const SERVER_DESYNCS_TOTAL: &str = "peercache_transport_server_desyncs_total";
    /// Of the client's read ops: ops copied from a peer's shared memory (host-local path).
    pub const LOCAL_READ_OPS_TOTAL: &str = "peercache_transport_local_read_ops_total";
    /// Of the client's read bytes: bytes copied from a peer's shared memory (host-local path).
    pub const LOCAL_READ_BYTES_TOTAL: &str = "peercache_transport_local_read_bytes_total";
    /// Times this node attached to a peer's shared regions.
    pub const LOCAL_ATTACHES_TOTAL: &str = "peercache_transport_local_attaches_total";
}

/// Metric names of the RDMA path (also `rdma::path::metric`).
pub mod rdma {
    peercache_wire::metric_names! {
        /// Read ops carried over RDMA.
        pub const OPS: &str = "peercache_rdma_read_ops_total";
        /// Bytes read over RDMA.
        pub const BYTES: &str = "peercache_rdma_read_bytes_total";
        /// Write ops carried over RDMA (`rdma_writes`).
        pub const WRITE_OPS: &str = "peercache_rdma_write_ops_total";
        /// Bytes written over RDMA (`rdma_writes`).
        pub const WRITE_BYTES: &str = "peercache_rdma_write_bytes_total";
        /// Ops that failed over RDMA.
        pub const OP_ERRORS: &str = "peercache_rdma_op_errors_total";
        /// Caller memory registered because no cached registration covered it (lazy
        /// registration; kept in the lazy-MR cache afterwards).
        pub const LAZY: &str = "peercache_rdma_lazy_registrations_total";
        /// Caller ranges served by a cached lazy registration (no registration needed).
        pub const LAZY_HITS: &str = "peercache_rdma_lazy_mr_hits_total";
        /// Read batches handed to TCP.
        pub const FALLBACKS: &str = "peercache_rdma_fallbacks_total";
        /// Region tables fetched from peers.
        pub const TABLE_FETCHES: &str = "peercache_rdma_table_fetches_total";
        /// Work requests posted.
        pub const WORK_REQUESTS: &str = "peercache_rdma_work_requests_total";
        /// Work completions with an error status, label `op` = `read` | `write`.
        pub const WC_ERRORS: &str = "peercache_rdma_wc_errors_total";
        /// Windows that missed their deadline, label `op` = `read` | `write`.
        pub const TIMEOUTS: &str = "peercache_rdma_timeouts_total";
        /// Queue pairs discarded.
        pub const DISCARDS: &str = "peercache_rdma_channel_discards_total";
        /// Failed posts.
        pub const POST_FAILURES: &str = "peercache_rdma_post_failures_total";
        /// Channels that could not be leased (queue-pair connects that failed).
        pub const LEASE_FAILURES: &str = "peercache_rdma_lease_failures_total";
        /// Batches (per rail) that waited for a channel until their deadline: every queue pair
        /// `max_channels_per_peer` allows to that peer was in use.
        pub const LEASE_TIMEOUTS: &str = "peercache_rdma_lease_timeouts_total";
        /// Queue pairs whose drain did not finish within the grace after an error or a timeout
        /// (destroyed instead, which stops their DMA before the batch returns).
        pub const DRAIN_TIMEOUTS: &str = "peercache_rdma_drain_timeouts_total";
        /// Times a peer was left on TCP for a while because its RDMA setup (region table or every
        /// queue-pair connect) failed.
        pub const PEERS_UNAVAILABLE: &str = "peercache_rdma_peers_unavailable_total";
        /// Bytes of this node's regions registered with the NIC so far (a region registered
        /// in chunks counts the chunks done).
        pub const REGISTERED_BYTES: &str = "peercache_rdma_registered_bytes";
        /// Bytes of this node's regions still waiting for their chunks to be registered in
        /// the background (0 once every region is registered whole).
        pub const REGISTERING_BYTES: &str = "peercache_rdma_registering_bytes";
    }

    /// The RDMA series of PeerCache 0.8.4, kept under their old names and types (gauges) so
    /// existing dashboards and alerts keep working. Each count is moved by the same call as
    /// its new counter ([`peercache_wire::tally::Tally::mirrored`]); docs/operations.md maps
    /// every old name to its new series.
    pub mod compat {
        peercache_wire::metric_names! {
            /// Rails (NICs) the RDMA path drives; 0 without one.
            pub const RAILS: &str = "peercache_rdma_rails";
            /// Read windows that missed their deadline (`peercache_rdma_timeouts_total{op="read"}`).
            pub const READ_TIMEOUTS: &str = "peercache_rdma_read_timeouts";
            /// Write windows that missed their deadline (`…timeouts_total{op="write"}`).
            pub const WRITE_TIMEOUTS: &str = "peercache_rdma_write_timeouts";
            /// Read completions with an error status (`peercache_rdma_wc_errors_total{op="read"}`).
            pub const READ_WC_ERRORS: &str = "peercache_rdma_read_wc_errors";
            /// Write completions with an error status (`…wc_errors_total{op="write"}`).
            pub const WRITE_WC_ERRORS: &str = "peercache_rdma_write_wc_errors";
            /// The last error status of a work completion (`ibv_wc_status`; 0 = none yet).
            pub const LAST_WC_STATUS: &str = "peercache_rdma_last_wc_status";
            /// Queue pairs discarded (`peercache_rdma_channel_discards_total`).
            pub const CHANNEL_DISCARDS: &str = "peercache_rdma_channel_discards";
            /// Failed posts (`peercache_rdma_post_failures_total`).
            pub const POST_FAILURES: &str = "peercache_rdma_post_failures";
            /// Channels that could not be leased (`peercache_rdma_lease_failures_total`).
            pub const LEASE_FAILURES: &str = "peercache_rdma_lease_failures";
            /// Caller ranges outside every registered region, registered for a batch
            /// (`peercache_rdma_lazy_registrations_total`).
            pub const LOCAL_REG_MISSES: &str = "peercache_rdma_local_reg_misses";
            /// Lazily registered memory regions held right now (the lazy-MR cache's size).
            pub const LAZY_LOCAL_MRS: &str = "peercache_rdma_lazy_local_mrs";
        }
    }
}

/// Registers every RDMA series, new and kept from 0.8.4, at 0 (nothing else happens): a node
/// without an RDMA path calls it so a dashboard finds the same series on every node.
pub fn register_rdma_series() {
    drop(RdmaCounters::register());
    drop(EngineCounters::default());
    metrics::gauge!(rdma::compat::RAILS).set(0.0);
}

fn tally(name: &'static str) -> Tally {
    Tally::new(metrics::counter!(name))
}

fn sided(name: &'static str, op: &'static str, side: &'static str) -> Tally {
    Tally::new(metrics::counter!(name, "op" => op, "side" => side))
}

fn error_kind(kind: &'static str) -> Tally {
    Tally::new(metrics::counter!(ERRORS_TOTAL, "kind" => kind))
}

/// The counters of one transport (client, server and same-host path), resolved once at
/// start-up so the hot path builds no label sets.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) read_ops: Tally,
    pub(crate) read_bytes: Tally,
    pub(crate) write_ops: Tally,
    pub(crate) write_bytes: Tally,
    /// Per-op errors, by [`OpError::kind`].
    pub(crate) op_errors: [Tally; OpError::KINDS.len()],
    pub(crate) batch_errors: Tally,
    pub(crate) timeouts: Tally,
    pub(crate) suspect_marks: Tally,
    pub(crate) suspect_rejects: Tally,
    pub(crate) connects: Tally,
    pub(crate) conn_discards: Tally,
    pub(crate) served_read_ops: Tally,
    pub(crate) served_read_bytes: Tally,
    pub(crate) served_write_ops: Tally,
    pub(crate) served_write_bytes: Tally,
    pub(crate) served_errors: Tally,
    pub(crate) server_desyncs: Tally,
    pub(crate) local_read_ops: Tally,
    pub(crate) local_read_bytes: Tally,
    pub(crate) local_attaches: Tally,
}

impl Counters {
    pub(crate) fn register() -> Self {
        Counters {
            read_ops: sided(OPS_TOTAL, "read", "client"),
            read_bytes: sided(BYTES_TOTAL, "read", "client"),
            write_ops: sided(OPS_TOTAL, "write", "client"),
            write_bytes: sided(BYTES_TOTAL, "write", "client"),
            op_errors: OpError::KINDS.map(error_kind),
            batch_errors: error_kind("connection"),
            timeouts: tally(TIMEOUTS_TOTAL),
            suspect_marks: tally(SUSPECT_MARKS_TOTAL),
            suspect_rejects: tally(SUSPECT_REJECTS_TOTAL),
            connects: tally(CONNECTS_TOTAL),
            conn_discards: tally(CONN_DISCARDS_TOTAL),
            served_read_ops: sided(OPS_TOTAL, "read", "server"),
            served_read_bytes: sided(BYTES_TOTAL, "read", "server"),
            served_write_ops: sided(OPS_TOTAL, "write", "server"),
            served_write_bytes: sided(BYTES_TOTAL, "write", "server"),
            served_errors: error_kind("served_op"),
            server_desyncs: tally(SERVER_DESYNCS_TOTAL),
            local_read_ops: tally(LOCAL_READ_OPS_TOTAL),
            local_read_bytes: tally(LOCAL_READ_BYTES_TOTAL),
            local_attaches: tally(LOCAL_ATTACHES_TOTAL),
        }
    }

    /// Counts a batch this node carried as a client (over any path that shares this
    /// accounting: TCP, same-host): ops and bytes that succeeded, per-op errors by kind.
    pub(crate) fn count_batch(&self, write: bool, batch: &Batch, results: &OpResults) {
        let (mut ok, mut bytes) = (0u64, 0u64);
        for (op, r) in batch.ops().iter().zip(results) {
            match r {
                Ok(()) => {
                    ok += 1;
                    bytes += u64::from(op.remote.len);
                }
                Err(e) => self.op_errors[e.kind()].add(1),
            }
        }
        let (ops, byte_count) = if write {
            (&self.write_ops, &self.write_bytes)
        } else {
            (&self.read_ops, &self.read_bytes)
        };
        ops.add(ok);
        byte_count.add(bytes);
    }

    /// Counts ops this node's server carried for a peer.
    pub(crate) fn count_served(&self, ok: u64, bytes: u64, errs: u64, write: bool) {
        if write {
            self.served_write_ops.add(ok);
            self.served_write_bytes.add(bytes);
        } else {
            self.served_read_ops.add(ok);
            self.served_read_bytes.add(bytes);
        }
        self.served_errors.add(errs);
    }
}

/// The counters of one RDMA path.
#[derive(Debug)]
pub(crate) struct RdmaCounters {
    pub(crate) read_ops: Tally,
    pub(crate) read_bytes: Tally,
    pub(crate) op_errors: Tally,
    pub(crate) fallbacks: Tally,
    pub(crate) table_fetches: Tally,
    pub(crate) write_ops: Tally,
    pub(crate) write_bytes: Tally,
    pub(crate) lazy_registrations: Tally,
    pub(crate) lazy_hits: Tally,
    /// Lazily registered regions held right now.
    pub(crate) lazy_mrs: metrics::Gauge,
    pub(crate) unavailable: Tally,
    /// Bytes registered with the NIC; bytes still to register in the background.
    pub(crate) registered: metrics::Gauge,
    pub(crate) registering: metrics::Gauge,
}

impl RdmaCounters {
    pub(crate) fn register() -> Self {
        RdmaCounters {
            read_ops: tally(rdma::OPS),
            read_bytes: tally(rdma::BYTES),
            op_errors: tally(rdma::OP_ERRORS),
            fallbacks: tally(rdma::FALLBACKS),
            table_fetches: tally(rdma::TABLE_FETCHES),
            write_ops: tally(rdma::WRITE_OPS),
            write_bytes: tally(rdma::WRITE_BYTES),
            lazy_registrations: tally(rdma::LAZY)
                .mirrored(metrics::gauge!(rdma::compat::LOCAL_REG_MISSES)),
            lazy_hits: tally(rdma::LAZY_HITS),
            lazy_mrs: metrics::gauge!(rdma::compat::LAZY_LOCAL_MRS),
            unavailable: tally(rdma::PEERS_UNAVAILABLE),
            registered: metrics::gauge!(rdma::REGISTERED_BYTES),
            registering: metrics::gauge!(rdma::REGISTERING_BYTES),
        }
    }
}

/// The counters of one RDMA engine (public: the engine is usable on its own).
#[derive(Debug)]
pub struct EngineCounters {
    /// Work completions with an error status, by op (index 0 reads, 1 writes: `RdmaOp::index`).
    pub wc_errors: [Tally; 2],
    /// The last error status seen (a value, not a count).
    pub last_wc_status: std::sync::atomic::AtomicU64,
    /// [`EngineCounters::last_wc_status`] as a gauge.
    last_wc_status_gauge: metrics::Gauge,
    /// Windows that missed the deadline, by op (index 0 reads, 1 writes: `RdmaOp::index`).
    pub timeouts: [Tally; 2],
    /// Channels discarded after a failure.
    pub channel_discards: Tally,
    /// Failed posts.
    pub post_failures: Tally,
    /// Channels that could not be leased (no idle queue pair, and connecting one failed).
    pub lease_failures: Tally,
    /// Rails of a batch that found every allowed channel in use until the deadline.
    pub lease_timeouts: Tally,
    /// Work requests posted.
    pub wrs_posted: Tally,
    /// Drains that did not finish within the grace (the queue pair was destroyed instead).
    pub drain_timeouts: Tally,
}

fn by_op(name: &'static str, read_alias: &'static str, write_alias: &'static str) -> [Tally; 2] {
    [("read", read_alias), ("write", write_alias)].map(|(op, alias)| {
        Tally::new(metrics::counter!(name, "op" => op)).mirrored(metrics::gauge!(alias))
    })
}

impl EngineCounters {
    /// Work completions with an error status, reads and writes.
    pub fn wc_errors_total(&self) -> u64 {
        self.wc_errors.iter().map(Tally::get).sum()
    }

    /// Windows that missed the deadline, reads and writes.
    pub fn timeouts_total(&self) -> u64 {
        self.timeouts.iter().map(Tally::get).sum()
    }

    /// Counts a completion error of the op with index `op` (0 read, 1 write) and its
    /// `ibv_wc_status`.
    pub(crate) fn wc_error(&self, op: usize, status: u32) {
        self.wc_errors[op.min(1)].add(1);
        self.last_wc_status
            .store(u64::from(status), std::sync::atomic::Ordering::Relaxed);
        self.last_wc_status_gauge.set(f64::from(status));
    }
}

impl Default for EngineCounters {
    fn default() -> Self {
        use rdma::compat;
        EngineCounters {
            wc_errors: by_op(
                rdma::WC_ERRORS,
                compat::READ_WC_ERRORS,
                compat::WRITE_WC_ERRORS,
            ),
            last_wc_status: Default::default(),
            last_wc_status_gauge: metrics::gauge!(compat::LAST_WC_STATUS),
            timeouts: by_op(
                rdma::TIMEOUTS,
                compat::READ_TIMEOUTS,
                compat::WRITE_TIMEOUTS,
            ),
            channel_discards: tally(rdma::DISCARDS)
                .mirrored(metrics::gauge!(compat::CHANNEL_DISCARDS)),
            post_failures: tally(rdma::POST_FAILURES)
                .mirrored(metrics::gauge!(compat::POST_FAILURES)),
            lease_failures: tally(rdma::LEASE_FAILURES)
                .mirrored(metrics::gauge!(compat::LEASE_FAILURES)),
            lease_timeouts: tally(rdma::LEASE_TIMEOUTS),
            wrs_posted: tally(rdma::WORK_REQUESTS),
            drain_timeouts: tally(rdma::DRAIN_TIMEOUTS),
        }
    }
}

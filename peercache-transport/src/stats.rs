//! Cumulative counters of one transport, readable without a metrics recorder.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a transport's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Read ops issued that succeeded.
    pub read_ops: u64,
    /// Bytes read from peers.
    pub read_bytes: u64,
    /// Write ops issued that succeeded.
    pub write_ops: u64,
    /// Bytes written to peers.
    pub write_bytes: u64,
    /// Ops that failed with a per-op error (either side's validation).
    pub op_errors: u64,
    /// Batches that timed out.
    pub timeouts: u64,
    /// Times a peer was marked suspect.
    pub suspect_marks: u64,
    /// Batches failed fast because the peer was suspect.
    pub suspect_rejects: u64,
    /// Connections opened.
    pub connects: u64,
    /// Connections dropped after an error.
    pub conn_discards: u64,
    /// Ops served to peers.
    pub served_ops: u64,
    /// Bytes served to (read) or accepted from (write) peers.
    pub served_bytes: u64,
    /// Ops rejected by this node's server.
    pub served_errors: u64,
    /// Inbound connections closed because the stream could not be trusted.
    pub server_desyncs: u64,
    /// Of `read_ops`: ops carried over RDMA.
    pub rdma_read_ops: u64,
    /// Of `read_bytes`: bytes read over RDMA.
    pub rdma_read_bytes: u64,
    /// Read batches the RDMA path handed to TCP (peer without RDMA, unknown region…).
    pub rdma_fallbacks: u64,
    /// Of `write_ops`: ops carried over RDMA (`rdma_writes`).
    pub rdma_write_ops: u64,
    /// Of `write_bytes`: bytes written over RDMA.
    pub rdma_write_bytes: u64,
    /// Of `read_ops`: ops copied from a peer's shared memory (the host-local path).
    pub local_read_ops: u64,
    /// Of `read_bytes`: bytes copied from a peer's shared memory.
    pub local_read_bytes: u64,
    /// Times this node attached to a peer's shared regions.
    pub local_attaches: u64,
    /// Peers whose shared regions this node has mapped now.
    pub local_peers: u64,
    /// Peers attached to this node's shared regions now.
    pub local_leases: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) read_ops: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) write_ops: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
    pub(crate) op_errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
    pub(crate) suspect_marks: AtomicU64,
    pub(crate) suspect_rejects: AtomicU64,
    pub(crate) connects: AtomicU64,
    pub(crate) conn_discards: AtomicU64,
    pub(crate) served_ops: AtomicU64,
    pub(crate) served_bytes: AtomicU64,
    pub(crate) served_errors: AtomicU64,
    pub(crate) server_desyncs: AtomicU64,
    pub(crate) local_read_ops: AtomicU64,
    pub(crate) local_read_bytes: AtomicU64,
    pub(crate) local_attaches: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        if n != 0 {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts a batch this node carried as a client (over any path that shares this
    /// accounting: TCP, same-host): ops and bytes that succeeded, per-op errors by kind.
    pub(crate) fn count_batch(
        &self,
        m: &crate::metrics::Handles,
        write: bool,
        batch: &crate::Batch,
        results: &crate::OpResults,
    ) {
        let (mut ok, mut bytes, mut errs) = (0u64, 0u64, 0u64);
        for (op, r) in batch.ops().iter().zip(results) {
            match r {
                Ok(()) => {
                    ok += 1;
                    bytes += u64::from(op.remote.len);
                }
                Err(e) => {
                    errs += 1;
                    metrics::counter!(crate::metrics::ERRORS_TOTAL, "kind" => e.label())
                        .increment(1);
                }
            }
        }
        let (ops_c, bytes_c, ops_m, bytes_m) = if write {
            (
                &self.write_ops,
                &self.write_bytes,
                &m.client_write_ops,
                &m.client_write_bytes,
            )
        } else {
            (
                &self.read_ops,
                &self.read_bytes,
                &m.client_read_ops,
                &m.client_read_bytes,
            )
        };
        Counters::add(ops_c, ok);
        Counters::add(bytes_c, bytes);
        Counters::add(&self.op_errors, errs);
        ops_m.increment(ok);
        bytes_m.increment(bytes);
    }

    pub(crate) fn snapshot(&self) -> TransportStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TransportStats {
            read_ops: g(&self.read_ops),
            read_bytes: g(&self.read_bytes),
            write_ops: g(&self.write_ops),
            write_bytes: g(&self.write_bytes),
            op_errors: g(&self.op_errors),
            timeouts: g(&self.timeouts),
            suspect_marks: g(&self.suspect_marks),
            suspect_rejects: g(&self.suspect_rejects),
            connects: g(&self.connects),
            conn_discards: g(&self.conn_discards),
            served_ops: g(&self.served_ops),
            served_bytes: g(&self.served_bytes),
            served_errors: g(&self.served_errors),
            server_desyncs: g(&self.server_desyncs),
            local_read_ops: g(&self.local_read_ops),
            local_read_bytes: g(&self.local_read_bytes),
            local_attaches: g(&self.local_attaches),
            ..TransportStats::default()
        }
    }
}

/// Counters of one peer, as seen by this node's client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStats {
    /// The peer's data endpoint.
    pub peer: std::net::SocketAddr,
    /// Batches that failed (connection errors, rejects, timeouts).
    pub errors: u64,
    /// Batches that timed out.
    pub timeouts: u64,
    /// True while the peer is suspect.
    pub suspect: bool,
}

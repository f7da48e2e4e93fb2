//! Snapshots of a transport's counters (the counters themselves, each also a metrics series,
//! are in `metrics.rs`).

use peercache_wire::tally::Tally;

use crate::metrics::Counters;

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
    /// Batches lost with their connection (other than timeouts).
    pub batch_errors: u64,
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
    /// Bytes of peers' shared regions mapped into this process ahead of reads, so a copy
    /// out of them takes no page fault.
    pub local_populated_bytes: u64,
    /// Peers attached to this node's shared regions now.
    pub local_leases: u64,
}

impl Counters {
    /// The counters as [`TransportStats`] (the RDMA fields are filled in by the transport).
    pub(crate) fn snapshot(&self) -> TransportStats {
        TransportStats {
            read_ops: self.read_ops.get(),
            read_bytes: self.read_bytes.get(),
            write_ops: self.write_ops.get(),
            write_bytes: self.write_bytes.get(),
            op_errors: self.op_errors.iter().map(Tally::get).sum(),
            batch_errors: self.batch_errors.get(),
            timeouts: self.timeouts.get(),
            suspect_marks: self.suspect_marks.get(),
            suspect_rejects: self.suspect_rejects.get(),
            connects: self.connects.get(),
            conn_discards: self.conn_discards.get(),
            served_ops: self.served_read_ops.get() + self.served_write_ops.get(),
            served_bytes: self.served_read_bytes.get() + self.served_write_bytes.get(),
            served_errors: self.served_errors.get(),
            server_desyncs: self.server_desyncs.get(),
            local_read_ops: self.local_read_ops.get(),
            local_read_bytes: self.local_read_bytes.get(),
            local_attaches: self.local_attaches.get(),
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

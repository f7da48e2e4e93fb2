//! Metric names of the transport (the `metrics` facade; the store installs the recorder).
//!
//! Counters are incremented once per batch with the batch's totals, never per page.

/// Ops served or issued, label `op` = `read` | `write`, `side` = `client` | `server`.
pub const OPS_TOTAL: &str = "peercache_transport_ops_total";
/// Payload bytes moved, same labels as [`OPS_TOTAL`].
pub const BYTES_TOTAL: &str = "peercache_transport_bytes_total";
/// Failed ops, label `kind` = the [`crate::OpError::label`] or `timeout` / `connection`.
pub const ERRORS_TOTAL: &str = "peercache_transport_errors_total";
/// Batches that hit their deadline.
pub const TIMEOUTS_TOTAL: &str = "peercache_transport_timeouts_total";
/// Times a peer was marked suspect.
pub const SUSPECT_MARKS_TOTAL: &str = "peercache_transport_suspect_marks_total";
/// Connections opened to peers.
pub const CONNECTS_TOTAL: &str = "peercache_transport_connects_total";
/// Of the client's read bytes: bytes copied from a peer's shared memory (host-local path).
pub const LOCAL_READ_BYTES_TOTAL: &str = "peercache_transport_local_read_bytes_total";

use metrics::Counter;

/// Counter handles resolved once at start-up, so the hot path builds no label sets.
#[derive(Clone)]
pub(crate) struct Handles {
    pub(crate) client_read_ops: Counter,
    pub(crate) client_read_bytes: Counter,
    pub(crate) client_write_ops: Counter,
    pub(crate) client_write_bytes: Counter,
    pub(crate) server_read_ops: Counter,
    pub(crate) server_read_bytes: Counter,
    pub(crate) server_write_ops: Counter,
    pub(crate) server_write_bytes: Counter,
    pub(crate) local_read_bytes: Counter,
}

impl Handles {
    pub(crate) fn register() -> Self {
        let c = |name: &'static str, op: &'static str, side: &'static str| metrics::counter!(name, "op" => op, "side" => side);
        Handles {
            client_read_ops: c(OPS_TOTAL, "read", "client"),
            client_read_bytes: c(BYTES_TOTAL, "read", "client"),
            client_write_ops: c(OPS_TOTAL, "write", "client"),
            client_write_bytes: c(BYTES_TOTAL, "write", "client"),
            server_read_ops: c(OPS_TOTAL, "read", "server"),
            server_read_bytes: c(BYTES_TOTAL, "read", "server"),
            server_write_ops: c(OPS_TOTAL, "write", "server"),
            server_write_bytes: c(BYTES_TOTAL, "write", "server"),
            local_read_bytes: metrics::counter!(LOCAL_READ_BYTES_TOTAL),
        }
    }
}

//! Every metric name of the wire crate (the store installs the recorder and adds `node`).

crate::metric_names! {
    /// Handshakes refused for failed or missing authentication.
    pub const AUTH_REJECTED_TOTAL: &str = "peercache_auth_rejected_total";
    /// Requests an RPC server answered, label `server`.
    pub const RPC_REQUESTS_TOTAL: &str = "peercache_rpc_requests_total";
    /// Frames an RPC server refused (malformed, oversize), label `server`.
    pub const MALFORMED_FRAMES_TOTAL: &str = "peercache_rpc_malformed_frames_total";
    /// Connections whose handshake failed (wrong plane or version, not authenticated, silent),
    /// label `server`.
    pub const HANDSHAKE_FAILURES_TOTAL: &str = "peercache_rpc_handshake_failures_total";
    /// Connections an RPC server closed at accept, labels `server` and `reason` (`limit`: the
    /// server's connection cap; `source`: the source address's share of it).
    pub const CONNECTIONS_REFUSED_TOTAL: &str = "peercache_rpc_connections_refused_total";
    /// Authenticated connections closed because a frame they announced did not fit in the
    /// process's frame budget (`frame_budget_bytes`), label `server`.
    pub const FRAME_BUDGET_REFUSED_TOTAL: &str = "peercache_rpc_frame_budget_refused_total";
    /// Requests refused because they act for another member than the connection's own, label
    /// `service` (`discovery`, `directory`, `store`, `data`).
    pub const IDENTITY_REFUSED_TOTAL: &str = "peercache_identity_refused_total";
    /// Sealed frames and records that failed their integrity check (encryption in transit):
    /// changed, dropped, replayed or reordered on the path; each closes its connection. Label
    /// `at`: the RPC server's name, `data` (the data server), `rpc-reply` or `data-reply` (a
    /// reply this node received).
    pub const SEALED_REFUSED_TOTAL: &str = "peercache_sealed_refused_total";
}

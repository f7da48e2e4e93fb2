//! Transport configuration.

use std::net::SocketAddr;
use std::time::Duration;

use peercache_wire::Auth;

/// Settings of one transport endpoint.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    /// Address the data server listens on (`127.0.0.1:0` picks a free port).
    pub bind: SocketAddr,
    /// Idle-or-busy connections kept per peer (the original's `max_channels_per_peer`).
    pub max_channels_per_peer: usize,
    /// Deadline of one batch, connect included.
    pub op_timeout: Duration,
    /// How long a peer that timed out is failed fast.
    pub suspect_for: Duration,
    /// Most ops in one batch (requests above it are rejected with a typed error).
    pub max_batch_ops: usize,
    /// Largest single op in bytes.
    pub max_op_bytes: u32,
    /// Most inbound connections the server accepts at once.
    pub max_server_connections: usize,
    /// Most of those one source address may hold at once (0: no share, only the cap).
    pub max_server_connections_per_source: usize,
    /// Cluster authentication of data connections (both directions).
    pub auth: Auth,
    /// With an RDMA path: carry writes one-sided too, into guarded regions registered
    /// remote-writable on the NIC. The NIC cannot run a [`crate::WriteGuard`], so any peer with
    /// a queue pair may then write such a region; writers must verify what landed (storage
    /// servers commit a page only if its bytes match the writer's checksum).
    pub rdma_writes: bool,
    /// Serve and use the host-local path: peers on this host map this node's shared regions
    /// read-only and copy from them, and this node does the same with theirs.
    pub host_local: bool,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            max_channels_per_peer: 16,
            op_timeout: Duration::from_secs(5),
            suspect_for: Duration::from_secs(2),
            max_batch_ops: 8192,
            max_op_bytes: 64 << 20,
            max_server_connections: 1024,
            max_server_connections_per_source: 0,
            auth: Auth::none(),
            rdma_writes: false,
            host_local: true,
        }
    }
}

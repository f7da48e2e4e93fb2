//! [`Identity`]: who a node is to the cluster — its id, this run's incarnation, the key of its
//! pool's registration — and where it is reached: the data, control, client-API and HTTP
//! endpoints it advertises. Fixed for the node's life.

use std::net::SocketAddr;

use peercache_wire::{Incarnation, NodeId};

/// Who this node is and where it is reached; fixed at start.
pub(crate) struct Identity {
    pub(crate) me: NodeId,
    /// This run of the node (a restart under the same id gets a new one).
    pub(crate) incarnation: Incarnation,
    /// Connections prove the cluster secret (false: an open node, loopback or `insecure`).
    pub(crate) auth_enabled: bool,
    /// The transport key of the pool's registration, named in this node's directory entries.
    pub(crate) pool_key: u64,
    /// Where peers read pages (the transport's data server).
    pub(crate) data: SocketAddr,
    /// Directory shard and store RPCs.
    pub(crate) control: SocketAddr,
    /// The client API, when on (`client_enabled`).
    pub(crate) client: Option<SocketAddr>,
    /// `/metrics`, `/healthz`, `/cluster` and the dashboard, when on (`metrics_enabled`).
    pub(crate) http: Option<SocketAddr>,
}

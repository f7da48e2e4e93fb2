//! [`Reach`]: how this node reaches its peers — its id, the directory client (the ring and the
//! RPC client), the transport, the counters, the layout its pages carry and the deadline of one
//! operation — borrowed from the node by the modes that read and write other nodes' memory.

use std::time::Duration;

use peercache_directory::DirectoryClient;
use peercache_transport::Transport;
use peercache_wire::{Layout, NodeId};

use crate::observe::series::Handles;

/// How this node reaches its peers, borrowed from the node.
#[derive(Clone, Copy)]
pub(crate) struct Reach<'a> {
    pub(crate) me: &'a NodeId,
    /// The ring (each key's primary) and the RPC client.
    pub(crate) dir: &'a DirectoryClient,
    pub(crate) transport: &'a Transport,
    pub(crate) metrics: &'a Handles,
    /// The layout this node writes and expects.
    pub(crate) layout: Layout,
    /// The deadline of one operation (`op_timeout`).
    pub(crate) op_timeout: Duration,
}

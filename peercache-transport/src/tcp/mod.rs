//! The TCP path: the data server that serves this node's regions to peers (one thread per
//! connection; its data port also answers the RDMA bootstrap and same-host planes), and the
//! client with per-peer connection pools. It reaches every peer, so the transport tries it last.

pub(crate) mod client;
mod iov;
mod link;
pub(crate) mod proto;
pub(crate) mod server;

pub(crate) use client::Client;
pub(crate) use server::ServerShared;

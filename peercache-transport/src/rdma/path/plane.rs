//! What the TCP transport and the verbs backends see of the RDMA path: the [`Registrar`] a
//! backend implements, the object-safe [`RdmaPlane`] the transport calls, and their plain data.

use crate::rdma::RdmaError;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crate::rdma::engine::MAX_RAILS;
use crate::{Access, Batch, OpResults, RegionKey, Residency};

/// Keys of one registration on every rail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RailKeys {
    /// Local key per rail.
    pub lkeys: [u32; MAX_RAILS],
    /// Remote key per rail (0 for local-only memory).
    pub rkeys: [u32; MAX_RAILS],
}

/// A backend that registers memory on every rail.
pub trait Registrar: Send + Sync {
    /// Registers `len` bytes at `ptr` on every rail with the access `access` grants.
    ///
    /// # Safety
    /// The memory must stay valid until [`Registrar::deregister`] is called with the result.
    unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RailKeys, RdmaError>;
    /// Registers device memory on every rail (GPUDirect); backends without it say so.
    ///
    /// # Safety
    /// As [`Registrar::register`], for the device memory (and dma-buf fd) named.
    unsafe fn register_device(
        &self,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<RailKeys, RdmaError> {
        let _ = (mem, access);
        Err(RdmaError::Unsupported(
            "this RDMA backend cannot register device memory",
        ))
    }
    /// Releases a registration (no queue pair targets it any more).
    fn deregister(&self, keys: &RailKeys);
    /// Local keys valid for *any* address of this process (an implicit on-demand-paging
    /// registration), when the devices support it; then unregistered memory needs no
    /// per-batch registration.
    fn local_any(&self) -> Option<[u32; MAX_RAILS]> {
        None
    }
}

/// What the TCP transport needs from an RDMA path (object-safe).
pub trait RdmaPlane: Send + Sync + std::fmt::Debug {
    /// Registers a region the transport just registered under `key`. With `resident`, a
    /// chunk is registered only once that says its memory is in.
    ///
    /// # Safety
    /// As [`Registrar::register`]; the transport calls [`RdmaPlane::deregister`] before the
    /// memory may go away.
    unsafe fn register(
        &self,
        key: RegionKey,
        ptr: *mut u8,
        len: usize,
        access: Access,
        resident: Option<Arc<dyn Residency>>,
    ) -> Result<(), RdmaError>;
    /// Registers device memory the transport just registered under `key` (GPUDirect).
    ///
    /// # Safety
    /// As [`Registrar::register_device`].
    unsafe fn register_device(
        &self,
        key: RegionKey,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<(), RdmaError>;
    /// Forgets a region (its handle was dropped).
    fn deregister(&self, key: RegionKey);
    /// Drops cached lazy registrations of caller memory overlapping `[addr, addr+len)`: the
    /// caller is about to unmap or reuse it.
    fn forget_local(&self, addr: u64, len: u64) {
        let _ = (addr, len);
    }
    /// Reads the batch over RDMA, or `None` when it must go over TCP.
    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Option<OpResults>;
    /// Writes the batch over RDMA, or `None` when it must go over TCP (a region the peer did
    /// not register remote-writable on its NIC).
    fn write_batch(&self, peer: SocketAddr, batch: &Batch) -> Option<OpResults>;
    /// Serves one accepted connection on the bootstrap plane.
    fn serve(&self, stream: TcpStream);
    /// Counters.
    fn stats(&self) -> RdmaStats;
    /// Peers read over TCP for now because their RDMA setup failed, with the reason.
    fn peers_on_tcp(&self) -> Vec<PeerOnTcp> {
        Vec::new()
    }
}

/// Counters of the RDMA path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaStats {
    /// Read ops carried over RDMA that succeeded.
    pub read_ops: u64,
    /// Bytes read over RDMA.
    pub read_bytes: u64,
    /// Read ops that failed over RDMA.
    pub op_errors: u64,
    /// Batches handed to TCP instead.
    pub fallbacks: u64,
    /// Write ops carried over RDMA that succeeded.
    pub write_ops: u64,
    /// Bytes written over RDMA.
    pub write_bytes: u64,
    /// Caller memory registered because no cached registration covered it (segments outside
    /// registered regions).
    pub lazy_registrations: u64,
    /// Caller ranges a cached lazy registration covered (nothing registered).
    pub lazy_mr_hits: u64,
    /// Lazy registrations cached now (`peercache_rdma_lazy_local_mrs`).
    pub lazy_mrs: u64,
    /// Region tables fetched from peers.
    pub table_fetches: u64,
    /// Work completions with an error status.
    pub wc_errors: u64,
    /// The last error status seen (0: none).
    pub last_wc_status: u64,
    /// Windows that missed their deadline (queue pair moved to error and drained).
    pub timeouts: u64,
    /// Queue pairs discarded after an error or a timeout.
    pub channel_discards: u64,
    /// Failed posts.
    pub post_failures: u64,
    /// Channels that could not be leased (connecting a queue pair failed).
    pub lease_failures: u64,
    /// Drains that did not finish within the grace after an error or timeout.
    pub drain_timeouts: u64,
    /// Times a peer was left on TCP because its RDMA setup failed.
    pub peers_unavailable: u64,
    /// Bytes of this node's regions registered with the NIC so far.
    pub registered_bytes: u64,
    /// Bytes of this node's regions whose chunks are still to be registered (0 when done).
    pub registering_bytes: u64,
}

/// A peer this node reads over TCP for now because its RDMA setup failed
/// ([`RdmaPlane::peers_on_tcp`]; `/cluster` shows them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerOnTcp {
    /// The peer's data endpoint.
    pub peer: SocketAddr,
    /// What failed: the region-table fetch or every queue-pair connect, with the cause.
    pub why: String,
    /// When RDMA to it is tried again.
    pub retry_in: Duration,
}

//! [`DataPath`]: one way of moving a batch's bytes between this node and a peer.
//!
//! The transport keeps its paths in order — same-host, then RDMA — and hands each batch to
//! the first that takes it; TCP, which reaches every peer, comes last and always answers. A path
//! that cannot carry a batch for a peer (another host, no queue pair, a region it does not
//! hold) says so by answering `None`, and the next path is asked. A new path is a new module
//! implementing this trait and one entry in that list.

use std::net::SocketAddr;

use crate::{Batch, OpResults, RegionKey, TransportError, TransportStats};

/// What a path answers for one batch: `None` = not mine, ask the next path.
pub(crate) type Carried = Option<Result<OpResults, TransportError>>;

/// One data path of the transport.
pub(crate) trait DataPath: Send + Sync + std::fmt::Debug {
    /// Reads every op's remote range from `peer` into its local segments, if this path can.
    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Carried;

    /// Writes every op's local segments into its remote range on `peer`, if this path can.
    fn write_batch(&self, peer: SocketAddr, batch: &Batch) -> Carried {
        let _ = (peer, batch);
        None
    }

    /// A read this path declined was carried by a later one, with this outcome (the same-host
    /// path attaches after a successful network read).
    fn read_elsewhere(&self, peer: SocketAddr, outcome: &Result<OpResults, TransportError>) {
        let _ = (peer, outcome);
    }

    /// A region was registered under `key` as `opts` say (a guarded one has its inbound
    /// writes checked by a write guard); returns whether this path holds it too (it is then
    /// told [`DataPath::deregister`] before the memory may go).
    ///
    /// # Safety
    /// `ptr..ptr+len` stays valid until [`DataPath::deregister`] is called for `key`.
    unsafe fn register(
        &self,
        key: RegionKey,
        ptr: *mut u8,
        len: usize,
        opts: &crate::RegionOptions,
    ) -> bool {
        let _ = (key, ptr, len, opts);
        false
    }

    /// Forgets a region this path held.
    fn deregister(&self, key: RegionKey) {
        let _ = key;
    }

    /// Drops what this path keeps for a peer that left.
    fn forget_peer(&self, peer: SocketAddr);

    /// Adds this path's counters.
    fn add_stats(&self, stats: &mut TransportStats);

    /// Stops serving (idempotent).
    fn shutdown(&self) {}
}

//! [`RdmaRoute`]: the RDMA path as one of the transport's data paths.
//!
//! It wraps an [`RdmaPlane`] (the engine on a verbs backend): regions are registered on every
//! rail, reads go one-sided to peers that have RDMA (others are handed on to TCP), and writes
//! go one-sided only with `rdma_writes`.

use std::net::SocketAddr;
use std::sync::Arc;

use super::path::RdmaPlane;
use crate::path::{Carried, DataPath};
use crate::{Access, Batch, RegionKey, TransportStats};

/// The RDMA data path.
#[derive(Debug)]
pub(crate) struct RdmaRoute {
    pub(crate) plane: Arc<dyn RdmaPlane>,
    /// Writes go one-sided too (`TransportConfig::rdma_writes`).
    writes: bool,
}

impl RdmaRoute {
    pub(crate) fn new(plane: Arc<dyn RdmaPlane>, writes: bool) -> Self {
        RdmaRoute { plane, writes }
    }

    /// The access a region is registered with on the NIC. Guarded regions are read over RDMA
    /// like any other; writes into them go over TCP, where the guard runs — unless
    /// `rdma_writes` trades the guard for one-sided writes.
    fn on_nic(&self, access: Access, guarded: bool) -> Access {
        if guarded && !self.writes {
            Access::RemoteRead
        } else {
            access
        }
    }
}

impl DataPath for RdmaRoute {
    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Carried {
        self.plane.read_batch(peer, batch).map(Ok)
    }

    fn write_batch(&self, peer: SocketAddr, batch: &Batch) -> Carried {
        if !self.writes {
            return None;
        }
        self.plane.write_batch(peer, batch).map(Ok)
    }

    unsafe fn register(
        &self,
        key: RegionKey,
        ptr: *mut u8,
        len: usize,
        opts: &crate::RegionOptions,
    ) -> bool {
        let on_nic = self.on_nic(opts.access, opts.guard.is_some());
        // SAFETY: forwarded from the caller.
        match unsafe {
            self.plane
                .register(key, ptr, len, on_nic, opts.resident.clone())
        } {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, len, "RDMA registration failed; region served over TCP only");
                false
            }
        }
    }

    fn deregister(&self, key: RegionKey) {
        self.plane.deregister(key);
    }

    fn forget_peer(&self, _peer: SocketAddr) {}

    fn add_stats(&self, s: &mut TransportStats) {
        let x = self.plane.stats();
        s.read_ops += x.read_ops;
        s.read_bytes += x.read_bytes;
        s.op_errors += x.op_errors;
        s.rdma_read_ops = x.read_ops;
        s.rdma_read_bytes = x.read_bytes;
        s.rdma_fallbacks = x.fallbacks;
        s.write_ops += x.write_ops;
        s.write_bytes += x.write_bytes;
        s.rdma_write_ops = x.write_ops;
        s.rdma_write_bytes = x.write_bytes;
    }
}

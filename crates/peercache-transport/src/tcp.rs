//! [`TcpTransport`]: the TCP engine (server + client sharing one region table).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::{Incarnation, NodeId};

use crate::client::Client;
use crate::region::RegionTable;
use crate::server::{self, ServerShared};
use crate::stats::Counters;
use crate::{
    Access, Batch, OpResults, RegionHandle, TransportConfig, TransportError, TransportStats,
};

/// The TCP transport of one node: a data server for its registered regions and a client for
/// peers' regions. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct TcpTransport {
    table: Arc<RegionTable>,
    client: Client,
    server: Arc<ServerShared>,
    endpoint: SocketAddr,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl TcpTransport {
    /// Binds the data server and returns the running transport.
    pub fn start(cfg: TransportConfig, node: Option<NodeId>) -> Result<Self, TransportError> {
        let table = Arc::new(RegionTable::new());
        let counters = Arc::new(Counters::default());
        let incarnation = Incarnation::fresh();
        let metrics = crate::metrics::Handles::register();
        let server = Arc::new(ServerShared {
            table: table.clone(),
            cfg: cfg.clone(),
            counters: counters.clone(),
            incarnation,
            stop: AtomicBool::new(false),
            live: AtomicUsize::new(0),
            conns: Mutex::new(Default::default()),
            next_conn: AtomicU64::new(0),
            metrics: metrics.clone(),
        });
        let (endpoint, accept) = server::start(server.clone()).map_err(TransportError::Bind)?;
        let hello = Hello::new(Plane::Data, node, incarnation);
        let client = Client::new(table.clone(), cfg, counters, hello, metrics);
        tracing::debug!(%endpoint, "tcp transport listening");
        Ok(TcpTransport {
            table,
            client,
            server,
            endpoint,
            accept: Mutex::new(Some(accept)),
        })
    }

    /// The address peers connect to.
    pub fn local_endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// Registers `len` bytes at `ptr` with `access`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid (allocated, and writable if peers or reads may write it)
    /// until the returned handle is dropped. Peers may read or write it at any time per
    /// `access`, concurrently with this process: callers that need consistency verify what they
    /// read (the pool's slot headers do).
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RegionHandle, TransportError> {
        let key = self.table.insert(ptr as u64, len as u64, access, None)?;
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: ptr as u64,
            len: len as u64,
            access,
        })
    }

    /// Registers `len` bytes at `ptr` as [`Access::RemoteReadWrite`], with every inbound write
    /// checked by `guard` (e.g. only ranges the writing node reserved).
    ///
    /// # Safety
    /// As [`TcpTransport::register`].
    pub unsafe fn register_guarded(
        &self,
        ptr: *mut u8,
        len: usize,
        guard: Arc<dyn crate::WriteGuard>,
    ) -> Result<RegionHandle, TransportError> {
        let access = Access::RemoteReadWrite;
        let key = self
            .table
            .insert(ptr as u64, len as u64, access, Some(guard))?;
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: ptr as u64,
            len: len as u64,
            access,
        })
    }

    /// Reads every op's remote range from `peer` into its local segments.
    pub fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Result<OpResults, TransportError> {
        self.check_open()?;
        self.client.read_batch(peer, batch)
    }

    /// Writes every op's local segments into its remote range on `peer`.
    pub fn write_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
    ) -> Result<OpResults, TransportError> {
        self.check_open()?;
        self.client.write_batch(peer, batch)
    }

    /// Drops pooled connections to a peer that left.
    pub fn forget_peer(&self, peer: SocketAddr) {
        self.client.forget(peer);
    }

    /// Per-peer counters of this node's client.
    pub fn peer_stats(&self) -> Vec<crate::PeerStats> {
        self.client.peer_stats()
    }

    /// Cumulative counters.
    pub fn stats(&self) -> TransportStats {
        self.server.counters.snapshot()
    }

    fn check_open(&self) -> Result<(), TransportError> {
        if self.server.stop.load(Ordering::Acquire) {
            Err(TransportError::Shutdown)
        } else {
            Ok(())
        }
    }

    /// Stops serving: closes the listener and every inbound connection. Idempotent.
    pub fn shutdown(&self) {
        if self.server.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept loop.
        let _ = std::net::TcpStream::connect_timeout(
            &self.endpoint,
            std::time::Duration::from_millis(200),
        );
        for (_, s) in self.server.conns.lock().drain() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.accept.lock().take() {
            let _ = h.join();
        }
    }

    /// Number of registered regions.
    pub fn region_count(&self) -> usize {
        self.table.read().len()
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

//! [`TcpTransport`]: the TCP engine (server + client sharing one region table).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::{Incarnation, NodeId};

use crate::client::Client;
use crate::rdma::path::RdmaPlane;
use crate::region::RegionTable;
use crate::server::{self, ServerShared};
use crate::stats::Counters;
use crate::{
    Access, Batch, OpResults, RegionHandle, TransportConfig, TransportError, TransportStats,
};

/// The TCP transport of one node: a data server for its registered regions and a client for
/// peers' regions. Cheap to share behind an `Arc`; all methods take `&self`.
///
/// # Example
///
/// An owner publishes a buffer read-only; a reader pulls a range of it straight into its own
/// registered memory (two transports on loopback, each with its own data server):
///
/// ```
/// use peercache_transport::{
///     Access, Batch, RemoteRange, Segment, TcpTransport, TransportConfig,
/// };
///
/// let owner = TcpTransport::start(TransportConfig::default(), None)?;
/// let mut published = vec![7u8; 64 << 10];
/// // SAFETY: `published` outlives the transport, which is shut down below.
/// let src = unsafe { owner.register(published.as_mut_ptr(), published.len(), Access::RemoteRead) }?;
///
/// let reader = TcpTransport::start(TransportConfig::default(), None)?;
/// let mut landing = vec![0u8; 4096];
/// // SAFETY: as above, `landing` outlives `reader`.
/// let dst = unsafe { reader.register(landing.as_mut_ptr(), landing.len(), Access::LocalOnly) }?;
///
/// let mut batch = Batch::new();
/// batch.push(
///     RemoteRange { region: src.key(), addr: src.addr(1024), len: 4096 },
///     &[Segment { region: dst.key(), addr: dst.addr(0), len: 4096 }],
/// );
/// let results = reader.read_batch(owner.local_endpoint(), &batch)?;
/// assert!(results.iter().all(|r| r.is_ok()));
/// reader.shutdown();
/// owner.shutdown();
/// drop((src, dst));
/// assert!(landing.iter().all(|&b| b == 7));
/// # Ok::<(), peercache_transport::TransportError>(())
/// ```
pub struct TcpTransport {
    table: Arc<RegionTable>,
    client: Client,
    server: Arc<ServerShared>,
    endpoint: SocketAddr,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
    rdma: Option<Arc<dyn RdmaPlane>>,
    /// Writes go one-sided over the RDMA path (`TransportConfig::rdma_writes`).
    rdma_writes: bool,
    /// The host-local path (`TransportConfig::host_local`): this node's listener and its
    /// attachments to peers on the same host.
    local: Option<(crate::local::LocalServer, crate::local::LocalClient)>,
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
        Self::start_with_rdma(cfg, node, None)
    }

    /// [`TcpTransport::start`] with an RDMA path: regions are registered on it too, reads go
    /// over it when the peer has one (else over TCP), and the data port also serves its
    /// bootstrap plane.
    pub fn start_with_rdma(
        cfg: TransportConfig,
        node: Option<NodeId>,
        rdma: Option<Arc<dyn RdmaPlane>>,
    ) -> Result<Self, TransportError> {
        let table = Arc::new(RegionTable::new());
        let counters = Arc::new(Counters::default());
        let incarnation = Incarnation::fresh();
        let metrics = crate::metrics::Handles::register();
        let local_server = if cfg.host_local {
            match crate::local::LocalServer::start(table.clone(), cfg.op_timeout) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "host-local path unavailable (no abstract Unix socket); peers on this host read over TCP");
                    None
                }
            }
        } else {
            None
        };
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
            rdma: rdma.clone(),
            local: local_server.as_ref().map(|s| s.invitation.clone()),
        });
        let rdma_writes = cfg.rdma_writes && rdma.is_some();
        let (endpoint, accept) = server::start(server.clone()).map_err(TransportError::Bind)?;
        let hello = Hello::new(Plane::Data, node, incarnation);
        let local = local_server.map(|s| {
            let c = crate::local::LocalClient::new(
                hello.clone(),
                cfg.auth.clone(),
                cfg.op_timeout,
                counters.clone(),
                metrics.local_read_bytes.clone(),
            );
            (s, c)
        });
        let client = Client::new(table.clone(), cfg, counters, hello, metrics);
        tracing::debug!(%endpoint, "tcp transport listening");
        Ok(TcpTransport {
            table,
            client,
            server,
            endpoint,
            accept: Mutex::new(Some(accept)),
            rdma,
            rdma_writes,
            local,
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
        let key = self
            .table
            .insert(ptr as u64, len as u64, access, None, false)?;
        // SAFETY: forwarded from the caller (the handle deregisters before the memory goes).
        let rdma = unsafe { self.rdma_register(key, ptr, len, access) };
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: ptr as u64,
            len: len as u64,
            access,
            rdma,
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
            .insert(ptr as u64, len as u64, access, Some(guard), false)?;
        // Guarded regions are read over RDMA like any other; writes into them go over TCP,
        // where the guard runs — unless `rdma_writes` trades the guard for one-sided writes.
        let on_nic = if self.rdma_writes {
            Access::RemoteReadWrite
        } else {
            Access::RemoteRead
        };
        // SAFETY: forwarded from the caller.
        let rdma = unsafe { self.rdma_register(key, ptr, len, on_nic) };
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: ptr as u64,
            len: len as u64,
            access,
            rdma,
        })
    }

    /// Registers device (GPU) memory for GPUDirect RDMA. Only the RDMA path reaches it: the
    /// TCP plane refuses ops that name it ([`crate::OpError::DeviceOnly`]), so a peer without
    /// RDMA cannot read it and a read into it from such a peer fails per op. `RemoteRead`
    /// publishes it to RDMA peers; `LocalOnly` makes it a destination of this node's reads.
    ///
    /// Errors name the missing prerequisite: no RDMA path (`protocol = "rdma"` on a host with
    /// a NIC), `nvidia-peermem` for a plain device address, or the NIC's own refusal.
    ///
    /// # Safety
    /// The device memory (and a dma-buf fd) must stay valid until the handle is dropped.
    pub unsafe fn register_device(
        &self,
        mem: crate::DeviceMemory,
        access: Access,
    ) -> Result<RegionHandle, TransportError> {
        let Some(r) = self.rdma.as_ref() else {
            return Err(TransportError::Device(
                "device memory is reachable only over RDMA, and this transport runs TCP \
                 (protocol = \"rdma\" on a host with an RDMA NIC)"
                    .into(),
            ));
        };
        if access == Access::RemoteReadWrite {
            return Err(TransportError::Device(
                "device memory is registered remote-read or local-only (writes go over TCP)".into(),
            ));
        }
        let key = self
            .table
            .insert(mem.base(), mem.len() as u64, access, None, true)?;
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { r.register_device(key, &mem, access) } {
            self.table.remove(key);
            return Err(TransportError::Device(e.to_string()));
        }
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: mem.base(),
            len: mem.len() as u64,
            access,
            rdma: Some(r.clone()),
        })
    }

    /// Shares a registered region with peers on this host: they map `fd` (from `offset`, for
    /// the region's length) read-only and copy pages out of it instead of asking this node's
    /// data server. `fd` must be a memory file sealed against shrinking (`memfd_create` +
    /// `F_SEAL_SHRINK`, as the pool's `MemfdAlloc` makes), whose bytes at `offset` are the
    /// region's memory. Only remote-readable regions are offered. Without the host-local path
    /// (`TransportConfig::host_local` off) this is a no-op.
    pub fn share(
        &self,
        handle: &RegionHandle,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
    ) -> Result<(), TransportError> {
        if self.local.is_none() {
            return Ok(());
        }
        let owned = fd
            .try_clone_to_owned()
            .map_err(|_| TransportError::Register("cannot duplicate the memory file"))?;
        crate::local::check_file(&owned, offset, handle.len()).map_err(|why| {
            tracing::warn!(%why, "region not shared");
            TransportError::Register(
                "a shared region needs a memory file sealed against shrinking, page-aligned \
                 offset, long enough for the region",
            )
        })?;
        self.table.share(
            handle.key(),
            crate::region::SharedFile {
                fd: Arc::new(owned),
                offset,
            },
        )
    }

    /// Registers a region on the RDMA path too; on failure the region stays TCP-only.
    ///
    /// # Safety
    /// As [`TcpTransport::register`].
    unsafe fn rdma_register(
        &self,
        key: crate::RegionKey,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Option<Arc<dyn RdmaPlane>> {
        let r = self.rdma.as_ref()?;
        // SAFETY: forwarded from the caller.
        match unsafe { r.register(key, ptr, len, access) } {
            Ok(()) => Some(r.clone()),
            Err(e) => {
                tracing::warn!(error = %e, len, "RDMA registration failed; region served over TCP only");
                None
            }
        }
    }

    /// Reads every op's remote range from `peer` into its local segments.
    pub fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Result<OpResults, TransportError> {
        self.check_open()?;
        if batch.len() > self.client.cfg.max_batch_ops {
            return Err(TransportError::BatchTooLarge {
                ops: batch.len(),
                max: self.client.cfg.max_batch_ops,
            });
        }
        if let Some((_, l)) = &self.local
            && let Some(res) = l.read_batch(
                peer,
                batch,
                &self.table,
                self.client.cfg.max_op_bytes,
                &self.server.counters,
            )
        {
            self.client.count_reads(batch, &res);
            return Ok(res);
        }
        let res = match &self.rdma {
            Some(r) => match r.read_batch(peer, batch) {
                Some(res) => Ok(res),
                None => self.client.read_batch(peer, batch),
            },
            None => self.client.read_batch(peer, batch),
        };
        if let Some((_, l)) = &self.local
            && matches!(&res, Ok(r) if r.iter().any(|x| x.is_ok()))
        {
            l.network_read_ok(peer);
        }
        res
    }

    /// Whether reads from `peer` currently take the host-local path (it shares this host and
    /// the attach, which starts after the first successful network read from it, is done).
    pub fn host_local_attached(&self, peer: SocketAddr) -> bool {
        self.local
            .as_ref()
            .is_some_and(|(_, l)| l.is_attached(peer))
    }

    /// Writes every op's local segments into its remote range on `peer`.
    pub fn write_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
    ) -> Result<OpResults, TransportError> {
        self.check_open()?;
        if self.rdma_writes
            && let Some(r) = &self.rdma
            && let Some(res) = r.write_batch(peer, batch)
        {
            return Ok(res);
        }
        self.client.write_batch(peer, batch)
    }

    /// Drops pooled connections (and a host-local attachment) to a peer that left.
    pub fn forget_peer(&self, peer: SocketAddr) {
        self.client.forget(peer);
        if let Some((_, l)) = &self.local {
            l.forget(peer);
        }
    }

    /// Per-peer counters of this node's client.
    pub fn peer_stats(&self) -> Vec<crate::PeerStats> {
        self.client.peer_stats()
    }

    /// The RDMA path's counters (None without one).
    pub fn rdma_stats(&self) -> Option<crate::rdma::path::RdmaStats> {
        self.rdma.as_ref().map(|r| r.stats())
    }

    /// Cumulative counters.
    pub fn stats(&self) -> TransportStats {
        let mut s = self.server.counters.snapshot();
        if let Some((srv, l)) = &self.local {
            s.local_peers = l.attached() as u64;
            s.local_leases = srv.lease_count() as u64;
        }
        if let Some(r) = &self.rdma {
            let x = r.stats();
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
        s
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
        if let Some((srv, _)) = &self.local {
            srv.stop();
            srv.revoke();
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

//! [`Transport`]: one node's data plane — its region table, the data server on the data port,
//! and the ordered data paths a batch is handed to (same-host, RDMA, then TCP).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::{Incarnation, NodeId};

use crate::local::LocalPath;
use crate::metrics::Counters;
use crate::path::DataPath;
use crate::rdma::path::RdmaPlane;
use crate::rdma::route::RdmaRoute;
use crate::region::RegionTable;
use crate::tcp::{Client, ServerShared, server};
use crate::{
    Access, Batch, OpResults, RegionHandle, TransportConfig, TransportError, TransportStats,
};

/// The data plane of one node: a data server for its registered regions and a client for
/// peers' regions, over the fastest path that reaches each peer — same-host shared memory,
/// RDMA, or TCP, which reaches every peer and is tried last. Cheap to share behind an `Arc`;
/// all methods take `&self`.
///
/// # Example
///
/// An owner publishes a buffer read-only; a reader pulls a range of it straight into its own
/// registered memory (two transports on loopback, each with its own data server):
///
/// ```
/// use peercache_transport::{
///     Access, Batch, RemoteRange, Segment, Transport, TransportConfig,
/// };
///
/// let owner = Transport::start(TransportConfig::default(), None)?;
/// let mut published = vec![7u8; 64 << 10];
/// // SAFETY: `published` outlives the transport, which is shut down below.
/// let src = unsafe { owner.register(published.as_mut_ptr(), published.len(), Access::RemoteRead) }?;
///
/// let reader = Transport::start(TransportConfig::default(), None)?;
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
pub struct Transport {
    table: Arc<RegionTable>,
    /// The paths tried before TCP, in order: same-host, then RDMA.
    paths: Vec<Arc<dyn DataPath>>,
    /// The same-host path, for what only it does (sharing, attachment state).
    local: Option<Arc<LocalPath>>,
    /// The RDMA path, for what only it does (device memory, its counters).
    rdma: Option<Arc<RdmaRoute>>,
    /// The TCP client: the last path, always answers.
    tcp: Client,
    server: Arc<ServerShared>,
    endpoint: SocketAddr,
    accept: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Transport {
    /// Binds the data server and returns the running transport.
    pub fn start(cfg: TransportConfig, node: Option<NodeId>) -> Result<Self, TransportError> {
        Self::start_with_rdma(cfg, node, None)
    }

    /// [`Transport::start`] with an RDMA path: regions are registered on it too, reads go
    /// over it when the peer has one (else over TCP), and the data port also serves its
    /// bootstrap plane.
    pub fn start_with_rdma(
        cfg: TransportConfig,
        node: Option<NodeId>,
        rdma: Option<Arc<dyn RdmaPlane>>,
    ) -> Result<Self, TransportError> {
        let table = Arc::new(RegionTable::new());
        let counters = Arc::new(Counters::register());
        let incarnation = Incarnation::fresh();
        let hello = Hello::new(Plane::Data, node, incarnation);
        let local = if cfg.host_local {
            match LocalPath::start(table.clone(), &cfg, hello.clone(), counters.clone()) {
                Ok(l) => Some(Arc::new(l)),
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
            rdma: rdma.clone(),
            local: local.as_ref().map(|l| l.invites()),
        });
        let rdma = rdma.map(|r| Arc::new(RdmaRoute::new(r, cfg.rdma_writes)));
        let mut paths: Vec<Arc<dyn DataPath>> = Vec::new();
        if let Some(l) = &local {
            paths.push(l.clone());
        }
        if let Some(r) = &rdma {
            paths.push(r.clone());
        }
        let (endpoint, accept) = server::start(server.clone()).map_err(TransportError::Bind)?;
        let tcp = Client::new(table.clone(), cfg, counters, hello);
        tracing::debug!(%endpoint, paths = ?paths, "transport listening");
        Ok(Transport {
            table,
            paths,
            local,
            rdma,
            tcp,
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
        // SAFETY: forwarded from the caller.
        unsafe { self.register_with(ptr, len, crate::RegionOptions::new(access)) }
    }

    /// Registers `len` bytes at `ptr` as [`Access::RemoteReadWrite`], with every inbound write
    /// checked by `guard` (e.g. only ranges the writing node reserved).
    ///
    /// # Safety
    /// As [`Transport::register`].
    pub unsafe fn register_guarded(
        &self,
        ptr: *mut u8,
        len: usize,
        guard: Arc<dyn crate::WriteGuard>,
    ) -> Result<RegionHandle, TransportError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_with(ptr, len, crate::RegionOptions::guarded(guard)) }
    }

    /// Registers `len` bytes at `ptr` as `opts` say: its access, a write guard, and (for
    /// memory that is still being faulted in) when each part of it is resident, so the RDMA
    /// path registers a chunk with the NIC only once its owner faulted it in.
    ///
    /// # Safety
    /// As [`Transport::register`].
    pub unsafe fn register_with(
        &self,
        ptr: *mut u8,
        len: usize,
        opts: crate::RegionOptions,
    ) -> Result<RegionHandle, TransportError> {
        let access = opts.access;
        let key = self
            .table
            .insert(ptr as u64, len as u64, access, opts.guard.clone(), false)?;
        // SAFETY: forwarded from the caller (the handle deregisters before the memory goes).
        let paths = unsafe { self.register_on_paths(key, ptr, len, &opts) };
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: ptr as u64,
            len: len as u64,
            access,
            paths,
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
        if let Err(e) = unsafe { r.plane.register_device(key, &mem, access) } {
            self.table.remove(key);
            return Err(TransportError::Device(e.to_string()));
        }
        Ok(RegionHandle {
            table: self.table.clone(),
            key,
            base: mem.base(),
            len: mem.len() as u64,
            access,
            paths: vec![r.clone() as Arc<dyn DataPath>],
        })
    }

    /// Shares a registered region with peers on this host: they map `fd` (from `offset`, for
    /// the region's length) read-only and copy pages out of it instead of asking this node's
    /// data server. `fd` must be a read-only descriptor of a memory file sealed against
    /// shrinking and writing (`memfd_create` + `F_SEAL_SHRINK` + `F_SEAL_FUTURE_WRITE`, as the
    /// pool's `MemfdAlloc` makes), whose bytes at `offset` are the region's memory: peers get
    /// read access and nothing more. Only remote-readable regions are offered. Without the
    /// host-local path (`TransportConfig::host_local` off) this is a no-op.
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
        crate::local::check_shareable(&owned, offset, handle.len()).map_err(|why| {
            tracing::warn!(%why, "region not shared");
            TransportError::Register(
                "a shared region needs a read-only descriptor of a memory file sealed against \
                 shrinking and writing, a page-aligned offset, and a file long enough for the \
                 region",
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

    /// Registers a region on every path that keeps its own registrations; a path that fails
    /// leaves the region to the others.
    ///
    /// # Safety
    /// As [`Transport::register`].
    unsafe fn register_on_paths(
        &self,
        key: crate::RegionKey,
        ptr: *mut u8,
        len: usize,
        opts: &crate::RegionOptions,
    ) -> Vec<Arc<dyn DataPath>> {
        self.paths
            .iter()
            // SAFETY: forwarded from the caller.
            .filter(|p| unsafe { p.register(key, ptr, len, opts) })
            .cloned()
            .collect()
    }

    fn check_batch(&self, batch: &Batch) -> Result<(), TransportError> {
        self.check_open()?;
        let max = self.tcp.cfg.max_batch_ops;
        if batch.len() > max {
            return Err(TransportError::BatchTooLarge {
                ops: batch.len(),
                max,
            });
        }
        Ok(())
    }

    /// Reads every op's remote range from `peer` into its local segments, over the first path
    /// that takes the batch.
    pub fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Result<OpResults, TransportError> {
        self.read_via_paths(peer, batch, None)
    }

    /// As [`Transport::read_batch`], and `landed(i)` may be called for op `i` as soon as all
    /// its bytes are in its local segments, before this returns — over TCP, while the rest of
    /// the batch is still arriving, so the caller can check each page while its bytes are still
    /// in the CPU's caches. Ops never reported may have succeeded too (the results say); a
    /// reported op's bytes are final unless the whole batch fails.
    ///
    /// # Errors
    /// As [`Transport::read_batch`].
    pub fn read_batch_landing(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        landed: &mut dyn FnMut(usize),
    ) -> Result<OpResults, TransportError> {
        self.read_via_paths(peer, batch, Some(landed))
    }

    /// A read over the first path that takes it; TCP reports ops landing to `landed`.
    fn read_via_paths(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        landed: Option<&mut dyn FnMut(usize)>,
    ) -> Result<OpResults, TransportError> {
        self.check_batch(batch)?;
        for (i, p) in self.paths.iter().enumerate() {
            if let Some(res) = p.read_batch(peer, batch) {
                self.paths[..i]
                    .iter()
                    .for_each(|q| q.read_elsewhere(peer, &res));
                return res;
            }
        }
        let res = match landed {
            Some(landed) => self.tcp.read_batch_landing(peer, batch, landed),
            None => self.tcp.read_batch(peer, batch),
        };
        self.paths.iter().for_each(|q| q.read_elsewhere(peer, &res));
        res
    }

    /// Whether reads from `peer` currently take the host-local path (it shares this host and
    /// the attach, which starts after the first successful network read from it, is done).
    pub fn host_local_attached(&self, peer: SocketAddr) -> bool {
        self.local.as_ref().is_some_and(|l| l.is_attached(peer))
    }

    /// Writes every op's local segments into its remote range on `peer`, over the first path
    /// that takes the batch.
    pub fn write_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
    ) -> Result<OpResults, TransportError> {
        self.check_open()?;
        for p in &self.paths {
            if let Some(res) = p.write_batch(peer, batch) {
                return res;
            }
        }
        self.tcp.write_batch(peer, batch)
    }

    /// Drops what every path keeps for a peer that left (pooled connections, a same-host
    /// attachment).
    pub fn forget_peer(&self, peer: SocketAddr) {
        self.tcp.forget(peer);
        self.paths.iter().for_each(|p| p.forget_peer(peer));
    }

    /// Tells the transport that memory it may have read into or written from without
    /// registration ([`Batch::allow_unregistered`]) is about to be unmapped or reused: the RDMA
    /// path drops its cached registrations overlapping `[ptr, ptr+len)` (at once, or when the
    /// batch using one ends). Call it before freeing such a buffer; a cached registration
    /// pins the pages it was made on, so memory mapped again at the same address would
    /// otherwise not receive RDMA reads. No-op without an RDMA path.
    ///
    /// [`Batch::allow_unregistered`]: crate::Batch::allow_unregistered
    pub fn forget_local(&self, ptr: *const u8, len: usize) {
        if let Some(r) = &self.rdma {
            r.plane.forget_local(ptr as u64, len as u64);
        }
    }

    /// Per-peer counters of this node's client.
    pub fn peer_stats(&self) -> Vec<crate::PeerStats> {
        self.tcp.peer_stats()
    }

    /// The RDMA path's counters (None without one).
    pub fn rdma_stats(&self) -> Option<crate::rdma::path::RdmaStats> {
        self.rdma.as_ref().map(|r| r.plane.stats())
    }

    /// Peers read over TCP for now because their RDMA setup failed (empty without an RDMA
    /// path), each with the reason and when RDMA is tried again.
    pub fn rdma_peers_on_tcp(&self) -> Vec<crate::rdma::path::PeerOnTcp> {
        self.rdma
            .as_ref()
            .map(|r| r.plane.peers_on_tcp())
            .unwrap_or_default()
    }

    /// Cumulative counters.
    pub fn stats(&self) -> TransportStats {
        let mut s = self.server.counters.snapshot();
        self.paths.iter().for_each(|p| p.add_stats(&mut s));
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
        self.paths.iter().for_each(|p| p.shutdown());
        if let Some(h) = self.accept.lock().take() {
            let _ = h.join();
        }
    }

    /// Number of registered regions.
    pub fn region_count(&self) -> usize {
        self.table.read().len()
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

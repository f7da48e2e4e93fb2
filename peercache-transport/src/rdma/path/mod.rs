//! One-sided RDMA reads behind the TCP transport's API: [`RdmaPath`] registers every region on
//! every rail as the transport registers it, serves the bootstrap plane on the data port (queue
//! pairs and the region table), and turns a read batch into engine ops — remote rkeys from the
//! peer's region table, local keys from this node's registrations. A batch it cannot carry
//! (the peer has no RDMA, a region it does not know, a local segment outside registered memory)
//! goes over TCP instead. Writes go over TCP too, because only the TCP server checks a write
//! against the writer's reservation — unless the transport enables `rdma_writes` and the
//! peer registered the region remote-writable on its NIC (then verification happens at commit).
//!
//! The interfaces live in `plane`; this node's registrations (whole or in chunks, the rest
//! registered in the background) in `regions`; peers' region tables and who is left on TCP in
//! `peers`; turning a batch into engine ops, with the lazy registrations of caller memory, in
//! `ops`.

use super::RdmaError;
use super::holder::Holder;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use peercache_wire::NodeId;
use peercache_wire::auth::Auth;

use super::bootstrap::{self, Responder};
use super::engine::{Engine, MAX_RAILS, RdmaOp, Verbs};
use super::mr_cache::{self, MrCache};
use crate::metrics::RdmaCounters;
use crate::{Access, Batch, OpResults, RegionKey, Residency};

mod ops;
mod peers;
mod plane;
mod regions;

use peers::Peer;
pub use plane::{PeerOnTcp, RailKeys, RdmaPlane, RdmaStats, Registrar};
use regions::LocalRegion;

/// Metric names of the RDMA path.
pub use crate::metrics::rdma as metric;

/// The default registration chunk: a region longer than this is registered with the NIC in
/// chunks of this size, the first before `register` returns and the rest in the background.
pub const DEFAULT_REGISTER_CHUNK: u64 = 1 << 30;

/// Settings of an [`RdmaPath`] beyond its verbs, identity and deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathOptions {
    /// Queue pairs per (peer, rail), idle or in use (`max_channels_per_peer`); a batch that
    /// finds them all busy waits within its deadline.
    pub max_channels: usize,
    /// Registration chunk in bytes (`rdma_register_chunk`): a longer region that peers may
    /// target is registered in chunks this long, the first at once and the rest on a
    /// background thread, so no single registration pins more and peers read the first chunks
    /// while later ones register. An op across two chunks goes over TCP, so a caller picks a
    /// multiple of its page layout (the store: whole pool slabs). Local-only regions are
    /// registered whole. 0 registers every region whole. Rounded up to whole 4 KiB pages.
    pub register_chunk: u64,
}

impl Default for PathOptions {
    fn default() -> Self {
        PathOptions {
            max_channels: 16,
            register_chunk: DEFAULT_REGISTER_CHUNK,
        }
    }
}

/// The RDMA path over a verbs backend `V`.
pub struct RdmaPath<V: Verbs + Registrar + Responder> {
    /// This path, for the threads that register chunks in the background.
    me: Weak<Self>,
    /// Registration chunk in bytes (0: whole regions).
    chunk: u64,
    engine: Engine<V>,
    local: RwLock<HashMap<u64, LocalRegion>>,
    peers: Mutex<HashMap<SocketAddr, Peer>>,
    node: Option<NodeId>,
    auth: Auth,
    timeout: Duration,
    counters: RdmaCounters,
    /// Caller memory registered lazily, kept for the batches that reuse it.
    mrs: Mutex<MrCache<RailKeys>>,
    /// Peers' queue pairs served by this host (None: the thread could not start).
    holder: Option<Holder<<V as Responder>::Held>>,
}

impl<V: Verbs + Registrar + Responder> std::fmt::Debug for RdmaPath<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaPath")
            .field("rails", &Verbs::rails(self.engine.verbs()))
            .field("regions", &self.local.read().len())
            .finish()
    }
}

impl<V: Verbs + Registrar + Responder> RdmaPath<V> {
    /// A path over `verbs`; bootstrap exchanges and batches are bounded by `timeout`; at most
    /// 16 queue pairs per (peer, rail) (the `max_channels_per_peer` default).
    pub fn new(verbs: V, node: Option<NodeId>, auth: Auth, timeout: Duration) -> Arc<Self> {
        Self::with_options(verbs, node, auth, timeout, PathOptions::default())
    }

    /// [`RdmaPath::new`] with at most `max_channels` queue pairs per (peer, rail), idle or in
    /// use (`max_channels_per_peer`); a batch that finds them all busy waits within its
    /// deadline.
    pub fn with_channel_limit(
        verbs: V,
        node: Option<NodeId>,
        auth: Auth,
        timeout: Duration,
        max_channels: usize,
    ) -> Arc<Self> {
        let options = PathOptions {
            max_channels,
            ..PathOptions::default()
        };
        Self::with_options(verbs, node, auth, timeout, options)
    }

    /// A path over `verbs` with `options` (queue pairs per peer, registration chunk).
    pub fn with_options(
        verbs: V,
        node: Option<NodeId>,
        auth: Auth,
        timeout: Duration,
        options: PathOptions,
    ) -> Arc<Self> {
        metrics::gauge!(crate::metrics::rdma::compat::RAILS)
            .set(Verbs::rails(&verbs).min(MAX_RAILS) as f64);
        const PAGE: u64 = 4096;
        // Peers' queue pairs on this host, held by one thread for all of them.
        let holder = Holder::start()
            .map_err(|e| {
                tracing::warn!(
                    error = %e,
                    "rdma: no queue-pair holder thread; each peer queue pair holds a thread"
                )
            })
            .ok();
        Arc::new_cyclic(|me| RdmaPath {
            me: me.clone(),
            chunk: options.register_chunk.div_ceil(PAGE) * PAGE,
            // At most 4 idle queue pairs kept per (peer, rail).
            engine: Engine::with_channel_limit(verbs, 4, options.max_channels),
            holder,
            local: RwLock::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
            node,
            auth,
            timeout,
            counters: RdmaCounters::register(),
            mrs: Mutex::new(MrCache::new(mr_cache::MAX_ENTRIES, mr_cache::MAX_BYTES)),
        })
    }

    /// The engine (its counters).
    pub fn engine(&self) -> &Engine<V> {
        &self.engine
    }

    /// Peers' queue pairs this host holds for them now (one thread holds them all).
    pub fn served_queue_pairs(&self) -> usize {
        self.holder.as_ref().map_or(0, Holder::held)
    }
}

impl<V: Verbs + Registrar + Responder + 'static> RdmaPlane for RdmaPath<V> {
    unsafe fn register(
        &self,
        key: RegionKey,
        ptr: *mut u8,
        len: usize,
        access: Access,
        resident: Option<Arc<dyn Residency>>,
    ) -> Result<(), RdmaError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_region(key, ptr, len, access, resident) }
    }

    unsafe fn register_device(
        &self,
        key: RegionKey,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<(), RdmaError> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_device_region(key, mem, access) }
    }

    fn deregister(&self, key: RegionKey) {
        self.deregister_region(key);
    }

    fn forget_local(&self, addr: u64, len: u64) {
        self.forget_lazy(addr, len);
    }

    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> Option<OpResults> {
        self.one_sided(peer, batch, RdmaOp::Read)
    }

    fn write_batch(&self, peer: SocketAddr, batch: &Batch) -> Option<OpResults> {
        self.one_sided(peer, batch, RdmaOp::Write)
    }

    fn serve(&self, stream: TcpStream) {
        let table = || self.table();
        let Some(holder) = &self.holder else {
            // No holding thread (it could not start): this connection's thread holds it.
            if let Err(e) =
                bootstrap::serve_request(stream, self.engine.verbs(), &table, self.timeout)
            {
                tracing::debug!(error = %e, "rdma bootstrap connection ended with an error");
            }
            return;
        };
        match bootstrap::accept_request(stream, self.engine.verbs(), &table, self.timeout) {
            Ok(Some((socket, qp))) => holder.hold(socket, qp),
            Ok(None) => {}
            Err(e) => tracing::debug!(error = %e, "rdma bootstrap request failed"),
        }
    }

    fn stats(&self) -> RdmaStats {
        let (c, e) = (&self.counters, &self.engine.counters);
        let (registered, all) = self.registration();
        RdmaStats {
            registered_bytes: registered,
            registering_bytes: all.saturating_sub(registered),
            read_ops: c.read_ops.get(),
            read_bytes: c.read_bytes.get(),
            op_errors: c.op_errors.get(),
            fallbacks: c.fallbacks.get(),
            table_fetches: c.table_fetches.get(),
            write_ops: c.write_ops.get(),
            write_bytes: c.write_bytes.get(),
            lazy_registrations: c.lazy_registrations.get(),
            lazy_mr_hits: c.lazy_hits.get(),
            lazy_mrs: self.mrs.lock().len() as u64,
            wc_errors: e.wc_errors_total(),
            last_wc_status: e.last_wc_status.load(Ordering::Relaxed),
            timeouts: e.timeouts_total(),
            channel_discards: e.channel_discards.get(),
            post_failures: e.post_failures.get(),
            lease_failures: e.lease_failures.get(),
            drain_timeouts: e.drain_timeouts.get(),
            peers_unavailable: c.unavailable.get(),
        }
    }

    fn peers_on_tcp(&self) -> Vec<PeerOnTcp> {
        self.unavailable_peers()
    }
}

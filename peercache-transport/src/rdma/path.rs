//! One-sided RDMA reads behind the TCP transport's API: [`RdmaPath`] registers every region on
//! every rail as the transport registers it, serves the bootstrap plane on the data port (queue
//! pairs and the region table), and turns a read batch into engine ops — remote rkeys from the
//! peer's region table, local keys from this node's registrations. A batch it cannot carry
//! (the peer has no RDMA, a region it does not know, a local segment outside registered memory)
//! goes over TCP instead. Writes go over TCP too, because only the TCP server checks a write
//! against the writer's reservation — unless the transport enables `rdma_writes` and the
//! peer registered the region remote-writable on its NIC (then verification happens at commit).

use super::RdmaError;
use super::holder::Holder;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use peercache_wire::NodeId;
use peercache_wire::auth::Auth;
use smallvec::SmallVec;

use super::bootstrap::{self, ChunkedRegion, RegionRkeys, RegionTables, Responder};
use super::engine::{Engine, EngineOp, LocalSge, MAX_RAILS, RdmaOp, RdmaOpError, Verbs};
use super::mr_cache::{self, MrCache, Pin};
use crate::{Access, Batch, OpError, OpResults, RegionKey, Residency};

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

/// Metric names of the RDMA path.
pub use crate::metrics::rdma as metric;

use crate::metrics::RdmaCounters;

/// A region of this node's as the NIC knows it: registered whole (one chunk of its full
/// length) or in chunks, of which those registered so far are a prefix.
struct LocalRegion {
    base: u64,
    len: u64,
    access: Access,
    /// Chunk length (the region's length when registered whole).
    chunk: u64,
    /// Chunks in all.
    chunks: u32,
    /// Keys of the chunks registered so far, first chunk first.
    keys: Vec<RailKeys>,
    /// The thread registering the remaining chunks, while it runs.
    filler: Option<Filler>,
}

impl LocalRegion {
    /// The local keys of the registered chunk holding all of `[addr, addr + len)`.
    fn lkeys(&self, addr: u64, len: u64) -> Option<[u32; MAX_RAILS]> {
        let ready = self.keys.len();
        let i = peercache_wire::qp::chunk_index(self.base, self.len, self.chunk, ready, addr, len)?;
        Some(self.keys[i].lkeys)
    }

    /// Bytes of the region registered so far.
    fn registered_bytes(&self) -> u64 {
        (self.keys.len() as u64)
            .saturating_mul(self.chunk)
            .min(self.len)
    }
}

/// The background registration of a region's remaining chunks.
struct Filler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Filler {
    /// Stops it after the chunk it is registering and waits for it.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// A peer's region table as this node reads it: every region in the chunked form (one
/// registered whole is a single chunk of its full length).
struct RemoteTable {
    regions: HashMap<u64, ChunkedRegion>,
    /// Some region had chunks still to register when the table was fetched.
    incomplete: bool,
    fetched: Instant,
}

impl RemoteTable {
    fn new(t: RegionTables) -> Self {
        let whole = t.whole.into_iter().map(|r: RegionRkeys| ChunkedRegion {
            key: r.key,
            base: r.base,
            len: r.len,
            chunk: r.len.max(1),
            chunks: 1,
            rkeys: vec![r.rkeys],
            writable: r.writable,
        });
        let regions: HashMap<u64, ChunkedRegion> =
            whole.chain(t.chunked).map(|r| (r.key, r)).collect();
        RemoteTable {
            incomplete: regions.values().any(|r| !r.complete()),
            regions,
            fetched: Instant::now(),
        }
    }

    /// Whether an op of `batch` targets a chunk of a region the peer was still registering
    /// when this table was fetched (a newer table may have its keys). Free once the peer's
    /// regions were all complete: no op is looked at.
    fn awaits_chunks(&self, batch: &Batch) -> bool {
        self.incomplete
            && batch.ops().iter().any(|o| {
                self.regions.get(&o.remote.region.0).is_some_and(|r| {
                    !r.complete()
                        && crate::validate::contains(
                            r.base,
                            r.len,
                            o.remote.addr,
                            u64::from(o.remote.len),
                        )
                        && r.chunk_of(o.remote.addr, u64::from(o.remote.len)).is_none()
                })
            })
    }
}

/// A peer's RDMA state.
enum Peer {
    /// Its region table.
    Ready(Arc<RemoteTable>),
    /// No RDMA there (or the fetch failed); retry after `until`. `why` says what failed.
    Unavailable { until: Instant, why: String },
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

/// How long a peer without RDMA is left on TCP before asking again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often a peer's table is fetched again while a batch targets chunks it was still
/// registering (those batches go over TCP meanwhile).
const CHUNK_REFRESH: Duration = Duration::from_millis(200);

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

    /// Deregisters what the lazy-MR cache let go, and updates its gauge.
    fn release_mrs(&self, keys: Vec<RailKeys>, held: usize) {
        for k in &keys {
            Registrar::deregister(self.engine.verbs(), k);
        }
        self.counters.lazy_mrs.set(held as f64);
    }

    /// The engine (its counters).
    pub fn engine(&self) -> &Engine<V> {
        &self.engine
    }

    /// Peers' queue pairs this host holds for them now (one thread holds them all).
    pub fn served_queue_pairs(&self) -> usize {
        self.holder.as_ref().map_or(0, Holder::held)
    }

    /// The regions peers may target, with the keys registered so far.
    fn table(&self) -> RegionTables {
        let rails = Verbs::rails(self.engine.verbs()).min(MAX_RAILS);
        let mut t = RegionTables::default();
        for (k, r) in self.local.read().iter() {
            if r.access == Access::LocalOnly {
                continue;
            }
            let writable = r.access == Access::RemoteReadWrite;
            // A region of one chunk not registered yet goes out in the chunked form (no
            // chunk ready), so a reader asks again instead of taking it for unknown.
            if r.chunks == 1 && !r.keys.is_empty() {
                t.whole.extend(r.keys.first().map(|keys| RegionRkeys {
                    key: *k,
                    base: r.base,
                    len: r.len,
                    rkeys: keys.rkeys[..rails].to_vec(),
                    writable,
                }));
            } else {
                t.chunked.push(ChunkedRegion {
                    key: *k,
                    base: r.base,
                    len: r.len,
                    chunk: r.chunk,
                    chunks: r.chunks,
                    rkeys: r.keys.iter().map(|k| k.rkeys[..rails].to_vec()).collect(),
                    writable,
                });
            }
        }
        t
    }

    /// Bytes of this node's regions registered with the NIC so far, and in all (they differ
    /// while chunks are registered in the background).
    pub fn registration(&self) -> (u64, u64) {
        self.local.read().values().fold((0, 0), |(done, all), r| {
            (done + r.registered_bytes(), all + r.len)
        })
    }

    /// Sets the registration gauges from the regions as they are now.
    fn publish_registration(&self) {
        let (done, all) = self.registration();
        self.counters.registered.set(done as f64);
        self.counters
            .registering
            .set(all.saturating_sub(done) as f64);
    }

    /// The peer's region table, fetching it when unknown (or when `refresh`).
    fn peer_regions(&self, peer: SocketAddr, refresh: bool) -> Option<Arc<RemoteTable>> {
        {
            let peers = self.peers.lock();
            match peers.get(&peer) {
                Some(Peer::Ready(t)) if !refresh => return Some(t.clone()),
                Some(Peer::Unavailable { until, .. }) if Instant::now() < *until => return None,
                _ => {}
            }
        }
        self.counters.table_fetches.add(1);
        match bootstrap::fetch_regions(peer, self.node.clone(), &self.auth, self.timeout) {
            Ok(tables) => {
                let t = Arc::new(RemoteTable::new(tables));
                self.peers.lock().insert(peer, Peer::Ready(t.clone()));
                Some(t)
            }
            Err(e) => {
                self.mark_unavailable(peer, format!("region table: {e}"));
                None
            }
        }
    }

    /// Leaves `peer` on TCP for [`RETRY_AFTER`]: one WARN line with the reason, counted in
    /// `peercache_rdma_peers_unavailable_total`, listed by [`RdmaPlane::peers_on_tcp`].
    fn mark_unavailable(&self, peer: SocketAddr, why: String) {
        tracing::warn!(
            %peer, reason = %why,
            "no RDMA to this peer: reading and writing over TCP for {} s", RETRY_AFTER.as_secs()
        );
        self.counters.unavailable.add(1);
        self.peers.lock().insert(
            peer,
            Peer::Unavailable {
                until: Instant::now() + RETRY_AFTER,
                why,
            },
        );
    }

    /// Engine ops for the ops of `batch` numbered `idx`, or None when one cannot go over
    /// RDMA (a chunk the peer had not registered, an op across two chunks, local memory no
    /// registration covers).
    fn build(
        &self,
        batch: &Batch,
        idx: &[usize],
        remote: &RemoteTable,
        kind: RdmaOp,
        lazy: &LazyRegs<'_, V>,
    ) -> Option<Vec<EngineOp>> {
        let local = self.local.read();
        let mut ops = Vec::with_capacity(idx.len());
        for &i in idx {
            let op = &batch.ops()[i];
            let r = remote.regions.get(&op.remote.region.0)?;
            let c = r.chunk_of(op.remote.addr, u64::from(op.remote.len))?;
            let mut rkeys: SmallVec<[u32; 2]> = SmallVec::new();
            rkeys.extend(r.rkeys[c].iter().copied());
            let mut segs: SmallVec<[LocalSge; 4]> = SmallVec::new();
            for s in batch.op_segments(op) {
                let lkeys = if s.region == RegionKey::UNREGISTERED && batch.allows_unregistered() {
                    lazy.keys_for(s.addr, u64::from(s.len))?
                } else {
                    local.get(&s.region.0)?.lkeys(s.addr, u64::from(s.len))?
                };
                segs.push(LocalSge {
                    addr: s.addr,
                    len: s.len,
                    lkeys,
                });
            }
            ops.push(EngineOp {
                op: kind,
                local: segs,
                remote_addr: op.remote.addr,
                rkeys,
            });
        }
        Some(ops)
    }

    /// Covers the batch's [`RegionKey::UNREGISTERED`] segments with registrations: their
    /// page-aligned ranges, merged (so the many segments of one caller buffer cost one), each
    /// taken from the lazy-MR cache or registered and cached. None when a registration fails
    /// (the batch then goes over TCP, which needs none).
    fn lazy_register(&self, batch: &Batch) -> Option<LazyRegs<'_, V>> {
        let mut regs = LazyRegs {
            path: self,
            regs: SmallVec::new(),
            pins: SmallVec::new(),
            any: Registrar::local_any(self.engine.verbs()),
        };
        if !batch.allows_unregistered() || regs.any.is_some() {
            return Some(regs);
        }
        let mut ranges: Vec<(u64, u64)> = batch
            .segments()
            .iter()
            .filter(|s| s.region == RegionKey::UNREGISTERED && s.len > 0)
            .filter_map(|s| page_range(s.addr, u64::from(s.len)))
            .collect();
        if ranges.is_empty() {
            return Some(regs);
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut missed = Vec::new();
        {
            let mut cache = self.mrs.lock();
            for (a, b) in merged {
                match cache.get(a, b) {
                    Some((pin, keys)) => {
                        regs.pins.push(pin);
                        regs.regs.push((a, b, keys.lkeys));
                    }
                    None => missed.push((a, b)),
                }
            }
        }
        let hits = regs.pins.len();
        if hits > 0 {
            self.counters.lazy_hits.add(hits as u64);
        }
        for (a, b) in missed {
            // SAFETY: the range covers segments the caller promised valid for the batch
            // (`Batch::allow_unregistered`), rounded out to whole pages, which stay mapped as
            // long as any byte of them is. Cached afterwards: the cache keeps it pinned while
            // any batch uses it and deregisters it only after that batch's engine drained.
            let keys = unsafe {
                Registrar::register(
                    self.engine.verbs(),
                    a as *mut u8,
                    (b - a) as usize,
                    Access::LocalOnly,
                )
            };
            match keys {
                Ok(keys) => {
                    self.counters.lazy_registrations.add(1);
                    regs.regs.push((a, b, keys.lkeys));
                    let (pin, out, held) = {
                        let mut cache = self.mrs.lock();
                        let (pin, out) = cache.insert(a, b, keys);
                        (pin, out, cache.len())
                    };
                    regs.pins.push(pin);
                    self.release_mrs(out, held);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "lazy registration failed; this batch goes over TCP");
                    return None;
                }
            }
        }
        Some(regs)
    }

    /// Carries `batch` one-sided as `kind`, or `None` when it must go over TCP.
    fn one_sided(&self, peer: SocketAddr, batch: &Batch, kind: RdmaOp) -> Option<OpResults> {
        let fallback = || {
            self.counters.fallbacks.add(1);
            None
        };
        let Some(mut remote) = self.peer_regions(peer, false) else {
            return fallback();
        };
        let unknown = batch
            .ops()
            .iter()
            .any(|o| !remote.regions.contains_key(&o.remote.region.0));
        // A region registered after our last fetch (or the peer restarted), or a chunk the
        // peer was still registering then (asked again at most every `CHUNK_REFRESH`).
        if unknown
            || (remote.incomplete
                && remote.fetched.elapsed() >= CHUNK_REFRESH
                && remote.awaits_chunks(batch))
        {
            match self.peer_regions(peer, true) {
                Some(t) => remote = t,
                None => return fallback(),
            }
        }
        // A write needs every target registered remote-writable on the peer's NIC; otherwise
        // the TCP server (and its guard) decides.
        if kind == RdmaOp::Write
            && batch.ops().iter().any(|o| {
                !remote
                    .regions
                    .get(&o.remote.region.0)
                    .is_some_and(|r| r.writable)
            })
        {
            return fallback();
        }
        // Ops the peer's table rejects fail here with the TCP server's typed errors; the rest
        // go over RDMA.
        let mut results: OpResults = (0..batch.len())
            .map(|i| check_op(batch, i, &remote.regions))
            .collect();
        // Caller memory outside registered regions: covered by cached registrations or
        // registered now (pinned until the engine has drained every request that targets it).
        let Some(lazy) = self.lazy_register(batch) else {
            return fallback();
        };
        let idx: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_ok()).collect();
        let Some(ops) = self.build(batch, &idx, &remote, kind, &lazy) else {
            return fallback();
        };
        let done = self.engine.execute(&peer.to_string(), &ops, self.timeout);
        if !done.is_empty() && done.iter().all(|r| *r == Err(RdmaOpError::Post)) {
            // No queue pair could be connected: leave this peer on TCP for a while.
            self.mark_unavailable(peer, "no queue pair could be connected".into());
            return fallback();
        }
        let (mut ok_ops, mut ok_bytes) = (0u64, 0u64);
        for (&i, r) in idx.iter().zip(done) {
            let len = u64::from(batch.ops()[i].remote.len);
            results[i] = match r {
                Ok(()) => {
                    ok_ops += 1;
                    ok_bytes += len;
                    Ok(())
                }
                Err(e) => {
                    self.counters.op_errors.add(1);
                    Err(match e {
                        RdmaOpError::Wc(10) => OpError::AccessDenied(batch.ops()[i].remote.region),
                        other => OpError::Batch(format!("rdma: {other}")),
                    })
                }
            };
        }
        if kind == RdmaOp::Write {
            self.counters.write_ops.add(ok_ops);
            self.counters.write_bytes.add(ok_bytes);
        } else {
            self.counters.read_ops.add(ok_ops);
            self.counters.read_bytes.add(ok_bytes);
        }
        Some(results)
    }
}

/// The registration of one region's chunks after the first, in order, on its own thread.
struct Fill<V: Verbs + Registrar + Responder> {
    path: Weak<RdmaPath<V>>,
    key: u64,
    base: u64,
    len: u64,
    chunk: u64,
    /// Chunks registered before the thread started.
    from: u32,
    access: Access,
    /// When set, a chunk is registered only once its memory is in.
    resident: Option<Arc<dyn Residency>>,
    stop: Arc<AtomicBool>,
}

/// How long the registering thread waits for a chunk's memory before it looks at its stop
/// flag again (bounds how long dropping a region that is still warming waits).
const RESIDENT_STEP: Duration = Duration::from_millis(50);

impl<V: Verbs + Registrar + Responder> Fill<V> {
    /// Waits until `[at, at + n)` is resident; false when told to stop first.
    fn wait_resident(&self, at: u64, n: u64) -> bool {
        let Some(r) = &self.resident else {
            return true;
        };
        // Pinning memory nobody touched yet would fault it in from this thread (on this
        // thread's NUMA node, and before the pool's own thread faults it again).
        while !r.wait_resident(at - self.base, n, RESIDENT_STEP) {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
        }
        true
    }

    fn run(self) {
        let started = Instant::now();
        let mut at = self.base + u64::from(self.from) * self.chunk;
        let end = self.base + self.len;
        while at < end {
            let n = self.chunk.min(end - at);
            if self.stop.load(Ordering::Relaxed) || !self.wait_resident(at, n) {
                return;
            }
            let Some(path) = self.path.upgrade() else {
                return;
            };
            let verbs = path.engine.verbs();
            // SAFETY: `[at, at + n)` lies within the region the transport registered, whose
            // memory stays valid until `RdmaPlane::deregister`; that stops this thread and
            // waits for it before it removes the region and returns.
            let keys = match unsafe {
                Registrar::register(verbs, at as *mut u8, n as usize, self.access)
            } {
                Ok(keys) => keys,
                Err(e) => {
                    tracing::warn!(
                        error = %e, offset = at - self.base,
                        "rdma: registering a chunk failed; the rest of this region is read over TCP"
                    );
                    return;
                }
            };
            let kept = match path.local.write().get_mut(&self.key) {
                Some(r) => {
                    r.keys.push(keys.clone());
                    true
                }
                None => false,
            };
            if !kept {
                Registrar::deregister(verbs, &keys);
                return;
            }
            path.publish_registration();
            at += n;
        }
        tracing::info!(
            bytes = self.len,
            chunk = self.chunk,
            secs = started.elapsed().as_secs_f64(),
            "rdma: region registered in chunks"
        );
    }
}

/// The registrations covering one batch's caller memory, pinned in the lazy-MR cache until
/// dropped (after the engine drained), or the implicit on-demand-paging keys that cover it
/// without registering.
struct LazyRegs<'a, V: Verbs + Registrar + Responder> {
    path: &'a RdmaPath<V>,
    /// (start, end, local keys) of each page-aligned range.
    regs: SmallVec<[(u64, u64, [u32; MAX_RAILS]); 2]>,
    pins: SmallVec<[Pin; 2]>,
    /// Keys of an implicit on-demand-paging registration (covers every address).
    any: Option<[u32; MAX_RAILS]>,
}

impl<V: Verbs + Registrar + Responder> LazyRegs<'_, V> {
    /// The local keys of the registration holding `[addr, addr+len)`.
    fn keys_for(&self, addr: u64, len: u64) -> Option<[u32; MAX_RAILS]> {
        let end = addr.checked_add(len)?;
        if let Some(any) = self.any {
            return Some(any);
        }
        self.regs
            .iter()
            .find(|(a, b, _)| addr >= *a && end <= *b)
            .map(|(_, _, k)| *k)
    }
}

impl<V: Verbs + Registrar + Responder> Drop for LazyRegs<'_, V> {
    fn drop(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let (out, held) = {
            let mut cache = self.path.mrs.lock();
            let out = cache.release(&self.pins);
            (out, cache.len())
        };
        self.path.release_mrs(out, held);
    }
}

/// `[addr, addr+len)` rounded out to whole 4 KiB pages; None if it wraps.
fn page_range(addr: u64, len: u64) -> Option<(u64, u64)> {
    const PAGE: u64 = 4096;
    let end = addr.checked_add(len)?.checked_add(PAGE - 1)?;
    Some((addr & !(PAGE - 1), end & !(PAGE - 1)))
}

/// The per-op checks the TCP server would make, done here against the peer's table (the NIC
/// would only say "remote access error").
fn check_op(batch: &Batch, i: usize, remote: &HashMap<u64, ChunkedRegion>) -> Result<(), OpError> {
    let op = &batch.ops()[i];
    let key = op.remote.region;
    let r = remote.get(&key.0).ok_or(OpError::UnknownRegion(key))?;
    crate::validate::range(key, r.base, r.len, op.remote.addr, u64::from(op.remote.len))?;
    crate::validate::segments_add_up(batch, op)
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
        let (base, total) = (ptr as u64, len as u64);
        // Memory only this node targets is registered whole: its segments may lie anywhere,
        // and one across two registrations could not be carried.
        let local = access == Access::LocalOnly;
        let chunk = if self.chunk == 0 || total <= self.chunk || local {
            total.max(1)
        } else {
            self.chunk
        };
        let chunks = u32::try_from(total.div_ceil(chunk).max(1))
            .map_err(|_| RdmaError::Unsupported("a region of more than 2^32 chunks"))?;
        let first = chunk.min(total) as usize;
        let resident = resident.filter(|_| !local);
        // The first chunk is registered here when its memory is in (so a NIC that refuses keeps
        // the region off RDMA at once); otherwise the thread registers it as it comes in.
        let now = resident
            .as_ref()
            .is_none_or(|r| r.wait_resident(0, first as u64, Duration::ZERO));
        let keys = if now {
            // SAFETY: forwarded from the caller; the first chunk lies within `ptr..ptr+len`.
            vec![unsafe { Registrar::register(self.engine.verbs(), ptr, first, access) }?]
        } else {
            Vec::new()
        };
        let registered = keys.len() as u32;
        // The region goes in first: the thread adds each chunk to it (and one it cannot find
        // was deregistered meanwhile).
        self.local.write().insert(
            key.0,
            LocalRegion {
                base,
                len: total,
                access,
                chunk,
                chunks,
                keys,
                filler: None,
            },
        );
        if chunks > registered {
            let stop = Arc::new(AtomicBool::new(false));
            let job = Fill {
                path: self.me.clone(),
                key: key.0,
                base,
                len: total,
                chunk,
                from: registered,
                access,
                resident,
                stop: stop.clone(),
            };
            let spawned = std::thread::Builder::new()
                .name("rdma-register".into())
                .spawn(move || job.run());
            match spawned {
                // The handle that could deregister the region does not exist yet: the region
                // is still there.
                Ok(thread) => {
                    if let Some(r) = self.local.write().get_mut(&key.0) {
                        r.filler = Some(Filler { stop, thread });
                    }
                }
                // No thread: the first chunk alone goes over RDMA, the rest over TCP.
                Err(e) => tracing::warn!(
                    error = %e,
                    "rdma: no thread to register the region's other chunks"
                ),
            }
        }
        self.publish_registration();
        Ok(())
    }

    unsafe fn register_device(
        &self,
        key: RegionKey,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<(), RdmaError> {
        // SAFETY: forwarded from the caller.
        let keys = unsafe { Registrar::register_device(self.engine.verbs(), mem, access) }?;
        let len = mem.len() as u64;
        self.local.write().insert(
            key.0,
            LocalRegion {
                base: mem.base(),
                len,
                access,
                chunk: len.max(1),
                chunks: 1,
                keys: vec![keys],
                filler: None,
            },
        );
        self.publish_registration();
        Ok(())
    }

    fn deregister(&self, key: RegionKey) {
        // Stop the background registration first (outside the lock it takes per chunk): no
        // chunk is registered after this returns.
        let filler = self
            .local
            .write()
            .get_mut(&key.0)
            .and_then(|r| r.filler.take());
        if let Some(f) = filler {
            f.stop();
        }
        let removed = self.local.write().remove(&key.0);
        if let Some(r) = removed {
            for k in &r.keys {
                Registrar::deregister(self.engine.verbs(), k);
            }
            self.publish_registration();
            // The caller may free the region's memory now: no lazy registration outlives it.
            self.forget_local(r.base, r.len);
        }
    }

    fn forget_local(&self, addr: u64, len: u64) {
        let Some((a, b)) = page_range(addr, len) else {
            return;
        };
        let (out, held) = {
            let mut cache = self.mrs.lock();
            let out = cache.invalidate(a, b);
            (out, cache.len())
        };
        self.release_mrs(out, held);
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
        let now = Instant::now();
        self.peers
            .lock()
            .iter()
            .filter_map(|(peer, p)| match p {
                Peer::Unavailable { until, why } if *until > now => Some(PeerOnTcp {
                    peer: *peer,
                    why: why.clone(),
                    retry_in: *until - now,
                }),
                _ => None,
            })
            .collect()
    }
}

//! The parts of a node that own their state, each used by one side of the node: the read
//! path's caches and memory ([`ReadState`]), the listeners ([`Servers`]) and the background
//! work ([`Tasks`]). The node's `Core` holds one of each beside the node's identity,
//! settings and the lower crates' handles.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;

use parking_lot::{Condvar, Mutex, RwLock};
use peercache_discovery::DiscoveryServer;
use peercache_transport::RegionHandle;
use peercache_wire::rpc::RpcServer;

use crate::read::prime::PrimeMap;
use crate::read::scratch::ScratchPool;
use crate::serve::http::HttpServer;
use crate::tasks::evict::EvictionBatcher;
use crate::tasks::promoter::Promoter;

/// What the read path keeps between calls.
pub(crate) struct ReadState {
    /// Owners handed from an `exists` to the `get` that follows (`exists_prime_ttl`).
    pub(crate) primed: Mutex<PrimeMap>,
    /// Looked-up locations reused for `directory_read_cache_ttl`.
    pub(crate) read_cache: Mutex<PrimeMap>,
    /// Registered scratch memory, checked out per batch.
    pub(crate) scratch: ScratchPool,
    /// The caller's registered host buffers (SGLang's host pool): zero-copy destinations.
    pub(crate) host_buffers: RwLock<Vec<RegionHandle>>,
    /// Remote reads in flight from this node, per owner endpoint (least-loaded owner choice).
    pub(crate) inflight: Mutex<HashMap<SocketAddr, usize>>,
    /// Registered device (GPU) memory: destinations of device reads only.
    pub(crate) device_buffers: RwLock<Vec<RegionHandle>>,
    /// Whether any device region was ever registered (the host paths check segments then).
    pub(crate) has_device: std::sync::atomic::AtomicBool,
    /// This node's "directory lookup failed" warning: one line per 10 s.
    pub(crate) lookup_failed: peercache_wire::limits::Throttle,
}

impl ReadState {
    /// Empty caches, no scratch yet, no host buffer registered.
    pub(crate) fn new() -> Self {
        ReadState {
            primed: Mutex::new(PrimeMap::default()),
            read_cache: Mutex::new(PrimeMap::default()),
            scratch: ScratchPool::new(),
            host_buffers: RwLock::new(Vec::new()),
            inflight: Mutex::new(HashMap::new()),
            device_buffers: RwLock::new(Vec::new()),
            has_device: std::sync::atomic::AtomicBool::new(false),
            lookup_failed: peercache_wire::limits::Throttle::new(),
        }
    }

    /// Whether device memory was ever registered (one relaxed load on the host paths).
    pub(crate) fn any_device(&self) -> bool {
        self.has_device.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The node's listeners besides the data server (which the transport owns); taken and shut
/// down in order when the node stops.
pub(crate) struct Servers {
    /// Directory shard and store RPCs.
    pub(crate) control: Mutex<Option<RpcServer>>,
    /// The client API (`client_enabled`).
    pub(crate) client: Mutex<Option<RpcServer>>,
    /// The embedded discovery server, when this rank hosts it.
    pub(crate) meta: Mutex<Option<DiscoveryServer>>,
    /// `/metrics`, `/healthz`, `/cluster` and the dashboard.
    pub(crate) http: Mutex<Option<HttpServer>>,
    /// The KV-event ports (`kv_events_port`).
    pub(crate) kv_events: Mutex<Option<crate::events::KvEvents>>,
    /// The client API's "overwrite refused" warning: one line per 10 s for this node.
    pub(crate) client_refusals: peercache_wire::limits::Throttle,
}

/// Background work and the state it keeps.
pub(crate) struct Tasks {
    /// Eviction notices, batched off the write path.
    pub(crate) evictions: Mutex<Option<EvictionBatcher>>,
    /// Background promotion of disk-only pages that `batch_exists` found.
    pub(crate) promoter: OnceLock<Promoter>,
    /// One promotion at a time: a background promotion must not evict the pages a read just
    /// promoted for itself.
    pub(crate) promote_lock: Mutex<()>,
    /// Recovered disk pages still to re-publish once the ring includes this node.
    pub(crate) republish_pending: AtomicBool,
    /// The thread re-publishing them (joined at shutdown).
    pub(crate) republisher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The membership thread.
    pub(crate) membership: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Data endpoints of the members at the last membership sync (departed ones are forgotten
    /// by the transport: pooled connections, host-local attachment).
    pub(crate) member_data: Mutex<HashSet<SocketAddr>>,
    /// Set (and signalled) once the ring includes this node.
    pub(crate) ring_ready: (Mutex<bool>, Condvar),
}

impl Tasks {
    /// The batcher started; the promoter and the membership thread come later.
    pub(crate) fn new(evictions: EvictionBatcher, republish_pending: bool) -> Self {
        Tasks {
            evictions: Mutex::new(Some(evictions)),
            promoter: OnceLock::new(),
            promote_lock: Mutex::new(()),
            republish_pending: AtomicBool::new(republish_pending),
            republisher: Mutex::new(None),
            membership: Mutex::new(None),
            member_data: Mutex::new(HashSet::new()),
            ring_ready: (Mutex::new(false), Condvar::new()),
        }
    }
}

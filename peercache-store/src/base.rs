//! [`Core`]: everything a running node owns, shared (`Arc<Core>`) by the node runtime
//! (`node.rs`), the public API (`store.rs`), the read, write and exists paths, the modes, the
//! client API and the observability code — none of which this module knows: its fields' types
//! come from the lower crates and the leaf modules of this crate only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::{Condvar, Mutex};
use peercache_directory::{DirectoryClient, DirectoryService};
use peercache_discovery::{DiscoveryClient, DiscoveryServer};
use peercache_pool::Pool;
use peercache_transport::{RegionHandle, Transport};
use peercache_wire::rpc::RpcServer;
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::StoreError;
use crate::config::PeerCacheConfig;
use crate::evict::EvictionBatcher;
use crate::keys::Keyspace;
use crate::metrics::Handles;
use crate::prime::PrimeMap;
use crate::scratch::Scratch;

/// Where request handlers that start before the node exists find it once it does.
pub(crate) type NodeCell = Arc<OnceLock<Weak<Core>>>;

/// Everything a running node owns. Field order is drop order: the pool's registration goes
/// before the pool, the transport before the memory it serves.
pub(crate) struct Core {
    pub(crate) cfg: PeerCacheConfig,
    pub(crate) me: NodeId,
    pub(crate) incarnation: Incarnation,
    /// Connections prove the cluster secret (false: an open node, loopback or `insecure`).
    pub(crate) auth_enabled: bool,
    pub(crate) keys: Keyspace,
    pub(crate) metrics: Handles,
    pub(crate) evictions: Mutex<Option<EvictionBatcher>>,
    pub(crate) discovery: DiscoveryClient,
    pub(crate) dir: Arc<DirectoryClient>,
    pub(crate) dir_service: Arc<DirectoryService>,
    pub(crate) control: Mutex<Option<RpcServer>>,
    /// The client API listener (`client_enabled`).
    pub(crate) client: Mutex<Option<RpcServer>>,
    pub(crate) client_endpoint: Option<SocketAddr>,
    pub(crate) meta: Mutex<Option<DiscoveryServer>>,
    pub(crate) primed: Mutex<PrimeMap>,
    pub(crate) read_cache: Mutex<PrimeMap>,
    pub(crate) scratch: Mutex<Vec<Scratch>>,
    pub(crate) host_buffers: parking_lot::RwLock<Vec<RegionHandle>>,
    pub(crate) pool_region: Mutex<Option<RegionHandle>>,
    pub(crate) transport: Arc<Transport>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) disk: Option<Arc<peercache_pool::disk::DiskTier>>,
    /// Recovered disk pages still to re-publish once the ring includes this node.
    pub(crate) republish_pending: AtomicBool,
    /// Data endpoints of the members at the last membership sync (departed ones are forgotten
    /// by the transport: pooled connections, host-local attachment).
    pub(crate) member_data: Mutex<std::collections::HashSet<SocketAddr>>,
    pub(crate) data_endpoint: SocketAddr,
    pub(crate) control_endpoint: SocketAddr,
    pub(crate) pool_key: u64,
    pub(crate) ring_ready: (Mutex<bool>, Condvar),
    pub(crate) stopping: AtomicBool,
    pub(crate) membership: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(crate) http: Mutex<Option<crate::http::HttpServer>>,
    pub(crate) metrics_endpoint: Option<SocketAddr>,
    /// Background promotion of disk-only pages that `batch_exists` found.
    pub(crate) promoter: std::sync::OnceLock<crate::promote::Promoter>,
    /// One promotion at a time: a background promotion must not evict the pages a read just
    /// promoted for itself.
    pub(crate) promote_lock: Mutex<()>,
    /// Remote reads in flight from this node, per owner endpoint (least-loaded owner choice).
    pub(crate) inflight: Mutex<std::collections::HashMap<SocketAddr, usize>>,
    /// The deployment mode and the state only it has (matched once per operation).
    pub(crate) mode: crate::mode_state::ModeState,
}

impl Core {
    /// The page keys of `keys` in this node's keyspace (`prefix`).
    pub(crate) fn page_keys<K: AsRef<str>>(&self, keys: &[K]) -> Vec<PageKey> {
        keys.iter()
            .map(|k| self.keys.page_key(k.as_ref()))
            .collect()
    }

    /// Refuses calls once the node is stopping.
    pub(crate) fn check_open(&self) -> Result<(), StoreError> {
        if self.stopping.load(Ordering::Acquire) {
            Err(StoreError::Shutdown)
        } else {
            Ok(())
        }
    }
}

/// Checks that `counts` (segments per page) fit `n` pages and `segs` segments.
pub(crate) fn check_counts(n: usize, segs: usize, counts: &[usize]) -> Result<(), StoreError> {
    if counts.len() != n {
        return Err(StoreError::BadRequest(format!(
            "{} segment counts for {n} keys",
            counts.len()
        )));
    }
    let total: usize = counts.iter().sum();
    if total != segs {
        return Err(StoreError::BadRequest(format!(
            "segment counts add up to {total}, {segs} segments given"
        )));
    }
    Ok(())
}

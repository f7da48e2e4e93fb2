//! [`Core`]: everything a running node owns, shared (`Arc<Core>`) by the node runtime
//! (`lifecycle.rs`), the public API (`store.rs`), the read, write and exists paths, the modes, the
//! client API and the observability code — none of which this module knows: its fields' types
//! come from the lower crates and the leaf modules of this crate only.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use peercache_directory::{DirectoryClient, DirectoryService};
use peercache_discovery::Membership;
use peercache_pool::Pool;
use peercache_transport::{RegionHandle, Transport};
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::StoreError;
use crate::config::PeerCacheConfig;
use crate::modes::state::SlotMode;
use crate::node::keys::Keyspace;
use crate::node::parts::{ReadState, Servers, Tasks};
use crate::node::stamp::Stamp;
use crate::observe::series::Handles;

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
    /// Background work: eviction notices, promotions, membership.
    pub(crate) tasks: Tasks,
    pub(crate) discovery: Membership,
    pub(crate) dir: Arc<DirectoryClient>,
    pub(crate) dir_service: Arc<DirectoryService>,
    /// The listeners besides the data server.
    pub(crate) servers: Servers,
    pub(crate) client_endpoint: Option<SocketAddr>,
    /// The read path's caches and memory (its registrations go before the transport).
    pub(crate) reads: ReadState,
    pub(crate) pool_region: Mutex<Option<RegionHandle>>,
    pub(crate) transport: Arc<Transport>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) disk: Option<Arc<peercache_pool::disk::DiskTier>>,
    pub(crate) data_endpoint: SocketAddr,
    pub(crate) control_endpoint: SocketAddr,
    pub(crate) pool_key: u64,
    pub(crate) stopping: AtomicBool,
    pub(crate) metrics_endpoint: Option<SocketAddr>,
    /// The deployment mode and the state only it has (matched once per operation).
    pub(crate) mode: crate::modes::state::ModeState,
    /// The layout fingerprint pages are written with and readers expect (0: none declared).
    pub(crate) layout: std::sync::atomic::AtomicU64,
}

impl Core {
    /// The layout this node writes and expects, loaded once per batch.
    pub(crate) fn layout(&self) -> peercache_wire::Layout {
        peercache_wire::Layout(self.layout.load(std::sync::atomic::Ordering::Acquire))
    }

    /// The page keys of `keys` in this node's keyspace (`prefix`).
    pub(crate) fn page_keys<K: AsRef<str>>(&self, keys: &[K]) -> Vec<PageKey> {
        keys.iter()
            .map(|k| self.keys.page_key(k.as_ref()))
            .collect()
    }

    /// What names this node's copies in the directory.
    pub(crate) fn stamp(&self) -> Stamp<'_> {
        Stamp {
            me: &self.me,
            incarnation: self.incarnation,
            data_endpoint: self.data_endpoint,
            pool_key: self.pool_key,
            pool_base: self.pool.base() as u64,
        }
    }

    /// The directory location of a page resident in this node's pool.
    pub(crate) fn resident_location(
        &self,
        loc: &peercache_pool::PageLocation,
    ) -> peercache_directory::Location {
        self.stamp().resident(loc)
    }

    /// Where this node's pool holds `keys` now (None: not resident here), as directory
    /// locations: what a hinted reader asks of the node its hint names.
    pub(crate) fn resident_locations(
        &self,
        keys: &[PageKey],
    ) -> Vec<Option<peercache_directory::Location>> {
        let mut found = Vec::with_capacity(keys.len());
        self.pool.lookup_batch(keys, &mut found);
        let stamp = self.stamp();
        found
            .iter()
            .map(|l| l.as_ref().map(|l| stamp.resident(l)))
            .collect()
    }

    /// The disk-tier promotions, with what they need of the node.
    pub(crate) fn promotion(&self) -> crate::tasks::promotion::Promotion<'_> {
        crate::tasks::promotion::Promotion {
            pool: &self.pool,
            disk: self.disk.as_deref(),
            dir: &self.dir,
            tasks: &self.tasks,
            metrics: &self.metrics,
            stamp: self.stamp(),
            op_timeout: self.cfg.op_timeout(),
        }
    }

    /// The re-publishing of recovered disk pages, with what it needs of the node.
    pub(crate) fn republish(&self) -> crate::tasks::republish::Republish<'_> {
        crate::tasks::republish::Republish {
            disk: self.disk.as_deref(),
            dir: &self.dir,
            tasks: &self.tasks,
            metrics: &self.metrics,
            stamp: self.stamp(),
            stopping: &self.stopping,
        }
    }

    /// Slot mode's reads and writes, with what they need of the node.
    pub(crate) fn slot_io<'a>(&'a self, slots: &'a SlotMode) -> crate::modes::slot::SlotIo<'a> {
        crate::modes::slot::SlotIo {
            slots,
            me: &self.me,
            dir: &self.dir,
            transport: &self.transport,
            scratch: &self.reads.scratch,
            metrics: &self.metrics,
            layout: self.layout(),
            op_timeout: self.cfg.op_timeout(),
        }
    }

    /// The storage server's side of centralized writes, with what it needs of the node.
    pub(crate) fn storage_owner(&self) -> crate::modes::central::owner::StorageOwner<'_> {
        crate::modes::central::owner::StorageOwner {
            table: self.mode.storage().and_then(|s| s.reservations.as_deref()),
            pool: &self.pool,
            disk: self.disk.as_deref(),
            dir: &self.dir,
            tasks: &self.tasks,
            metrics: &self.metrics,
            stamp: self.stamp(),
            reservation_timeout: self.cfg.reservation_timeout,
        }
    }

    /// The writer's side of centralized writes to `st`'s storage servers.
    pub(crate) fn storage_writer<'a>(
        &'a self,
        st: &'a crate::modes::state::StorageMode,
    ) -> crate::modes::central::writer::StorageWriter<'a> {
        crate::modes::central::writer::StorageWriter {
            st,
            me: &self.me,
            discovery: &self.discovery,
            dir: &self.dir,
            transport: &self.transport,
            reads: &self.reads,
            metrics: &self.metrics,
            layout: self.layout(),
            mode: self.cfg.mode,
            op_timeout: self.cfg.op_timeout(),
            lazy_registration: self.cfg.lazy_registration,
        }
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

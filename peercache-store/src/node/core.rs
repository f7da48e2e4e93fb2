//! [`Core`]: everything a running node owns, shared (`Arc<Core>`) by the public API
//! (`store.rs`), the listeners and the background threads. Its one `impl` reads the node's
//! settings and builds, for one call, the view each part works through — the read wing, the
//! write wing, the membership sync, promotions, re-publishing, the slot and storage modes —
//! naming just what that part needs; and it waits for readiness and shuts the node down in
//! order. The parts' code lives beside their types, not here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peercache_directory::{DirectoryClient, DirectoryService};
use peercache_discovery::Membership;
use peercache_pool::Pool;
use peercache_transport::{RegionHandle, Transport};
use peercache_wire::PageKey;

use crate::StoreError;
use crate::config::PeerCacheConfig;
use crate::modes::state::SlotMode;
use crate::node::identity::Identity;
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
    /// Who this node is and where it is reached.
    pub(crate) id: Identity,
    pub(crate) keys: Keyspace,
    pub(crate) metrics: Handles,
    /// Background work: eviction notices, promotions, membership.
    pub(crate) tasks: Tasks,
    pub(crate) discovery: Membership,
    pub(crate) dir: Arc<DirectoryClient>,
    pub(crate) dir_service: Arc<DirectoryService>,
    /// The listeners besides the data server.
    pub(crate) servers: Servers,
    /// The read path's caches and memory (its registrations go before the transport).
    pub(crate) reads: ReadState,
    pub(crate) pool_region: Mutex<Option<RegionHandle>>,
    pub(crate) transport: Arc<Transport>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) disk: Option<Arc<peercache_pool::disk::DiskTier>>,
    pub(crate) stopping: AtomicBool,
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
            id: &self.id,
            pool_base: self.pool.base() as u64,
        }
    }

    /// Where this node's pool holds `keys` now (None: not resident here), as directory
    /// locations: what a hinted reader asks of the node its hint names.
    pub(crate) fn resident_locations(
        &self,
        keys: &[PageKey],
    ) -> Vec<Option<peercache_directory::Location>> {
        self.stamp().resident_in(&self.pool, keys)
    }

    /// Where this node's pages live and how they are named.
    pub(crate) fn home(&self) -> crate::node::home::PageHome<'_> {
        crate::node::home::PageHome {
            pool: &self.pool,
            disk: self.disk.as_deref(),
            dir: &self.dir,
            tasks: &self.tasks,
            metrics: &self.metrics,
            stamp: self.stamp(),
        }
    }

    /// The read wing (get, exists, hints, prefix locations, device reads), with what it
    /// needs of the node.
    pub(crate) fn read_wing(&self) -> crate::read::wing::ReadWing<'_> {
        crate::read::wing::ReadWing {
            home: self.home(),
            me: &self.id.me,
            cfg: &self.cfg,
            reads: &self.reads,
            transport: &self.transport,
            stopping: &self.stopping,
            slots: self.mode.slots().map(|s| self.slot_io(s)),
            layout: self.layout(),
        }
    }

    /// The write wing, with what it needs of the node and the route this node's mode (a
    /// storage server is one) and write policy give a write.
    pub(crate) fn write_wing(&self) -> crate::node::write::WriteWing<'_> {
        use crate::config::WritePolicy;
        use crate::modes::state::ModeState;
        use crate::node::write::WriteRoute;
        let storage = |st, also_local, fallback_local| WriteRoute::Storage {
            writer: self.storage_writer(st),
            also_local,
            fallback_local,
        };
        let route = match &self.mode {
            ModeState::Slotmap(slots) => WriteRoute::Slots(self.slot_io(slots)),
            // A storage server keeps what it is asked to write.
            ModeState::P2p | ModeState::StorageServer(_) => WriteRoute::Local,
            // No storage server registered: centralized has no pool to fall back to.
            ModeState::Centralized(st) => storage(st, false, false),
            ModeState::Hybrid(st) => match st.policy {
                WritePolicy::Local => WriteRoute::Local,
                WritePolicy::Storage => storage(st, false, true),
                WritePolicy::Both => storage(st, true, true),
            },
        };
        crate::node::write::WriteWing {
            home: self.home(),
            stopping: &self.stopping,
            layout: self.layout(),
            route,
        }
    }

    /// The membership sync, with what it needs of the node.
    pub(crate) fn membership_sync(&self) -> crate::tasks::membership::MembershipSync<'_> {
        crate::tasks::membership::MembershipSync {
            home: self.home(),
            me: &self.id.me,
            vnodes: self.cfg.vnodes,
            directory_replicas: self.cfg.directory_replicas,
            discovery: &self.discovery,
            mode: &self.mode,
            transport: &self.transport,
            reservation_timeout: self.cfg.reservation_timeout,
        }
    }

    /// The disk-tier promotions, with what they need of the node.
    pub(crate) fn promotion(&self) -> crate::tasks::promotion::Promotion<'_> {
        crate::tasks::promotion::Promotion {
            home: self.home(),
            op_timeout: self.cfg.op_timeout(),
        }
    }

    /// The re-publishing of recovered disk pages, with what it needs of the node.
    pub(crate) fn republish(&self) -> crate::tasks::republish::Republish<'_> {
        crate::tasks::republish::Republish {
            home: self.home(),
            stopping: &self.stopping,
        }
    }

    /// How this node reaches its peers.
    pub(crate) fn reach(&self) -> crate::node::reach::Reach<'_> {
        crate::node::reach::Reach {
            me: &self.id.me,
            dir: &self.dir,
            transport: &self.transport,
            metrics: &self.metrics,
            layout: self.layout(),
            op_timeout: self.cfg.op_timeout(),
        }
    }

    /// Slot mode's reads and writes, with what they need of the node.
    pub(crate) fn slot_io<'a>(&'a self, slots: &'a SlotMode) -> crate::modes::slot::SlotIo<'a> {
        crate::modes::slot::SlotIo {
            reach: self.reach(),
            slots,
            scratch: &self.reads.scratch,
        }
    }

    /// The storage server's side of centralized writes, with what it needs of the node.
    pub(crate) fn storage_owner(&self) -> crate::modes::central::owner::StorageOwner<'_> {
        crate::modes::central::owner::StorageOwner::of(
            self.home(),
            &self.mode,
            self.cfg.reservation_timeout,
        )
    }

    /// The writer's side of centralized writes to `st`'s storage servers.
    pub(crate) fn storage_writer<'a>(
        &'a self,
        st: &'a crate::modes::state::StorageMode,
    ) -> crate::modes::central::writer::StorageWriter<'a> {
        crate::modes::central::writer::StorageWriter {
            reach: self.reach(),
            st,
            discovery: &self.discovery,
            reads: &self.reads,
            mode: self.cfg.mode,
            lazy_registration: self.cfg.lazy_registration,
        }
    }

    /// Waits until discovery registered this node and the directory ring includes it.
    pub(crate) fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), StoreError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        self.discovery.wait_ready(timeout)?;
        let mut ready = self.tasks.ring_ready.0.lock();
        while !*ready {
            match deadline {
                Some(d) => {
                    if self
                        .tasks
                        .ring_ready
                        .1
                        .wait_until(&mut ready, d)
                        .timed_out()
                        && !*ready
                    {
                        return Err(StoreError::Discovery(
                            peercache_discovery::DiscoveryError::NotReady {
                                after: timeout.unwrap_or_default(),
                                seeds: Vec::new(),
                            },
                        ));
                    }
                }
                None => self.tasks.ring_ready.1.wait(&mut ready),
            }
        }
        Ok(())
    }

    /// Stops everything; idempotent.
    pub(crate) fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Stop the hosted discovery server first (members see it gone in the same round in
        // which they see this node leave, so the masters change once), then leave the cluster
        // so peers stop routing to us, then flush eviction notices.
        if let Some(mut m) = self.servers.meta.lock().take() {
            m.shutdown();
        }
        self.discovery.shutdown();
        if let Some(p) = self.tasks.promoter.get() {
            p.stop();
        }
        if let Some(mut e) = self.tasks.evictions.lock().take() {
            e.stop();
        }
        self.republish().stop();
        if let Some(d) = &self.disk {
            d.flush();
        }
        if let Some(t) = self.tasks.membership.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
        if let Some(mut c) = self.servers.client.lock().take() {
            c.shutdown();
        }
        if let Some(mut c) = self.servers.control.lock().take() {
            c.shutdown();
        }
        if let Some(mut h) = self.servers.http.lock().take() {
            h.shutdown();
        }
        if let Some(mut e) = self.servers.kv_events.lock().take() {
            e.shutdown();
        }
        self.transport.shutdown();
        self.reads.host_buffers.write().clear();
        self.reads.device_buffers.write().clear();
        self.reads.scratch.clear();
        self.pool_region.lock().take();
        if let Some(slots) = self.mode.slots() {
            slots.region.lock().take();
        }
        tracing::info!(node = %self.id.me, "peercache node stopped");
    }

    /// Refuses calls once the node is stopping.
    pub(crate) fn check_open(&self) -> Result<(), StoreError> {
        StoreError::refuse_if_stopping(&self.stopping)
    }
}

//! Registered memory regions and their access levels.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::TransportError;

/// What peers may do with a region. Checked on every op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only this process uses it (a read destination or a write source). Peers get
    /// [`OpError::AccessDenied`](crate::OpError::AccessDenied).
    LocalOnly,
    /// Peers may read it (the published pool).
    RemoteRead,
    /// Peers may read and write it (reserved slots on storage servers only).
    RemoteReadWrite,
}

impl Access {
    pub(crate) fn allows_remote_read(self) -> bool {
        matches!(self, Access::RemoteRead | Access::RemoteReadWrite)
    }
    pub(crate) fn allows_remote_write(self) -> bool {
        matches!(self, Access::RemoteReadWrite)
    }
}

/// The key peers name a region by (like an RDMA rkey). Unpredictable per process, so a key
/// from a previous life of a node is unknown to the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey(pub u64);

impl RegionKey {
    /// Names a *local* segment in memory the caller did not register (valid for the call, by
    /// the caller's contract). The TCP plane reads into and writes from it directly; the RDMA
    /// path registers it lazily for the batch. Never a key of a registered region, so a remote
    /// range naming it is an unknown region.
    pub const UNREGISTERED: RegionKey = RegionKey(u64::MAX);
}

/// Decides, per inbound write, whether a peer may write a range of a [`Access::RemoteReadWrite`]
/// region registered with it — e.g. only slots the writing node reserved.
pub trait WriteGuard: Send + Sync + std::fmt::Debug {
    /// `peer` is the node id the writer announced in its (authenticated) handshake (None: an
    /// anonymous tool). `done_by` is the latest the payload can finish landing — the data
    /// server's deadline for reading it — so a permission that ends before it must be refused:
    /// the bytes would land after it.
    fn allow_write(
        &self,
        peer: Option<&peercache_wire::NodeId>,
        addr: u64,
        len: u64,
        done_by: std::time::Instant,
    ) -> bool;
}

/// Says when a region's memory is resident (faulted in by its owner). A pool that warms in the
/// background hands one to [`Transport::register_with`](crate::Transport::register_with): the
/// RDMA path then registers a chunk with the NIC only once the pool's own threads faulted it in,
/// so pinning never first-touches memory from the registering thread (which would place it on
/// that thread's NUMA node and fault it twice over).
pub trait Residency: Send + Sync {
    /// Waits at most `timeout` until every byte of `[offset, offset + len)` of the region is
    /// resident; true when it is.
    fn wait_resident(&self, offset: u64, len: u64, timeout: std::time::Duration) -> bool;
}

/// How a region is registered: its access, a write guard, and when its memory is resident.
///
/// ```
/// use peercache_transport::{Access, RegionOptions};
///
/// let o = RegionOptions::new(Access::RemoteRead);
/// assert_eq!(o.access(), Access::RemoteRead);
/// ```
#[derive(Clone)]
pub struct RegionOptions {
    pub(crate) access: Access,
    pub(crate) guard: Option<Arc<dyn WriteGuard>>,
    pub(crate) resident: Option<Arc<dyn Residency>>,
}

impl RegionOptions {
    /// A region with `access`, resident now, with no write guard.
    pub fn new(access: Access) -> Self {
        RegionOptions {
            access,
            guard: None,
            resident: None,
        }
    }

    /// A [`Access::RemoteReadWrite`] region whose every inbound write `guard` checks (e.g.
    /// only ranges the writing node reserved).
    pub fn guarded(guard: Arc<dyn WriteGuard>) -> Self {
        RegionOptions {
            access: Access::RemoteReadWrite,
            guard: Some(guard),
            resident: None,
        }
    }

    /// Memory that becomes resident over time: the RDMA path registers each chunk of it once
    /// `resident` says it is in (local-only regions are registered whole at once regardless).
    pub fn resident_when(mut self, resident: Arc<dyn Residency>) -> Self {
        self.resident = Some(resident);
        self
    }

    /// The access peers get.
    pub fn access(&self) -> Access {
        self.access
    }
}

impl std::fmt::Debug for RegionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionOptions")
            .field("access", &self.access)
            .field("guarded", &self.guard.is_some())
            .field("resident_when", &self.resident.is_some())
            .finish()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Region {
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    pub(crate) guard: Option<Arc<dyn WriteGuard>>,
    /// Device memory: the TCP plane must never touch it.
    pub(crate) device: bool,
    /// The memory file behind it, when it is shared with peers on this host.
    pub(crate) shared: Option<SharedFile>,
}

/// A shared region's memory file, as registered.
#[derive(Clone, Debug)]
pub(crate) struct SharedFile {
    pub(crate) fd: Arc<std::os::fd::OwnedFd>,
    /// Offset in the file of the region's first byte (page-aligned).
    pub(crate) offset: u64,
}

/// Called after every change to the set of shared regions (see [`RegionTable::watch`]).
type Watcher = Box<dyn Fn() + Send + Sync>;

/// The table of registered regions, shared by the client and the server of one transport.
///
/// Ops look regions up under a read guard held for the whole batch; deregistration takes the
/// write lock, so memory is never released while a batch still reads or writes it.
pub(crate) struct RegionTable {
    regions: RwLock<HashMap<RegionKey, Region>>,
    next: AtomicU64,
    salt: u64,
    /// Changes to the set of shared regions so far (a region shared, or a shared one removed).
    shared_changes: AtomicU64,
    /// Told after each such change, synchronously: the same-host path closes its leases there,
    /// so a region is never read through an old mapping once its handle is dropped.
    watchers: RwLock<Vec<Watcher>>,
}

impl std::fmt::Debug for RegionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionTable")
            .field("regions", &self.regions.read().len())
            .field("shared_changes", &self.shared_changes())
            .finish()
    }
}

impl RegionTable {
    pub(crate) fn new() -> Self {
        let salt = peercache_wire::Incarnation::fresh()
            .0
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        RegionTable {
            regions: RwLock::new(HashMap::new()),
            next: AtomicU64::new(1),
            salt,
            shared_changes: AtomicU64::new(0),
            watchers: RwLock::new(Vec::new()),
        }
    }

    /// How many times the set of shared regions has changed.
    pub(crate) fn shared_changes(&self) -> u64 {
        self.shared_changes.load(Ordering::Acquire)
    }

    /// Calls `f` after every change to the set of shared regions, on the changing thread.
    pub(crate) fn watch(&self, f: impl Fn() + Send + Sync + 'static) {
        self.watchers.write().push(Box::new(f));
    }

    fn shared_changed(&self) {
        self.shared_changes.fetch_add(1, Ordering::AcqRel);
        for w in self.watchers.read().iter() {
            w();
        }
    }

    /// Marks a region as shared through `file`; attached peers re-attach to see it.
    pub(crate) fn share(&self, key: RegionKey, file: SharedFile) -> Result<(), TransportError> {
        let mut map = self.regions.write();
        let r = map
            .get_mut(&key)
            .ok_or(TransportError::Register("region is not registered"))?;
        if r.device {
            return Err(TransportError::Register("device memory cannot be shared"));
        }
        r.shared = Some(file);
        drop(map);
        self.shared_changed();
        Ok(())
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, HashMap<RegionKey, Region>> {
        self.regions.read_recursive()
    }

    pub(crate) fn insert(
        &self,
        base: u64,
        len: u64,
        access: Access,
        guard: Option<Arc<dyn WriteGuard>>,
        device: bool,
    ) -> Result<RegionKey, TransportError> {
        if base == 0 {
            return Err(TransportError::Register("null pointer"));
        }
        if len == 0 {
            return Err(TransportError::Register("zero length"));
        }
        if base.checked_add(len).is_none() {
            return Err(TransportError::Register("range wraps the address space"));
        }
        let mut map = self.regions.write();
        if map
            .values()
            .any(|r| base < r.base + r.len && r.base < base + len)
        {
            return Err(TransportError::Register("overlaps a registered region"));
        }
        let key = loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let k = RegionKey(n.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ self.salt);
            if k != RegionKey::UNREGISTERED && !map.contains_key(&k) {
                break k;
            }
        };
        map.insert(
            key,
            Region {
                base,
                len,
                access,
                guard,
                device,
                shared: None,
            },
        );
        Ok(key)
    }

    pub(crate) fn remove(&self, key: RegionKey) {
        let gone = self.regions.write().remove(&key);
        if gone.is_some_and(|r| r.shared.is_some()) {
            self.shared_changed();
        }
    }
}

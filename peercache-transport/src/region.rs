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

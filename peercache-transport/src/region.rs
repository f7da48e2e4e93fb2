//! Registered memory regions and their access levels.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

use crate::{OpError, TransportError};

/// What peers may do with a region. Checked on every op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only this process uses it (a read destination or a write source). Peers get
    /// [`OpError::AccessDenied`].
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
    /// `peer` is the node id the writer proved in the handshake (None: anonymous tool).
    fn allow_write(&self, peer: Option<&peercache_wire::NodeId>, addr: u64, len: u64) -> bool;
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
    pub(crate) shared: Option<crate::local::SharedFile>,
}

impl Region {
    /// Checks that `[addr, addr+len)` lies inside the region.
    pub(crate) fn check_range(&self, key: RegionKey, addr: u64, len: u64) -> Result<(), OpError> {
        let end = addr.checked_add(len);
        match end {
            Some(end) if addr >= self.base && end <= self.base + self.len => Ok(()),
            _ => Err(OpError::OutOfRegion {
                region: key,
                addr,
                len,
                region_len: self.len,
            }),
        }
    }
}

/// The table of registered regions, shared by the client and the server of one transport.
///
/// Ops look regions up under a read guard held for the whole batch; deregistration takes the
/// write lock, so memory is never released while a batch still reads or writes it.
#[derive(Debug)]
pub(crate) struct RegionTable {
    regions: RwLock<HashMap<RegionKey, Region>>,
    next: AtomicU64,
    salt: u64,
    /// Lease connections of peers attached over the host-local path; closed whenever the set
    /// of shared regions changes, so they re-attach (or fall back) before their next read.
    attached: parking_lot::Mutex<Vec<std::os::unix::net::UnixStream>>,
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
            attached: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// Keeps a host-local lease open (dropping leases whose reader went away).
    pub(crate) fn attach(&self, lease: std::os::unix::net::UnixStream) {
        let mut v = self.attached.lock();
        v.retain(crate::local::lease_open);
        v.push(lease);
    }

    /// Closes every host-local lease.
    pub(crate) fn revoke_attached(&self) {
        for s in self.attached.lock().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Number of open host-local leases.
    pub(crate) fn attached_count(&self) -> usize {
        self.attached.lock().len()
    }

    /// Marks a region as shared through `file`; attached peers re-attach to see it.
    pub(crate) fn share(
        &self,
        key: RegionKey,
        file: crate::local::SharedFile,
    ) -> Result<(), TransportError> {
        let mut map = self.regions.write();
        let r = map
            .get_mut(&key)
            .ok_or(TransportError::Register("region is not registered"))?;
        if r.device {
            return Err(TransportError::Register("device memory cannot be shared"));
        }
        r.shared = Some(file);
        drop(map);
        self.revoke_attached();
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
            self.revoke_attached();
        }
    }
}

/// A registered region. Dropping it deregisters the region; the drop waits until no batch is
/// using it, so the memory may be released right after.
#[derive(Debug)]
pub struct RegionHandle {
    pub(crate) table: Arc<RegionTable>,
    pub(crate) key: RegionKey,
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    /// The RDMA path that also registered it (deregistered first on drop).
    pub(crate) rdma: Option<Arc<dyn crate::rdma::path::RdmaPlane>>,
}

impl RegionHandle {
    /// The key peers use to name this region.
    pub fn key(&self) -> RegionKey {
        self.key
    }
    /// Start address.
    pub fn base(&self) -> u64 {
        self.base
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True if the region is empty (never: registration rejects zero length).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Access level.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Address of byte `offset` of the region.
    pub fn addr(&self, offset: u64) -> u64 {
        self.base + offset
    }
}

impl Drop for RegionHandle {
    fn drop(&mut self) {
        if let Some(r) = &self.rdma {
            r.deregister(self.key);
        }
        self.table.remove(self.key);
    }
}

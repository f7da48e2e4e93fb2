//! [`RegionHandle`]: a registered region as its owner holds it; dropping it deregisters the
//! region from the data paths that hold it (the RDMA path), then from the table.

use std::sync::Arc;

use crate::region::{Access, RegionKey, RegionTable};

/// A registered region. Dropping it deregisters the region; the drop waits until no batch is
/// using it, so the memory may be released right after.
#[derive(Debug)]
pub struct RegionHandle {
    pub(crate) table: Arc<RegionTable>,
    pub(crate) key: RegionKey,
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
    /// The data paths that also hold it (told first on drop).
    pub(crate) paths: Vec<Arc<dyn crate::path::DataPath>>,
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
    /// Whether `[addr, addr + len)` lies inside the region (without overflow): the one range
    /// check the transport applies to every segment.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        crate::validate::contains(self.base, self.len, addr, len)
    }
    /// Address of byte `offset` of the region.
    pub fn addr(&self, offset: u64) -> u64 {
        self.base + offset
    }
}

impl Drop for RegionHandle {
    fn drop(&mut self) {
        for p in &self.paths {
            p.deregister(self.key);
        }
        self.table.remove(self.key);
    }
}

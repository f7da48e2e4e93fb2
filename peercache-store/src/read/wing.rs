//! [`ReadWing`]: what the read paths need of the node — `get` (host and device), `exists` and
//! `contains`, router hints and prefix locations — borrowed from it for one call. The paths
//! themselves are `impl ReadWing` blocks in this folder, one file each.

use std::sync::atomic::AtomicBool;

use peercache_directory::Location;
use peercache_transport::Transport;
use peercache_wire::{Layout, NodeId, PageKey};

use crate::StoreError;
use crate::config::PeerCacheConfig;
use crate::modes::slot::SlotIo;
use crate::node::home::PageHome;
use crate::node::parts::ReadState;
use crate::tasks::promotion::Promotion;

/// The read wing's view of the node: its identity and settings, the read path's own state,
/// and the handles of the lower crates it reads through.
pub(crate) struct ReadWing<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    pub(crate) me: &'a NodeId,
    pub(crate) cfg: &'a PeerCacheConfig,
    /// Primed owners, the read cache, scratch memory, registered buffers, reads in flight.
    pub(crate) reads: &'a ReadState,
    pub(crate) transport: &'a Transport,
    pub(crate) stopping: &'a AtomicBool,
    /// Slot mode's reads, when the node runs in slot mode (then it reads nothing else).
    pub(crate) slots: Option<SlotIo<'a>>,
    /// The layout this node reads and expects.
    pub(crate) layout: Layout,
}

impl<'a> ReadWing<'a> {
    /// Disk-tier promotions, here and on other owners, for this read.
    pub(crate) fn promotion(&self) -> Promotion<'a> {
        Promotion {
            home: self.home,
            op_timeout: self.cfg.op_timeout(),
        }
    }

    /// Refuses calls once the node is stopping.
    pub(crate) fn check_open(&self) -> Result<(), StoreError> {
        StoreError::refuse_if_stopping(self.stopping)
    }

    /// Where this node's pool holds `keys`, as directory locations.
    pub(crate) fn resident_locations(&self, keys: &[PageKey]) -> Vec<Option<Location>> {
        self.home.stamp.resident_in(self.home.pool, keys)
    }
}

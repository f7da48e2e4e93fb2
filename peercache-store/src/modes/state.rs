//! The deployment mode as a type: each mode owns the state only it has, so an impossible
//! combination (slot layouts in p2p, reservations on a slotmap node) cannot be represented,
//! and the read, write and exists paths match on it once per call.

use peercache_wire::NodeId;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::{Mutex, RwLock};
use peercache_pool::slotmap::SlotMap;
use peercache_transport::RegionHandle;

use crate::config::WritePolicy;
use crate::layout::slot::Layouts;
use crate::modes::storage_view::{Reservations, StorageView};

/// A node's mode and the state that comes with it.
pub(crate) enum ModeState {
    /// Every node publishes its own pages; reads go peer to peer.
    P2p,
    /// p2p plus storage servers, by the write policy.
    Hybrid(StorageMode),
    /// Inference nodes write into storage servers.
    Centralized(StorageMode),
    /// A storage server of the centralized or hybrid mode: it keeps the pages writers send
    /// into the slots they reserved, and the pages it is asked to write itself.
    StorageServer(StorageServer),
    /// Directory-free slot placement.
    Slotmap(SlotMode),
}

impl ModeState {
    /// A writer's view of the storage servers (centralized and hybrid inference nodes).
    pub(crate) fn storage(&self) -> Option<&StorageMode> {
        match self {
            ModeState::Hybrid(s) | ModeState::Centralized(s) => Some(s),
            ModeState::P2p | ModeState::StorageServer(_) | ModeState::Slotmap(_) => None,
        }
    }

    /// The reservations of a storage server.
    pub(crate) fn storage_server(&self) -> Option<&StorageServer> {
        match self {
            ModeState::StorageServer(s) => Some(s),
            _ => None,
        }
    }

    /// The slot state of slotmap mode.
    pub(crate) fn slots(&self) -> Option<&SlotMode> {
        match self {
            ModeState::Slotmap(s) => Some(s),
            _ => None,
        }
    }
}

/// A centralized or hybrid inference node: where the storage servers are and how writes
/// reach them.
pub(crate) struct StorageMode {
    /// Hybrid: where writes go (centralized always writes to storage).
    pub(crate) policy: WritePolicy,
    /// The storage servers, as the last membership sync saw them.
    pub(crate) view: RwLock<Arc<StorageView>>,
    /// The "no storage server" warning was logged (reset when one appears).
    pub(crate) no_storage_logged: AtomicBool,
}

impl StorageMode {
    /// A writer's state; the storage view fills at the first membership sync.
    pub(crate) fn new(policy: WritePolicy) -> Self {
        StorageMode {
            policy,
            view: RwLock::default(),
            no_storage_logged: AtomicBool::new(false),
        }
    }
}

/// A storage server: the slots reserved for remote writers.
pub(crate) struct StorageServer {
    /// The reservations, shared with the pool's write guard.
    pub(crate) reservations: Arc<Mutex<Reservations>>,
}

/// Slotmap mode: this node's slot region and the members' layouts. Field order is drop
/// order: the registration goes before the region.
pub(crate) struct SlotMode {
    /// This node's registration of its slot region.
    pub(crate) region: Mutex<Option<RegionHandle>>,
    /// This node's slot region.
    pub(crate) map: Arc<SlotMap>,
    /// The members' regions, refreshed on membership changes.
    pub(crate) layouts: RwLock<Layouts>,
    /// Members whose announced layout was refused, with the announcement (so each refusal is
    /// counted and logged once, not on every membership change).
    pub(crate) refused: Mutex<std::collections::HashMap<NodeId, String>>,
}

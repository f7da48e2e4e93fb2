//! The state of the centralized and hybrid modes: where the storage servers are
//! ([`StorageView`]) and, on a storage server, the slots reserved for remote writers
//! ([`Reservations`], enforced on the pool's registration by [`ReservationGuard`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use peercache_directory::Ring;
use peercache_pool::Reservation;
use peercache_transport::WriteGuard;
use peercache_wire::NodeId;

/// One reservation held for a writer.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) res: Reservation,
    pub(crate) writer: NodeId,
    pub(crate) expires: Instant,
}

/// Reservations of a storage node, by token and by payload address. Tokens are random (a
/// peer cannot guess another writer's) and bound to the writer that reserved them.
#[derive(Debug, Default)]
pub(crate) struct Reservations {
    pub(crate) by_token: HashMap<u64, Held>,
    pub(crate) by_addr: BTreeMap<u64, u64>,
}

/// What taking a reservation for a writer found.
#[derive(Debug)]
pub(crate) enum Taken {
    /// The writer's own reservation, now removed from the table.
    Mine(Held),
    /// Another writer's reservation: left in place.
    NotYours,
    /// No such reservation (never made, expired, already committed or aborted).
    Unknown,
}

impl Reservations {
    /// Holds `held` under a fresh random token.
    pub(crate) fn hold(&mut self, held: Held) -> Result<u64, peercache_wire::WireError> {
        let token = loop {
            let t = peercache_wire::auth::random_u64()?;
            if t != 0 && !self.by_token.contains_key(&t) {
                break t;
            }
        };
        self.by_addr.insert(held.res.payload_addr, token);
        self.by_token.insert(token, held);
        Ok(token)
    }

    /// Removes a reservation whatever its writer (expiry).
    pub(crate) fn take(&mut self, token: u64) -> Option<Held> {
        let h = self.by_token.remove(&token)?;
        self.by_addr.remove(&h.res.payload_addr);
        Some(h)
    }

    /// Removes `token` only if `writer` holds it.
    pub(crate) fn take_for(&mut self, token: u64, writer: &NodeId) -> Taken {
        match self.by_token.get(&token) {
            None => Taken::Unknown,
            Some(h) if h.writer != *writer => Taken::NotYours,
            Some(_) => self.take(token).map_or(Taken::Unknown, Taken::Mine),
        }
    }
}

/// The write guard of a storage node's pool: a remote write must fall inside one live
/// reservation of the node that writes.
#[derive(Debug)]
pub(crate) struct ReservationGuard(pub(crate) Arc<Mutex<Reservations>>);

impl WriteGuard for ReservationGuard {
    fn allow_write(&self, peer: Option<&NodeId>, addr: u64, len: u64, done_by: Instant) -> bool {
        let Some(peer) = peer else { return false };
        let t = self.0.lock();
        let Some((_, token)) = t.by_addr.range(..=addr).next_back() else {
            return false;
        };
        let Some(h) = t.by_token.get(token) else {
            return false;
        };
        addr.checked_add(len)
            .is_some_and(|end| end <= h.res.payload_addr + h.res.len as u64)
            && h.writer == *peer
            // The payload may land until `done_by`: the reservation must outlive it, or the
            // reaper could hand the slot to another writer while these bytes arrive.
            && done_by < h.expires
    }
}

/// Where the storage servers are, as this node's membership sees them.
#[derive(Debug, Default)]
pub(crate) struct StorageView {
    /// Ring of storage nodes only (placement).
    pub(crate) ring: Option<Ring>,
    /// Their control endpoints.
    pub(crate) control: HashMap<NodeId, std::net::SocketAddr>,
}

impl StorageView {
    /// A view of `members` whose role is `storage`.
    pub(crate) fn of(members: &[peercache_discovery::NodeInfo], vnodes: u32) -> StorageView {
        let storage: Vec<&peercache_discovery::NodeInfo> =
            members.iter().filter(|m| m.role == "storage").collect();
        StorageView {
            ring: (!storage.is_empty())
                .then(|| Ring::new(storage.iter().map(|m| m.node.clone()), vnodes)),
            control: storage
                .iter()
                .map(|m| (m.node.clone(), m.control))
                .collect(),
        }
    }
}

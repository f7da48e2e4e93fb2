//! What a shard admits from a peer: a member inserts, removes and marks only its own copies,
//! and a hand-off comes only from a node that held the range, naming only live owners.

use peercache_wire::PageKey;
use peercache_wire::rpc::Peer;
use thiserror::Error;

use crate::location::Owners;
use crate::msg::DirRequest;
use crate::ring::Ring;

/// Most hand-off entries a shard keeps while it has no ring to judge them by.
pub const MAX_EARLY_HANDOFF_ENTRIES: usize = 1 << 20;

/// Most owners one hand-off entry may name.
pub const MAX_HANDOFF_OWNERS: usize = 64;

/// The rings a shard judges hand-offs by: the one before the last change and the current one
/// (a sender may act on either while the change propagates).
#[derive(Clone, Debug, Default)]
pub struct Holders {
    /// The ring before the last change.
    pub previous: Ring,
    /// The current ring.
    pub current: Ring,
    /// Owners per key.
    pub replicas: usize,
}

impl Holders {
    /// Whether `peer` held `key`'s range on either ring.
    pub fn held_by(&self, key: PageKey, peer: &Peer, idx: &mut Vec<u32>) -> bool {
        [&self.previous, &self.current].iter().any(|ring| {
            ring.owner_indices(key, self.replicas.max(1), idx);
            idx.iter().any(|&i| peer.is(ring.member(i)))
        })
    }
}

/// Why a shard refused a request.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// The request acts on another node's copies.
    #[error(
        "{action} of {target}'s copies refused: a member may {action} only its own (this \
         connection belongs to {caller})"
    )]
    NotYours {
        /// `insert`, `remove` or `mark`.
        action: &'static str,
        /// The node the request named.
        target: String,
        /// Who the connection belongs to.
        caller: String,
    },
    /// No entry of the hand-off came from a node that held its range.
    #[error(
        "hand-off of {entries} entries refused: {caller} held none of their ranges on this \
         shard's previous or current ring"
    )]
    NotAHolder {
        /// Entries refused.
        entries: usize,
        /// The sender.
        caller: String,
    },
    /// A hand-off arrived before this shard had a ring, and too many are waiting already.
    #[error(
        "hand-off of {entries} entries refused: this shard has no ring yet and holds {max} \
         early entries already"
    )]
    TooEarly {
        /// Entries refused.
        entries: usize,
        /// The limit.
        max: usize,
    },
}

/// What admission kept and dropped of a hand-off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandoffAdmission {
    /// Entries whose sender did not hold the range.
    pub not_a_holder: usize,
    /// Owners dropped because they are not live members.
    pub dead_owners: usize,
    /// Entries dropped for naming more than [`MAX_HANDOFF_OWNERS`] owners.
    pub too_many_owners: usize,
}

/// Checks that every copy an insert, remove or mark names belongs to `peer`.
pub fn check_own(peer: &Peer, req: &DirRequest<'_>) -> Result<(), Refusal> {
    let foreign = match req {
        DirRequest::Insert(entries) => entries
            .iter()
            .find(|(_, l)| !peer.is(&l.node))
            .map(|(_, l)| ("insert", &l.node)),
        DirRequest::Remove(items) => items
            .iter()
            .find(|r| !peer.is(&r.node))
            .map(|r| ("remove", &r.node)),
        DirRequest::MarkNonResident(items) => items
            .iter()
            .find(|r| !peer.is(&r.node))
            .map(|r| ("mark", &r.node)),
        DirRequest::Lookup(_) | DirRequest::Exists(_) | DirRequest::Handoff(_) => None,
    };
    match foreign {
        None => Ok(()),
        Some((action, node)) => Err(Refusal::NotYours {
            action,
            target: node.to_string(),
            caller: peer.label(),
        }),
    }
}

/// Keeps the hand-off entries `peer` may send under `holders`: the sender held the range, the
/// owners are live members (on the current ring), and no entry names more than
/// [`MAX_HANDOFF_OWNERS`] owners.
pub fn filter_handoff(
    peer: &Peer,
    holders: &Holders,
    entries: Vec<(PageKey, Owners)>,
) -> (Vec<(PageKey, Owners)>, HandoffAdmission) {
    let mut seen = HandoffAdmission::default();
    let mut idx = Vec::with_capacity(holders.replicas.max(1));
    let kept = entries
        .into_iter()
        .filter_map(|(key, mut owners)| {
            if !holders.held_by(key, peer, &mut idx) {
                seen.not_a_holder += 1;
                return None;
            }
            let before = owners.len();
            owners.retain(|o| holders.current.contains(&o.node));
            seen.dead_owners += before - owners.len();
            if owners.len() > MAX_HANDOFF_OWNERS {
                seen.too_many_owners += 1;
                return None;
            }
            (!owners.is_empty()).then_some((key, owners))
        })
        .collect();
    (kept, seen)
}

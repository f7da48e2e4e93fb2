//! Hand-off planning when the ring changes: which entries move where, which are dropped.
//!
//! For every key a shard holds, compare its owners on the old and the new ring. Owners that
//! are new get the entry from exactly one sender — the first old owner still alive — so a join
//! moves each entry once per new owner, not once per replica. A node that is no longer an
//! owner drops the entry (after sending it, if it is the sender). Entries whose owners did not
//! change do not move at all.

use std::collections::HashMap;

use peercache_wire::{NodeId, PageKey};

use crate::ring::Ring;
use crate::shard::Shard;

/// What one shard must do after a ring change.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HandoffPlan {
    /// Entries to send, per receiving node.
    pub sends: HashMap<NodeId, Vec<PageKey>>,
    /// Entries this shard no longer owns (drop after the sends are acknowledged).
    pub drops: Vec<PageKey>,
}

impl HandoffPlan {
    /// Total entries to send.
    pub fn send_count(&self) -> usize {
        self.sends.values().map(Vec::len).sum()
    }
}

/// One ring change seen key by key: each key's owners on both rings, as member indices of the
/// new ring, computed once where the change cannot touch the key. With members only removed, a
/// key's owners change only if one of its old owners left; with members only added, only if a
/// newcomer is among its new owners — so most keys cost one ring walk, not two, and no
/// allocation.
struct Change<'r> {
    old: &'r Ring,
    new: &'r Ring,
    replicas: usize,
    /// Old member index → new member index (None: left).
    to_new: Vec<Option<u32>>,
    /// New member index → whether it joined.
    joined: Vec<bool>,
    removed: bool,
    added: bool,
    old_idx: Vec<u32>,
    new_idx: Vec<u32>,
    /// The key's old owners as new member indices (None: left).
    old_owners: Vec<Option<u32>>,
}

impl<'r> Change<'r> {
    fn new(old: &'r Ring, new: &'r Ring, replicas: usize) -> Self {
        let to_new: Vec<Option<u32>> = old.members().iter().map(|m| new.index_of(m)).collect();
        let joined: Vec<bool> = new.members().iter().map(|m| !old.contains(m)).collect();
        Change {
            removed: to_new.iter().any(Option::is_none),
            added: joined.iter().any(|&j| j),
            old,
            new,
            replicas,
            to_new,
            joined,
            old_idx: Vec::with_capacity(replicas),
            new_idx: Vec::with_capacity(replicas),
            old_owners: Vec::with_capacity(replicas),
        }
    }

    /// Computes `key`'s owners on both rings. Returns false, computing as little as it can,
    /// when they are the same members and `keep` (a new member index) is among them.
    fn owners(&mut self, key: PageKey, keep: Option<u32>) -> bool {
        let kept = |idx: &[u32]| keep.is_none_or(|k| idx.contains(&k));
        if !self.added {
            self.old
                .owner_indices(key, self.replicas, &mut self.old_idx);
            self.old_owners.clear();
            self.old_owners
                .extend(self.old_idx.iter().map(|&i| self.to_new[i as usize]));
            if self.old_owners.iter().all(Option::is_some) {
                self.new_idx.clear();
                self.new_idx.extend(self.old_owners.iter().flatten());
                return !kept(&self.new_idx);
            }
            self.new
                .owner_indices(key, self.replicas, &mut self.new_idx);
            return true;
        }
        self.new
            .owner_indices(key, self.replicas, &mut self.new_idx);
        if !self.removed && !self.new_idx.iter().any(|&n| self.joined[n as usize]) {
            self.old_owners.clear();
            self.old_owners
                .extend(self.new_idx.iter().map(|&n| Some(n)));
            return !kept(&self.new_idx);
        }
        self.old
            .owner_indices(key, self.replicas, &mut self.old_idx);
        self.old_owners.clear();
        self.old_owners
            .extend(self.old_idx.iter().map(|&i| self.to_new[i as usize]));
        true
    }

    /// New owners of the key last computed that were not among its old owners.
    fn gained(&self) -> impl Iterator<Item = u32> + '_ {
        self.new_idx
            .iter()
            .copied()
            .filter(|&n| !self.old_owners.contains(&Some(n)))
    }
}

/// Plans the hand-off of `shard` held by `me` from `old` to `new` with `replicas` owners per key.
pub fn plan(shard: &Shard, me: &NodeId, old: &Ring, new: &Ring, replicas: usize) -> HandoffPlan {
    let mut plan = HandoffPlan::default();
    if old.is_empty() {
        // A node's first view: whatever it holds arrived by hand-off for the new ring already.
        return plan;
    }
    let me_new = new.index_of(me);
    let mut change = Change::new(old, new, replicas);
    let mut sends: Vec<Vec<PageKey>> = vec![Vec::new(); new.members().len()];
    for key in shard.keys() {
        // Keys whose owners did not change and include this node stay as they are.
        if !change.owners(key, Some(me_new.unwrap_or(u32::MAX))) {
            continue;
        }
        // The sender: the first old owner that is still a member; if no old owner survives
        // (or the entry arrived here by a route the old ring did not predict), we send.
        let sender = change.old_owners.iter().flatten().next().copied();
        if sender.is_none() || sender == me_new {
            for n in change.gained() {
                if Some(n) != me_new {
                    sends[n as usize].push(key);
                }
            }
        }
        if !me_new.is_some_and(|m| change.new_idx.contains(&m)) {
            plan.drops.push(key);
        }
    }
    plan.sends = sends
        .into_iter()
        .enumerate()
        .filter(|(_, keys)| !keys.is_empty())
        .map(|(n, keys)| (new.member(n as u32).clone(), keys))
        .collect();
    plan
}

/// What an owner re-announces after a ring change ([`reannounce_routes`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reannounce {
    /// The pages that move, as indices into the owner's page list, in its order.
    pub pages: Vec<usize>,
    /// Per receiving node, indices into [`Self::pages`] (the layout
    /// [`crate::DirectoryClient::insert_routed`] takes).
    pub routes: Vec<(NodeId, Vec<usize>)>,
}

/// Where an owner re-announces its own pages after a ring change: for each page whose
/// directory replica set gained members between `before` and `after`, those new members only.
///
/// `pages` yields the owner's page keys in order. Pages whose replicas did not change are not
/// listed, so a join costs about `replicas`/N of the owner's pages, never the whole pool. This
/// covers what shard-to-shard hand-off cannot: entries a departed or restarted directory node
/// held alone (`replicas` = 1), and entries published under a view other shards had already
/// left behind.
///
/// ```
/// use peercache_directory::{handoff, Ring};
/// use peercache_wire::{NodeId, PageKey};
///
/// let n = |s: &str| NodeId::new(s).unwrap();
/// let before = Ring::new([n("a"), n("b"), n("c")], 64);
/// let after = Ring::new([n("a"), n("b")], 64);
/// let keys: Vec<PageKey> = (0..100u64).map(|i| PageKey::from_bytes(&i.to_le_bytes())).collect();
/// let plan = handoff::reannounce_routes(&before, &after, 1, keys.iter().copied());
/// // Exactly the pages whose directory entry lived on "c" move, each to its new primary.
/// let on_c = keys.iter().filter(|k| before.owners(**k, 1)[0] == n("c")).count();
/// assert_eq!(plan.pages.len(), on_c);
/// for (node, idx) in &plan.routes {
///     for &i in idx {
///         assert_eq!(after.owners(keys[plan.pages[i]], 1)[0], *node);
///     }
/// }
/// ```
pub fn reannounce_routes(
    before: &Ring,
    after: &Ring,
    replicas: usize,
    pages: impl IntoIterator<Item = PageKey>,
) -> Reannounce {
    let mut out = Reannounce::default();
    let mut change = Change::new(before, after, replicas);
    // Receivers by member index of `after`.
    let mut routes: Vec<Vec<usize>> = vec![Vec::new(); after.members().len()];
    for (i, key) in pages.into_iter().enumerate() {
        if !change.owners(key, None) {
            continue;
        }
        let mut listed = false;
        for m in change.gained() {
            if !listed {
                out.pages.push(i);
                listed = true;
            }
            routes[m as usize].push(out.pages.len() - 1);
        }
    }
    out.routes = routes
        .into_iter()
        .enumerate()
        .filter(|(_, v)| !v.is_empty())
        .map(|(m, v)| (after.member(m as u32).clone(), v))
        .collect();
    out
}

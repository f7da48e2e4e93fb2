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

/// Plans the hand-off of `shard` held by `me` from `old` to `new` with `replicas` owners per key.
pub fn plan(shard: &Shard, me: &NodeId, old: &Ring, new: &Ring, replicas: usize) -> HandoffPlan {
    let mut plan = HandoffPlan::default();
    if old.is_empty() {
        // A node's first view: whatever it holds arrived by hand-off for the new ring already.
        return plan;
    }
    let mut old_idx = Vec::with_capacity(replicas);
    let mut new_idx = Vec::with_capacity(replicas);
    for key in shard.keys() {
        old.owner_indices(key, replicas, &mut old_idx);
        new.owner_indices(key, replicas, &mut new_idx);
        let old_owners = old_idx.iter().map(|&i| old.member(i));
        let new_owners: Vec<&NodeId> = new_idx.iter().map(|&i| new.member(i)).collect();
        // The sender: the first old owner that is still a member; if no old owner survives
        // (or the entry arrived here by a route the old ring did not predict), we send.
        let sender = old_owners.clone().find(|n| new.contains(n)).unwrap_or(me);
        if sender == me {
            for n in &new_owners {
                if *n != me && !old_idx.iter().any(|&i| old.member(i) == *n) {
                    plan.sends.entry((*n).clone()).or_default().push(key);
                }
            }
        }
        if !new_owners.contains(&me) {
            plan.drops.push(key);
        }
    }
    plan
}

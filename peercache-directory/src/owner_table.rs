//! The shard's owner table: what is the same for every page one owner publishes — its node id,
//! incarnation, rails (endpoint and region key per rail) and page layout fingerprint — is kept
//! here once, and each (key, owner) copy in the shard names it by a 4-byte id.
//!
//! Records are reference counted by the copies that name them, so an owner that re-registers
//! its region (new key) or restarts (new incarnation) does not leave its old record behind once
//! its last old copy is gone.

use peercache_wire::{Incarnation, Layout, NodeId};
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};

use crate::location::{Location, Rail};

/// Most records a table holds: ids fit in 30 bits (the copy keeps two flag bits beside it).
pub(crate) const MAX_OWNERS: u32 = 1 << 30;

/// One owner's constants.
#[derive(Debug)]
pub(crate) struct OwnerRecord {
    pub(crate) node: NodeId,
    pub(crate) incarnation: Incarnation,
    pub(crate) rails: SmallVec<[Rail; 1]>,
    /// The layout fingerprint of the owner's pages (one per record, not per copy: an owner
    /// writes one layout at a time).
    pub(crate) layout: Layout,
    /// Copies naming this record.
    refs: u32,
    /// Whether `node` is in the shard's live member set.
    pub(crate) live: bool,
    hash: u64,
}

/// Interned owner records.
#[derive(Debug, Default)]
pub(crate) struct OwnerTable {
    records: Vec<Option<OwnerRecord>>,
    /// Record hash → the ids with that hash.
    index: HashMap<u64, SmallVec<[u32; 1]>>,
    free: Vec<u32>,
    /// The record interned last: a batch of inserts comes from one owner.
    last: Option<u32>,
    state: std::hash::RandomState,
}

impl OwnerTable {
    fn hash_of(&self, loc: &Location) -> u64 {
        let mut h = self.state.build_hasher();
        loc.node.hash(&mut h);
        loc.incarnation.hash(&mut h);
        loc.rails.hash(&mut h);
        loc.layout.hash(&mut h);
        h.finish()
    }

    fn same(r: &OwnerRecord, loc: &Location) -> bool {
        r.incarnation == loc.incarnation
            && r.layout == loc.layout
            && r.rails[..] == loc.rails[..]
            && r.node == loc.node
    }

    /// The id of `loc`'s owner record, created if new; one more reference to it. `None` when the
    /// table is full ([`MAX_OWNERS`] distinct owners — far past any shard's memory).
    pub(crate) fn intern(&mut self, loc: &Location, live: bool) -> Option<u32> {
        if let Some(id) = self.last
            && let Some(r) = self.records[id as usize].as_mut()
            && Self::same(r, loc)
        {
            r.refs += 1;
            return Some(id);
        }
        let hash = self.hash_of(loc);
        let records = &self.records;
        let found = self.index.get(&hash).and_then(|ids| {
            ids.iter().copied().find(|&id| {
                records[id as usize]
                    .as_ref()
                    .is_some_and(|r| Self::same(r, loc))
            })
        });
        if let Some(id) = found {
            if let Some(r) = self.records[id as usize].as_mut() {
                r.refs += 1;
            }
            self.last = Some(id);
            return Some(id);
        }
        let record = OwnerRecord {
            node: loc.node.clone(),
            incarnation: loc.incarnation,
            rails: loc.rails.clone(),
            layout: loc.layout,
            refs: 1,
            live,
            hash,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id as usize] = Some(record);
                id
            }
            None => {
                if self.records.len() as u64 >= MAX_OWNERS as u64 {
                    return None;
                }
                self.records.push(Some(record));
                (self.records.len() - 1) as u32
            }
        };
        self.index.entry(hash).or_default().push(id);
        self.last = Some(id);
        Some(id)
    }

    /// Drops one reference to `id`; the record goes when its last copy does.
    pub(crate) fn release(&mut self, id: u32) {
        let Some(r) = self.records[id as usize].as_mut() else {
            return;
        };
        r.refs -= 1;
        if r.refs > 0 {
            return;
        }
        let hash = r.hash;
        if let Some(ids) = self.index.get_mut(&hash) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.index.remove(&hash);
            }
        }
        self.records[id as usize] = None;
        self.free.push(id);
        if self.last == Some(id) {
            self.last = None;
        }
    }

    /// The record of `id` (a live id: copies only hold ids they referenced).
    pub(crate) fn get(&self, id: u32) -> &OwnerRecord {
        self.records[id as usize]
            .as_ref()
            .expect("a copy names a record it holds a reference to")
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.records.len() - self.free.len()
    }

    /// Marks each record live or not by `live`; returns how many records are not live, and
    /// the ids of those that were not live and now are (their copies become visible).
    pub(crate) fn set_live(&mut self, live: &HashSet<NodeId>) -> (usize, Vec<u32>) {
        let mut dead = 0;
        let mut revived = Vec::new();
        for (id, r) in self.records.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            let now = live.contains(&r.node);
            if now && !r.live {
                revived.push(id as u32);
            }
            r.live = now;
            dead += usize::from(!now);
        }
        (dead, revived)
    }

    /// True if some record is `node` of another incarnation than `incarnation`.
    pub(crate) fn has_other_incarnation(&self, node: &NodeId, incarnation: Incarnation) -> bool {
        self.records
            .iter()
            .flatten()
            .any(|r| r.node == *node && r.incarnation != incarnation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(node: &str, inc: u64, region: u64) -> Location {
        crate::location::sample(node, inc, region)
    }

    #[test]
    fn one_record_per_owner_shape_and_freed_with_its_last_copy() {
        let mut t = OwnerTable::default();
        let a = t.intern(&loc("a", 1, 7), true).unwrap();
        let b = t.intern(&loc("b", 1, 7), true).unwrap();
        assert_ne!(a, b);
        // Same owner again (not the last interned): found through the index.
        assert_eq!(t.intern(&loc("a", 1, 7), true), Some(a));
        // Another incarnation or region is another record.
        let a2 = t.intern(&loc("a", 2, 7), true).unwrap();
        let a3 = t.intern(&loc("a", 1, 8), true).unwrap();
        // So is another layout: the fingerprint is the owner's, kept once per record.
        let mut fp8 = loc("a", 1, 7);
        fp8.layout = Layout(0xf8);
        let a4 = t.intern(&fp8, true).unwrap();
        assert_ne!(a4, a);
        assert_eq!(t.get(a4).layout, Layout(0xf8));
        assert_eq!(t.get(a).layout, Layout::NONE);
        t.release(a4);
        assert_eq!(t.len(), 4);
        assert!(t.has_other_incarnation(&NodeId::new("a").unwrap(), Incarnation(1)));
        t.release(a2);
        assert!(!t.has_other_incarnation(&NodeId::new("a").unwrap(), Incarnation(1)));
        t.release(a);
        assert_eq!(t.get(a).node.as_str(), "a", "one reference left");
        t.release(a);
        assert_eq!(t.len(), 2);
        // A freed id is reused, and the index finds the new record under it.
        let c = t.intern(&loc("c", 1, 7), true).unwrap();
        assert!(c == a || c == a2);
        assert_eq!(t.intern(&loc("b", 1, 7), true), Some(b));
        assert_eq!(t.intern(&loc("c", 1, 7), true), Some(c));
        assert_eq!(t.intern(&loc("a", 1, 8), true), Some(a3));
    }

    #[test]
    fn liveness_is_kept_per_record() {
        let mut t = OwnerTable::default();
        let a = t.intern(&loc("a", 1, 7), true).unwrap();
        let b = t.intern(&loc("b", 1, 7), true).unwrap();
        let live: HashSet<NodeId> = [NodeId::new("a").unwrap()].into_iter().collect();
        assert_eq!(t.set_live(&live), (1, vec![]));
        assert!(t.get(a).live);
        assert!(!t.get(b).live);
        // b comes back: its record is reported revived, once.
        let both: HashSet<NodeId> = ["a", "b"].map(|n| NodeId::new(n).unwrap()).into();
        assert_eq!(t.set_live(&both), (0, vec![b]));
        assert_eq!(t.set_live(&both), (0, vec![]));
    }
}

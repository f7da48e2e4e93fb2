//! Writes to the shard: inserts (with the reclaimable hint), removals, the non-resident
//! mark, hand-off merges and dropped keys.

use peercache_wire::{NodeId, PageKey};
use smallvec::SmallVec;

use crate::changes::ChangeKind;
use crate::location::Location;
use crate::owner_table::MAX_OWNERS;

use super::entry::{Copy36, RECLAIMABLE, RESIDENT, split};
use super::{InsertOutcome, Millis, Shard};

impl Shard {
    /// Records that `loc.node` holds `key` at `loc`.
    pub fn insert(&mut self, key: PageKey, loc: Location, now: Millis) -> InsertOutcome {
        let i = match self.find(key, now) {
            Some(i) => {
                self.touch(i, now);
                i
            }
            None => match self.alloc(key, now) {
                Some(i) => i,
                None => return self.refused(),
            },
        };
        let live = self.is_live_node(&loc.node);
        let Some(id) = self.owners.intern(&loc, live) else {
            if self.entries.get(i).copies.is_empty() {
                self.drop_entry(i);
            }
            return self.refused();
        };
        if !live {
            self.dead_records = self.dead_records.max(1);
        }
        let gc = self.retain_copies(i, |_, live| !live);
        self.stats.gc_locations += gc as u64;
        let Shard {
            entries,
            owners,
            cfg,
            ..
        } = self;
        let copies = &mut entries.get_mut(i).copies;
        let mut copy = Copy36::new(id, &loc);
        let existing = copies
            .iter()
            .position(|c| owners.get(c.id()).node == loc.node);
        let mut was_resident = None;
        let new_owner = match existing {
            Some(at) => {
                let old = copies[at];
                was_resident = Some(old.resident());
                copies[at] = copy;
                owners.release(old.id());
                false
            }
            None => true,
        };
        let live_owners = copies.len() as u16 + u16::from(new_owner);
        let reclaimable = new_owner && live_owners >= cfg.reclaim_threshold;
        if new_owner {
            if reclaimable {
                // The entry says what the inserting node is told to do with its copy.
                copy.owner |= RECLAIMABLE;
            }
            copies.push(copy);
        }
        // A copy of an owner this shard does not count live is not part of its state (yet):
        // it is recorded when the owner is (set_live).
        let key = split(key);
        match was_resident {
            _ if !live => {}
            Some(was) => self.note_medium(key, &loc.node, was, loc.resident),
            None => self.note(key, &loc.node, loc.resident, ChangeKind::Stored),
        }
        InsertOutcome {
            new_owner,
            live_owners,
            reclaimable,
        }
    }

    /// What an insert the shard cannot hold reports (past 2^32 entries or 2^30 owner records).
    fn refused(&self) -> InsertOutcome {
        tracing::warn!(
            entries = self.index.len(),
            owner_records = self.owners.len(),
            max_owner_records = MAX_OWNERS,
            "directory shard full: insert not recorded"
        );
        InsertOutcome {
            new_owner: false,
            live_owners: 0,
            reclaimable: false,
        }
    }

    /// Removes `node`'s location of `key`, only if it is of `generation` (when given), so a
    /// late eviction notice cannot remove a newer publish.
    pub fn remove(&mut self, key: PageKey, node: &NodeId, generation: Option<u64>) -> bool {
        let Some(i) = self.find_index(split(key)) else {
            return false;
        };
        let owners = &self.owners;
        let hits: SmallVec<[bool; 2]> = self
            .entries
            .get(i)
            .copies
            .iter()
            .map(|c| {
                owners.get(c.id()).node == *node && generation.is_none_or(|g| g == c.generation)
            })
            .collect();
        let mut at = 0;
        let removed = self.retain_copies(i, |_, _| {
            at += 1;
            hits[at - 1]
        }) > 0;
        if self.entries.get(i).copies.is_empty() {
            self.drop_entry(i);
        }
        removed
    }

    /// Marks `node`'s copy of `key` as disk-only (of `generation`, when given).
    pub fn mark_nonresident(
        &mut self,
        key: PageKey,
        node: &NodeId,
        generation: Option<u64>,
    ) -> bool {
        let Some(i) = self.find_index(split(key)) else {
            return false;
        };
        let Shard {
            entries, owners, ..
        } = self;
        let e = entries.get_mut(i);
        let key = e.key;
        match e.copies.iter_mut().find(|c| {
            let g = c.generation;
            owners.get(c.id()).node == *node && generation.is_none_or(|want| want == g)
        }) {
            Some(c) => {
                let was = c.resident();
                c.owner &= !RESIDENT;
                if owners.get(c.id()).live {
                    self.note_medium(key, node, was, false);
                }
                true
            }
            None => false,
        }
    }

    /// Merges owners received in a hand-off (an owner already known keeps the newer copy).
    pub fn merge(&mut self, key: PageKey, incoming: &[Location], now: Millis) {
        let i = match self.find(key, now) {
            Some(i) => i,
            None => match self.alloc(key, now) {
                Some(i) => i,
                None => {
                    self.refused();
                    return;
                }
            },
        };
        let key = self.entries.get(i).key;
        for loc in incoming {
            let live = self.is_live_node(&loc.node);
            let Shard {
                entries, owners, ..
            } = self;
            let copies = &mut entries.get_mut(i).copies;
            let at = copies
                .iter()
                .position(|c| owners.get(c.id()).node == loc.node);
            if let Some(at) = at
                && copies[at].generation >= loc.generation
            {
                continue;
            }
            let Some(id) = owners.intern(loc, live) else {
                self.refused();
                continue;
            };
            if !live {
                self.dead_records = self.dead_records.max(1);
            }
            let copy = Copy36::new(id, loc);
            let was = match at {
                Some(at) => {
                    let old = copies[at];
                    copies[at] = copy;
                    owners.release(old.id());
                    Some(old.resident())
                }
                None => {
                    copies.push(copy);
                    None
                }
            };
            match was {
                // Recorded when its owner is counted live (set_live).
                _ if !live => {}
                Some(was) => self.note_medium(key, &loc.node, was, loc.resident),
                // Idempotent for a subscriber that already had it from the shard before.
                None => self.note(key, &loc.node, loc.resident, ChangeKind::Stored),
            }
        }
        if self.entries.get(i).copies.is_empty() {
            self.drop_entry(i);
        }
    }

    /// Drops entries outright (after handing them off).
    pub fn drop_keys(&mut self, keys: &[PageKey]) {
        for k in keys {
            if let Some(i) = self.find_index(split(*k)) {
                self.drop_entry(i);
            }
        }
    }
}

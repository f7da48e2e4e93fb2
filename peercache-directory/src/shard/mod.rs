//! One node's shard of the directory: a bounded map from page key to its owners' locations.
//!
//! Sans-IO: every operation is a method taking the current time in milliseconds, so tests run
//! hundreds of shards with a simulated clock. Memory is bounded by `max_entries` (entries not
//! used for the longest go first, by CLOCK: a lookup marks an entry, and the eviction hand
//! passes over marked entries once, clearing the mark) and an optional entry TTL; locations of
//! nodes that left are collected when the live member set changes.
//!
//! Compact by construction: what is the same for every page of one owner (node, incarnation,
//! rails) lives once in the owner table, and each (key, owner) copy keeps only what differs —
//! slot address, generation, lengths, checksum and two flags — in 36 bytes. Entries sit in a
//! chunked arena and the key index holds 8-byte slots (hash tag and entry number), so with two
//! owners per key the
//! whole shard costs about 57 bytes per (key, owner) (measured by `peercache-bench scale`).
//! A lookup reads its entry and the (hot) owner records and writes only its entry's mark: no
//! list links of neighbouring entries to fetch and dirty.
//!
//! The entry arena's records live in `entry`; finding, allocating, expiring and evicting
//! entries in `table`; inserts, removals and merges in `write`; lookups in `read`; the live
//! member set and the sweep of departed owners in `members`.

use std::collections::HashSet;

use peercache_wire::{NodeId, PageKey};
use serde::{Deserialize, Serialize};

use crate::arena::Arena;
use crate::changes::{Change, ChangeKind, Journal};
use crate::key_index::KeyIndex;
use crate::location::{CopyClass, Location};
use crate::owner_table::OwnerTable;

mod entry;
mod members;
mod read;
mod table;
mod write;

use entry::{Copy36, Entry, VACANT, join};

/// Milliseconds on the caller's clock.
pub type Millis = u64;

/// Shard limits.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Most entries held; beyond it, entries not used since the eviction hand last passed are
    /// dropped (CLOCK, an approximation of least recently used).
    pub max_entries: usize,
    /// Entries not inserted or read for this long are dropped (0 = never).
    pub entry_ttl_ms: u64,
    /// A new owner that makes the live owner count reach this gets a `reclaimable` hint.
    pub reclaim_threshold: u16,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            max_entries: 4_000_000,
            entry_ttl_ms: 0,
            reclaim_threshold: 3,
        }
    }
}

/// What an insert did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InsertOutcome {
    /// The inserting node was not an owner before (false: a duplicate or an update).
    pub new_owner: bool,
    /// Live owners after the insert.
    pub live_owners: u16,
    /// The inserting node should keep its copy as reclaimable (it is a third-or-later live
    /// owner).
    pub reclaimable: bool,
}

/// Counters of a shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Entries held.
    pub entries: u64,
    /// Entries dropped for the size cap.
    pub cap_evictions: u64,
    /// Entries dropped for the TTL.
    pub ttl_expirations: u64,
    /// Locations dropped because their owner left or restarted.
    pub gc_locations: u64,
}

/// One shard.
pub struct Shard {
    cfg: ShardConfig,
    /// Entry numbers, hashed by the key stored in the entry.
    index: KeyIndex,
    entries: Arena<Entry>,
    free: Vec<u32>,
    /// The clock hand: the next slot eviction looks at.
    hand: u32,
    owners: OwnerTable,
    /// The live member set (`None`: everyone is live until the first `set_live`).
    live: Option<HashSet<NodeId>>,
    /// Owner records whose node is not live (copies of theirs may still be held).
    dead_records: usize,
    stats: ShardStats,
    /// Copies that appeared and went, while recording is on.
    journal: Option<Journal>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("entries", &self.index.len())
            .field("owner_records", &self.owners.len())
            .finish()
    }
}

impl Shard {
    /// An empty shard.
    pub fn new(cfg: ShardConfig) -> Shard {
        Shard {
            cfg,
            index: KeyIndex::default(),
            entries: Arena::default(),
            free: Vec::new(),
            hand: 0,
            owners: OwnerTable::default(),
            live: None,
            dead_records: 0,
            stats: ShardStats::default(),
            journal: None,
        }
    }

    /// Starts recording every copy that appears in or goes from this shard (at most `cap`
    /// between two [`Shard::take_changes`]; the rest are counted lost).
    pub fn record_changes(&mut self, cap: usize) {
        self.journal = Some(Journal::new(cap));
    }

    /// Appends the changes recorded since the last call to `into`, in order, and returns how
    /// many were lost to the cap meanwhile (0 when recording is off).
    pub fn take_changes(&mut self, into: &mut Vec<Change>) -> u64 {
        self.journal.as_mut().map_or(0, |j| j.drain(into))
    }

    /// Calls `f(key, node, resident)` for every copy of a live owner: the shard's current state,
    /// as a late subscriber to its changes needs it.
    pub fn for_each_copy(&self, mut f: impl FnMut(PageKey, &NodeId, bool)) {
        let mut from = 0;
        while let Some(next) = self.for_each_copy_in(from, u32::MAX, &mut f) {
            from = next;
        }
    }

    /// [`Shard::for_each_copy`] over at most `slots` entry slots from slot `from` on; returns
    /// the slot to go on from, or `None` at the end. A caller that takes the shard's lock per
    /// call holds it for one chunk only; an entry present throughout is visited exactly once,
    /// one added or dropped between calls may or may not be.
    pub fn for_each_copy_in(
        &self,
        from: u32,
        slots: u32,
        mut f: impl FnMut(PageKey, &NodeId, bool),
    ) -> Option<u32> {
        let end = from.saturating_add(slots).min(self.entries.len());
        for i in from..end {
            let e = self.entries.get(i);
            if e.stamp & VACANT != 0 {
                continue;
            }
            for c in &e.copies {
                let r = self.owners.get(c.id());
                if r.live {
                    f(join(e.key), &r.node, c.resident());
                }
            }
        }
        (end < self.entries.len()).then_some(end)
    }

    fn note(&mut self, key: [u64; 2], node: &NodeId, resident: bool, kind: ChangeKind) {
        if let Some(j) = &mut self.journal {
            j.note(join(key), node, resident, kind);
        }
    }

    /// Records a copy of `node` that was `was` (resident or not) and now is `now`.
    fn note_medium(&mut self, key: [u64; 2], node: &NodeId, was: bool, now: bool) {
        if was != now {
            self.note(key, node, was, ChangeKind::Removed);
            self.note(key, node, now, ChangeKind::Stored);
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// Distinct owner records held (node, incarnation and rails; one per publishing owner in a
    /// steady cluster).
    pub fn owner_records(&self) -> usize {
        self.owners.len()
    }

    /// Counters.
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            entries: self.index.len() as u64,
            ..self.stats
        }
    }

    fn is_live_node(&self, node: &NodeId) -> bool {
        self.live.as_ref().is_none_or(|l| l.contains(node))
    }

    fn location(&self, c: &Copy36) -> Location {
        let r = self.owners.get(c.id());
        Location {
            node: r.node.clone(),
            incarnation: r.incarnation,
            rails: r.rails.clone(),
            addr: c.addr,
            len: c.len,
            valid_len: c.valid_len,
            generation: c.generation,
            checksum: c.checksum,
            resident: c.resident(),
            class: if c.reclaimable() {
                CopyClass::Reclaimable
            } else {
                CopyClass::Retained
            },
            layout: r.layout,
        }
    }

    /// All keys held.
    pub fn keys(&self) -> impl Iterator<Item = PageKey> + '_ {
        self.index.iter().map(|i| join(self.entries.get(i).key))
    }
}

#[cfg(test)]
mod tests {
    use super::entry::{Copy36, Entry};

    #[test]
    fn a_copy_is_36_bytes_and_an_entry_104() {
        assert_eq!(std::mem::size_of::<Copy36>(), 36);
        assert_eq!(std::mem::size_of::<Entry>(), 104);
    }
}

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

use std::collections::HashSet;

use peercache_wire::{NodeId, PageKey};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::arena::Arena;
use crate::changes::{Change, ChangeKind, Journal};
use crate::holding::KeyHolders;
use crate::key_index::KeyIndex;
use crate::location::{CopyClass, Location, Owners};
use crate::owner_table::{MAX_OWNERS, OwnerTable};

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

/// One owner's copy of a page: the owner-table id and what differs per page.
///
/// Packed to 4-byte alignment (36 bytes, not 40): fields are read by value, never borrowed.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
struct Copy36 {
    /// Owner-table id << 2 | reclaimable << 1 | resident.
    owner: u32,
    len: u32,
    valid_len: u32,
    addr: u64,
    generation: u64,
    checksum: u64,
}

const RESIDENT: u32 = 1;
const RECLAIMABLE: u32 = 2;

impl Copy36 {
    fn new(id: u32, loc: &Location) -> Copy36 {
        let mut owner = id << 2;
        if loc.resident {
            owner |= RESIDENT;
        }
        if loc.class == CopyClass::Reclaimable {
            owner |= RECLAIMABLE;
        }
        Copy36 {
            owner,
            len: loc.len,
            valid_len: loc.valid_len,
            addr: loc.addr,
            generation: loc.generation,
            checksum: loc.checksum,
        }
    }
    fn id(&self) -> u32 {
        self.owner >> 2
    }
    fn resident(&self) -> bool {
        self.owner & RESIDENT != 0
    }
    fn reclaimable(&self) -> bool {
        self.owner & RECLAIMABLE != 0
    }
}

/// Keys warmed together by the batch lookups (their lines stay in the first-level cache).
const WARM: usize = 32;

/// A key's copies; two inline (the default replica count), more on the heap.
type Copies = SmallVec<[Copy36; 2]>;

#[derive(Debug)]
struct Entry {
    /// The page key as two words (8-byte alignment keeps the entry at 104 bytes).
    key: [u64; 2],
    copies: Copies,
    /// Last use in milliseconds, with [`REFERENCED`] and [`VACANT`] in the top bits.
    stamp: u64,
}

/// Used since the clock hand last passed (a second chance before eviction).
const REFERENCED: u64 = 1 << 63;
/// A free slot of the arena.
const VACANT: u64 = 1 << 62;
const TIME: u64 = VACANT - 1;

impl Default for Entry {
    fn default() -> Self {
        Entry {
            key: [0; 2],
            copies: Copies::new(),
            stamp: VACANT,
        }
    }
}

fn split(key: PageKey) -> [u64; 2] {
    [key.0 as u64, (key.0 >> 64) as u64]
}

fn join(k: [u64; 2]) -> PageKey {
    PageKey(u128::from(k[0]) | (u128::from(k[1]) << 64))
}

/// Keys are already uniform hashes: fold and mix the two words.
fn hash_key(k: [u64; 2]) -> u64 {
    (k[0] ^ k[1])
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(26)
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

    // ----- recency: CLOCK (second chance) over the arena -----

    /// Marks entry `i` used at `now`.
    fn touch(&mut self, i: u32, now: Millis) {
        self.entries.get_mut(i).stamp = (now & TIME) | REFERENCED;
    }

    /// Evicts one entry: the first, from the hand on, not used since the hand last passed
    /// (used ones lose their mark and are passed over). Two turns at most.
    fn evict_one(&mut self) -> bool {
        let slots = self.entries.len();
        if slots == 0 {
            return false;
        }
        for _ in 0..2 * u64::from(slots) {
            let i = self.hand;
            self.hand = if i + 1 >= slots { 0 } else { i + 1 };
            let e = self.entries.get_mut(i);
            if e.stamp & VACANT != 0 {
                continue;
            }
            if e.stamp & REFERENCED != 0 {
                e.stamp &= !REFERENCED;
                continue;
            }
            self.drop_entry(i);
            return true;
        }
        false
    }

    fn find_index(&self, key: [u64; 2]) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash_key(key), |i| entries.get(i).key == key)
    }

    /// Drops entry `i`; its copies are recorded as gone.
    fn drop_entry(&mut self, i: u32) {
        let key = self.entries.get(i).key;
        self.index.remove(hash_key(key), i);
        let e = self.entries.get_mut(i);
        e.stamp = VACANT;
        let copies = std::mem::take(&mut e.copies);
        for c in &copies {
            if let Some(j) = &mut self.journal {
                j.note(
                    join(key),
                    &self.owners.get(c.id()).node,
                    c.resident(),
                    ChangeKind::Removed,
                );
            }
            self.owners.release(c.id());
        }
        self.free.push(i);
    }

    fn expired(&self, i: u32, now: Millis) -> bool {
        self.cfg.entry_ttl_ms > 0
            && now.saturating_sub(self.entries.get(i).stamp & TIME) > self.cfg.entry_ttl_ms
    }

    /// Finds a live entry, dropping it if its TTL passed.
    fn find(&mut self, key: PageKey, now: Millis) -> Option<u32> {
        let i = self.find_index(split(key))?;
        if self.expired(i, now) {
            self.drop_entry(i);
            self.stats.ttl_expirations += 1;
            return None;
        }
        Some(i)
    }

    fn alloc(&mut self, key: PageKey, now: Millis) -> Option<u32> {
        while self.index.len() >= self.cfg.max_entries.max(1) && self.evict_one() {
            self.stats.cap_evictions += 1;
        }
        // New entries start unmarked: only a use after the insert earns a second chance.
        let e = Entry {
            key: split(key),
            copies: Copies::new(),
            stamp: now & TIME,
        };
        let i = match self.free.pop() {
            Some(i) => {
                *self.entries.get_mut(i) = e;
                i
            }
            None => self.entries.push(e)?,
        };
        if !self.index.insert(hash_key(split(key)), i) {
            self.entries.get_mut(i).stamp = VACANT;
            self.free.push(i);
            return None;
        }
        Some(i)
    }

    /// Drops entry `i`'s copies for which `gone(copy, record live)` holds, releasing their
    /// owner records; returns how many went.
    fn retain_copies(&mut self, i: u32, mut gone: impl FnMut(&Copy36, bool) -> bool) -> usize {
        let Shard {
            entries,
            owners,
            journal,
            ..
        } = self;
        let e = entries.get_mut(i);
        let key = join(e.key);
        let copies = &mut e.copies;
        let before = copies.len();
        copies.retain(|c| {
            let c = *c;
            if gone(&c, owners.get(c.id()).live) {
                if let Some(j) = journal {
                    j.note(
                        key,
                        &owners.get(c.id()).node,
                        c.resident(),
                        ChangeKind::Removed,
                    );
                }
                owners.release(c.id());
                false
            } else {
                true
            }
        });
        before - copies.len()
    }

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

    /// The live owners of `key`, best first (resident retained copies, then resident
    /// reclaimable, then disk-only).
    pub fn lookup(&mut self, key: PageKey, now: Millis) -> Option<Owners> {
        let i = self.find(key, now)?;
        self.touch(i, now);
        let mut owners: Owners = self
            .entries
            .get(i)
            .copies
            .iter()
            .filter(|c| self.owners.get(c.id()).live)
            .map(|c| self.location(c))
            .collect();
        if owners.is_empty() {
            return None;
        }
        owners.sort_by_key(|o| (!o.resident, o.class == CopyClass::Reclaimable));
        Some(owners)
    }

    /// Reads the index slot and then the entry each key of `keys` will need, without depending
    /// on one key's answer for the next, so the batch's memory misses overlap instead of
    /// queueing one after another (at millions of keys every lookup misses the CPU caches).
    fn warm(&self, keys: &[PageKey]) {
        let mut homes = [None; WARM];
        for (h, k) in homes.iter_mut().zip(keys) {
            *h = self.index.home_entry(hash_key(split(*k)));
        }
        let mut acc = 0u64;
        for e in homes.iter().take(keys.len()).flatten() {
            acc ^= self.entries.get(*e).key[0];
        }
        std::hint::black_box(acc);
    }

    /// [`Shard::lookup`] of every key, in order: the batch form the directory service uses.
    pub fn lookup_many(&mut self, keys: &[PageKey], now: Millis) -> Vec<Option<Owners>> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(WARM) {
            self.warm(chunk);
            out.extend(chunk.iter().map(|k| self.lookup(*k, now)));
        }
        out
    }

    /// Which nodes hold each of `keys` (live copies only, in memory or on disk), in order —
    /// what a router's prefix query needs, without building a [`Location`] per copy. A query,
    /// not a use: it does not refresh the entries' recency.
    pub fn holders_many(&mut self, keys: &[PageKey], now: Millis) -> KeyHolders {
        let mut out = KeyHolders {
            ends: Vec::with_capacity(keys.len()),
            ..KeyHolders::default()
        };
        for chunk in keys.chunks(WARM) {
            self.warm(chunk);
            for k in chunk {
                match self.find(*k, now) {
                    Some(i) => {
                        let owners = &self.owners;
                        out.push_key(self.entries.get(i).copies.iter().filter_map(|c| {
                            let r = owners.get(c.id());
                            r.live.then_some((&r.node, c.resident()))
                        }));
                    }
                    None => out.push_key([]),
                }
            }
        }
        out
    }

    /// [`Shard::exists`] of every key, in order.
    pub fn exists_many(&mut self, keys: &[PageKey], now: Millis) -> Vec<bool> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(WARM) {
            self.warm(chunk);
            out.extend(chunk.iter().map(|k| self.exists(*k, now)));
        }
        out
    }

    /// True if some live owner has `key` (in memory or on disk).
    pub fn exists(&mut self, key: PageKey, now: Millis) -> bool {
        match self.find(key, now) {
            Some(i) => self
                .entries
                .get(i)
                .copies
                .iter()
                .any(|c| self.owners.get(c.id()).live),
            None => false,
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

    /// Drops every copy for which `gone` holds, over the whole shard; empty entries go too.
    fn sweep(&mut self, mut gone: impl FnMut(&OwnerTable, &Copy36) -> bool) -> usize {
        let mut dropped = 0;
        let mut empty = Vec::new();
        let ids: Vec<u32> = self.index.iter().collect();
        for i in ids {
            let Shard {
                entries,
                owners,
                journal,
                ..
            } = self;
            let e = entries.get_mut(i);
            let key = join(e.key);
            let copies = &mut e.copies;
            let before = copies.len();
            copies.retain(|c| {
                let c = *c;
                if gone(owners, &c) {
                    if let Some(j) = journal.as_mut() {
                        j.note(
                            key,
                            &owners.get(c.id()).node,
                            c.resident(),
                            ChangeKind::Removed,
                        );
                    }
                    owners.release(c.id());
                    false
                } else {
                    true
                }
            });
            dropped += before - copies.len();
            if copies.is_empty() {
                empty.push(i);
            }
        }
        for i in empty {
            self.drop_entry(i);
        }
        self.stats.gc_locations += dropped as u64;
        dropped
    }

    /// Sets the live member set and drops every location whose owner is not in it. Copies
    /// of an owner that was not live and now is (written before this shard saw it join) are
    /// recorded as appearing: they were not part of the shard's state until now.
    pub fn set_live(&mut self, members: impl IntoIterator<Item = NodeId>) -> usize {
        let live: HashSet<NodeId> = members.into_iter().collect();
        let (dead, revived) = self.owners.set_live(&live);
        self.dead_records = dead;
        self.live = Some(live);
        if !revived.is_empty() && self.journal.is_some() {
            self.note_revived(&revived);
        }
        if self.dead_records == 0 {
            // Every copy names a live owner: nothing to collect.
            return 0;
        }
        let dropped = self.sweep(|owners, c| !owners.get(c.id()).live);
        self.dead_records = 0;
        dropped
    }

    /// Records every copy of the owner records `revived` as appearing.
    fn note_revived(&mut self, revived: &[u32]) {
        let Shard {
            index,
            entries,
            owners,
            journal,
            ..
        } = self;
        let Some(j) = journal.as_mut() else { return };
        for i in index.iter() {
            let e = entries.get(i);
            for c in &e.copies {
                if revived.contains(&c.id()) {
                    let r = owners.get(c.id());
                    j.note(join(e.key), &r.node, c.resident(), ChangeKind::Stored);
                }
            }
        }
    }

    /// Drops every location of `node` older than `incarnation` (a restarted node's old life).
    pub fn drop_incarnations_before(
        &mut self,
        node: &NodeId,
        incarnation: peercache_wire::Incarnation,
    ) -> usize {
        if !self.owners.has_other_incarnation(node, incarnation) {
            return 0;
        }
        self.sweep(|owners, c| {
            let r = owners.get(c.id());
            r.node == *node && r.incarnation != incarnation
        })
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

    /// All keys held.
    pub fn keys(&self) -> impl Iterator<Item = PageKey> + '_ {
        self.index.iter().map(|i| join(self.entries.get(i).key))
    }

    /// The owners of `key` as stored (live or not), without touching recency (for hand-off).
    pub fn peek(&self, key: PageKey) -> Option<Owners> {
        let i = self.find_index(split(key))?;
        Some(
            self.entries
                .get(i)
                .copies
                .iter()
                .map(|c| self.location(c))
                .collect(),
        )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_36_bytes_and_an_entry_104() {
        assert_eq!(std::mem::size_of::<Copy36>(), 36);
        assert_eq!(std::mem::size_of::<Entry>(), 104);
    }
}

//! One node's shard of the directory: a bounded map from page key to its owners' locations.
//!
//! Sans-IO: every operation is a method taking the current time in milliseconds, so tests run
//! hundreds of shards with a simulated clock. Memory is bounded by `max_entries` (least
//! recently used entries go first) and an optional entry TTL; locations of nodes that left are
//! collected when the live member set changes.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use peercache_wire::{NodeId, PageKey};
use serde::{Deserialize, Serialize};

use crate::location::{CopyClass, Location, Owners};

/// Milliseconds on the caller's clock.
pub type Millis = u64;

const NIL: u32 = u32::MAX;

/// Shard limits.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// Most entries held; least recently used entries are dropped beyond it.
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

#[derive(Default)]
struct FoldHasher(u64);
impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
}

struct Entry {
    key: PageKey,
    owners: Owners,
    touched: Millis,
    prev: u32,
    next: u32,
}

/// One shard.
pub struct Shard {
    cfg: ShardConfig,
    index: HashMap<u128, u32, BuildHasherDefault<FoldHasher>>,
    entries: Vec<Entry>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
    live: Option<HashSet<NodeId>>,
    stats: ShardStats,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("entries", &self.index.len())
            .finish()
    }
}

impl Shard {
    /// An empty shard.
    pub fn new(cfg: ShardConfig) -> Shard {
        Shard {
            cfg,
            index: HashMap::default(),
            entries: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            live: None,
            stats: ShardStats::default(),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            entries: self.index.len() as u64,
            ..self.stats
        }
    }

    fn is_live(&self, node: &NodeId) -> bool {
        self.live.as_ref().is_none_or(|l| l.contains(node))
    }

    // ----- LRU by access (head = most recent) -----

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.entries[i as usize].prev, self.entries[i as usize].next);
        if p != NIL {
            self.entries[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.entries[n as usize].prev = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.entries[i as usize].prev = NIL;
        self.entries[i as usize].next = self.head;
        if self.head != NIL {
            self.entries[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn touch(&mut self, i: u32, now: Millis) {
        self.entries[i as usize].touched = now;
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn drop_entry(&mut self, i: u32) {
        self.unlink(i);
        let key = self.entries[i as usize].key;
        self.index.remove(&key.0);
        self.entries[i as usize].owners.clear();
        self.free.push(i);
    }

    fn expired(&self, i: u32, now: Millis) -> bool {
        self.cfg.entry_ttl_ms > 0
            && now.saturating_sub(self.entries[i as usize].touched) > self.cfg.entry_ttl_ms
    }

    /// Finds a live entry, dropping it if its TTL passed.
    fn find(&mut self, key: PageKey, now: Millis) -> Option<u32> {
        let i = *self.index.get(&key.0)?;
        if self.expired(i, now) {
            self.drop_entry(i);
            self.stats.ttl_expirations += 1;
            return None;
        }
        Some(i)
    }

    fn alloc(&mut self, key: PageKey, now: Millis) -> u32 {
        while self.index.len() >= self.cfg.max_entries.max(1) && self.tail != NIL {
            let t = self.tail;
            self.drop_entry(t);
            self.stats.cap_evictions += 1;
        }
        let e = Entry {
            key,
            owners: Owners::new(),
            touched: now,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i as usize] = e;
                i
            }
            None => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
        };
        self.index.insert(key.0, i);
        self.push_front(i);
        i
    }

    /// Records that `loc.node` holds `key` at `loc`.
    pub fn insert(&mut self, key: PageKey, loc: Location, now: Millis) -> InsertOutcome {
        let i = match self.find(key, now) {
            Some(i) => {
                self.touch(i, now);
                i
            }
            None => self.alloc(key, now),
        };
        let Shard {
            live,
            entries,
            stats,
            cfg,
            ..
        } = self;
        let owners = &mut entries[i as usize].owners;
        let before = owners.len();
        owners.retain(|o| live.as_ref().is_none_or(|l| l.contains(&o.node)));
        stats.gc_locations += (before - owners.len()) as u64;
        let new_owner = match owners.iter_mut().find(|o| o.node == loc.node) {
            Some(o) => {
                *o = loc;
                false
            }
            None => {
                owners.push(loc);
                true
            }
        };
        let live_owners = owners.len() as u16;
        let reclaimable = new_owner && live_owners >= cfg.reclaim_threshold;
        if reclaimable && let Some(o) = owners.last_mut() {
            // The entry says what the inserting node is told to do with its copy.
            o.class = crate::CopyClass::Reclaimable;
        }
        InsertOutcome {
            new_owner,
            live_owners,
            reclaimable,
        }
    }

    /// The live owners of `key`, best first (resident retained copies, then resident
    /// reclaimable, then disk-only).
    pub fn lookup(&mut self, key: PageKey, now: Millis) -> Option<Owners> {
        let i = self.find(key, now)?;
        self.touch(i, now);
        let mut owners: Owners = self.entries[i as usize]
            .owners
            .iter()
            .filter(|o| self.is_live(&o.node))
            .cloned()
            .collect();
        if owners.is_empty() {
            return None;
        }
        owners.sort_by_key(|o| (!o.resident, o.class == CopyClass::Reclaimable));
        Some(owners)
    }

    /// True if some live owner has `key` (in memory or on disk).
    pub fn exists(&mut self, key: PageKey, now: Millis) -> bool {
        match self.find(key, now) {
            Some(i) => self.entries[i as usize]
                .owners
                .iter()
                .any(|o| self.is_live(&o.node)),
            None => false,
        }
    }

    /// Removes `node`'s location of `key`, only if it is of `generation` (when given), so a
    /// late eviction notice cannot remove a newer publish.
    pub fn remove(&mut self, key: PageKey, node: &NodeId, generation: Option<u64>) -> bool {
        let Some(&i) = self.index.get(&key.0) else {
            return false;
        };
        let owners = &mut self.entries[i as usize].owners;
        let before = owners.len();
        owners.retain(|o| !(o.node == *node && generation.is_none_or(|g| g == o.generation)));
        let removed = owners.len() != before;
        if owners.is_empty() {
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
        let Some(&i) = self.index.get(&key.0) else {
            return false;
        };
        match self.entries[i as usize]
            .owners
            .iter_mut()
            .find(|o| o.node == *node && generation.is_none_or(|g| g == o.generation))
        {
            Some(o) => {
                o.resident = false;
                true
            }
            None => false,
        }
    }

    /// Sets the live member set and drops every location whose owner is not in it.
    pub fn set_live(&mut self, members: impl IntoIterator<Item = NodeId>) -> usize {
        let live: HashSet<NodeId> = members.into_iter().collect();
        let mut dropped = 0;
        let mut empty = Vec::new();
        for (&_, &i) in self.index.iter() {
            let owners = &mut self.entries[i as usize].owners;
            let before = owners.len();
            owners.retain(|o| live.contains(&o.node));
            dropped += before - owners.len();
            if owners.is_empty() {
                empty.push(i);
            }
        }
        for i in empty {
            self.drop_entry(i);
        }
        self.stats.gc_locations += dropped as u64;
        self.live = Some(live);
        dropped
    }

    /// Drops every location of `node` older than `incarnation` (a restarted node's old life).
    pub fn drop_incarnations_before(
        &mut self,
        node: &NodeId,
        incarnation: peercache_wire::Incarnation,
    ) -> usize {
        let mut dropped = 0;
        let mut empty = Vec::new();
        for (&_, &i) in self.index.iter() {
            let owners = &mut self.entries[i as usize].owners;
            let before = owners.len();
            owners.retain(|o| !(o.node == *node && o.incarnation != incarnation));
            dropped += before - owners.len();
            if owners.is_empty() {
                empty.push(i);
            }
        }
        for i in empty {
            self.drop_entry(i);
        }
        self.stats.gc_locations += dropped as u64;
        dropped
    }

    /// Merges owners received in a hand-off (an owner already known keeps the newer copy).
    pub fn merge(&mut self, key: PageKey, incoming: &[Location], now: Millis) {
        let i = match self.find(key, now) {
            Some(i) => i,
            None => self.alloc(key, now),
        };
        let owners = &mut self.entries[i as usize].owners;
        for loc in incoming {
            match owners.iter_mut().find(|o| o.node == loc.node) {
                Some(o) if o.generation >= loc.generation => {}
                Some(o) => *o = loc.clone(),
                None => owners.push(loc.clone()),
            }
        }
    }

    /// All keys held.
    pub fn keys(&self) -> impl Iterator<Item = PageKey> + '_ {
        self.index.keys().map(|&k| PageKey(k))
    }

    /// The owners of `key` without touching recency (for hand-off).
    pub fn peek(&self, key: PageKey) -> Option<&Owners> {
        self.index
            .get(&key.0)
            .map(|&i| &self.entries[i as usize].owners)
    }

    /// Drops entries outright (after handing them off).
    pub fn drop_keys(&mut self, keys: &[PageKey]) {
        for k in keys {
            if let Some(&i) = self.index.get(&k.0) {
                self.drop_entry(i);
            }
        }
    }
}

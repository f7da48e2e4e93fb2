//! The entry table: finding a key's entry, allocating one (evicting by CLOCK at the cap),
//! expiring by TTL, and dropping entries and copies.

use peercache_wire::PageKey;

use crate::changes::ChangeKind;

use super::entry::{Copies, Copy36, Entry, REFERENCED, TIME, VACANT, hash_key, join, split};
use super::{Millis, Shard};

impl Shard {
    // ----- recency: CLOCK (second chance) over the arena -----

    /// Marks entry `i` used at `now`.
    pub(super) fn touch(&mut self, i: u32, now: Millis) {
        self.entries.get_mut(i).stamp = (now & TIME) | REFERENCED;
    }

    /// Evicts one entry: the first, from the hand on, not used since the hand last passed
    /// (used ones lose their mark and are passed over). Two turns at most.
    pub(super) fn evict_one(&mut self) -> bool {
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

    pub(super) fn find_index(&self, key: [u64; 2]) -> Option<u32> {
        let entries = &self.entries;
        self.index
            .find(hash_key(key), |i| entries.get(i).key == key)
    }

    /// Drops entry `i`; its copies are recorded as gone.
    pub(super) fn drop_entry(&mut self, i: u32) {
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

    pub(super) fn expired(&self, i: u32, now: Millis) -> bool {
        self.cfg.entry_ttl_ms > 0
            && now.saturating_sub(self.entries.get(i).stamp & TIME) > self.cfg.entry_ttl_ms
    }

    /// Finds a live entry, dropping it if its TTL passed.
    pub(super) fn find(&mut self, key: PageKey, now: Millis) -> Option<u32> {
        let i = self.find_index(split(key))?;
        if self.expired(i, now) {
            self.drop_entry(i);
            self.stats.ttl_expirations += 1;
            return None;
        }
        Some(i)
    }

    pub(super) fn alloc(&mut self, key: PageKey, now: Millis) -> Option<u32> {
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
    pub(super) fn retain_copies(
        &mut self,
        i: u32,
        mut gone: impl FnMut(&Copy36, bool) -> bool,
    ) -> usize {
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
}

//! Reads of the shard: lookups, holders and exists, one key or a batch (a batch warms its
//! keys' index lines first).

use peercache_wire::PageKey;

use crate::holding::KeyHolders;
use crate::location::{CopyClass, Owners};

use super::entry::{WARM, hash_key, split};
use super::{Millis, Shard};

impl Shard {
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
    /// what a router's prefix query needs, without building a [`Location`](crate::Location)
    /// per copy. A query, not a use: it does not refresh the entries' recency.
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
}

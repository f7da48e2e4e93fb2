//! The shard's key index: open addressing with linear probing over 8-byte slots, each holding
//! the low 32 bits of the key's hash (its home slot and a tag) and the entry number.
//!
//! A probe run usually sits in one cache line, so finding a key costs the slot's line and the
//! entry it names — one dependent memory access fewer than a map that keeps its control bytes
//! and buckets apart. Deletion shifts the rest of the run back (no tombstones), so a shard that
//! churns keeps short probes. The load stays at or under 4/5: about 10–20 bytes per key.

/// A free slot (entry number `u32::MAX` is never handed out by the arena).
const EMPTY: u64 = u64::MAX;
/// Fewest slots.
const MIN_SLOTS: usize = 16;
/// Most slots: the home is taken from the hash's low 32 bits.
const MAX_SLOTS: usize = 1 << 32;

fn slot(h: u32, entry: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(entry)
}

/// Key hash → entry number.
#[derive(Debug)]
pub(crate) struct KeyIndex {
    slots: Vec<u64>,
    len: usize,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex {
            slots: vec![EMPTY; MIN_SLOTS],
            len: 0,
        }
    }
}

impl KeyIndex {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The entry of hash `h` for which `is_key(entry)` holds.
    #[inline]
    pub(crate) fn find(&self, h: u64, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = h as u32;
        let mask = self.mask();
        let mut p = tag as usize & mask;
        loop {
            let s = self.slots[p];
            if s == EMPTY {
                return None;
            }
            if (s >> 32) as u32 == tag && is_key(s as u32) {
                return Some(s as u32);
            }
            p = (p + 1) & mask;
        }
    }

    /// The first candidate entry of hash `h`: the entry in its home slot if that slot is taken
    /// (read to bring the line in; the caller confirms with [`KeyIndex::find`]).
    #[inline]
    pub(crate) fn home_entry(&self, h: u64) -> Option<u32> {
        let s = self.slots[(h as u32) as usize & self.mask()];
        (s != EMPTY).then_some(s as u32)
    }

    /// Adds `entry` under hash `h` (the caller knows the key is not there). False only when the
    /// index cannot grow further (past 3.4 G keys).
    pub(crate) fn insert(&mut self, h: u64, entry: u32) -> bool {
        if (self.len + 1) * 5 > self.slots.len() * 4 {
            if self.slots.len() >= MAX_SLOTS {
                if self.len + 1 >= self.slots.len() {
                    return false;
                }
            } else {
                self.grow();
            }
        }
        self.place(slot(h as u32, entry));
        self.len += 1;
        true
    }

    fn place(&mut self, s: u64) {
        let mask = self.mask();
        let mut p = (s >> 32) as usize & mask;
        while self.slots[p] != EMPTY {
            p = (p + 1) & mask;
        }
        self.slots[p] = s;
    }

    fn grow(&mut self) {
        let grown = vec![EMPTY; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, grown);
        for s in old {
            if s != EMPTY {
                self.place(s);
            }
        }
    }

    /// Removes `entry` held under hash `h`; false if it is not there.
    pub(crate) fn remove(&mut self, h: u64, entry: u32) -> bool {
        let want = slot(h as u32, entry);
        let mask = self.mask();
        let mut p = (h as u32) as usize & mask;
        loop {
            match self.slots[p] {
                EMPTY => return false,
                s if s == want => break,
                _ => p = (p + 1) & mask,
            }
        }
        // Shift the rest of the run back over the hole: a slot moves when its home is not
        // between the hole and itself (cyclically).
        let mut hole = p;
        let mut q = (p + 1) & mask;
        loop {
            let s = self.slots[q];
            if s == EMPTY {
                break;
            }
            let home = (s >> 32) as usize & mask;
            if (q.wrapping_sub(home) & mask) >= (q.wrapping_sub(hole) & mask) {
                self.slots[hole] = s;
                hole = q;
            }
            q = (q + 1) & mask;
        }
        self.slots[hole] = EMPTY;
        self.len -= 1;
        true
    }

    /// Every entry number held.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| s as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Few distinct hashes, so runs collide, wrap and shift back on removal, and equal tags
    /// name different keys.
    fn clumped(key: u64) -> u64 {
        ((key % 24) * 0x0101_0101) | (key << 40)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn agrees_with_a_map(ops in proptest::collection::vec((any::<bool>(), 0u64..200), 1..400)) {
            let mut idx = KeyIndex::default();
            let mut map: HashMap<u64, u32> = HashMap::new();
            let mut key_of: HashMap<u32, u64> = HashMap::new();
            let mut next = 0u32;
            for (add, key) in ops {
                if add {
                    if let std::collections::hash_map::Entry::Vacant(v) = map.entry(key) {
                        prop_assert!(idx.insert(clumped(key), next));
                        v.insert(next);
                        key_of.insert(next, key);
                        next += 1;
                    }
                } else if let Some(e) = map.remove(&key) {
                    prop_assert!(idx.remove(clumped(key), e));
                    prop_assert!(!idx.remove(clumped(key), e));
                }
                prop_assert_eq!(idx.len(), map.len());
                for k in 0..200u64 {
                    let found = idx.find(clumped(k), |e| key_of[&e] == k);
                    prop_assert_eq!(found, map.get(&k).copied(), "key {}", k);
                }
                let mut held: Vec<u32> = idx.iter().collect();
                held.sort_unstable();
                let mut want: Vec<u32> = map.values().copied().collect();
                want.sort_unstable();
                prop_assert_eq!(held, want);
            }
        }
    }

    #[test]
    fn finds_every_key_through_growth_and_removal() {
        let h = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
        let mut idx = KeyIndex::default();
        for k in 0..10_000u64 {
            assert!(idx.insert(h(k), k as u32));
        }
        assert_eq!(idx.len(), 10_000);
        assert!(idx.slots.len() * 4 >= idx.len() * 5, "load at most 4/5");
        for k in (0..10_000u64).step_by(2) {
            assert!(idx.remove(h(k), k as u32));
        }
        for k in 0..10_000u64 {
            let found = idx.find(h(k), |e| e == k as u32);
            assert_eq!(found.is_some(), k % 2 == 1, "key {k}");
        }
    }
}

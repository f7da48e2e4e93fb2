//! Pool state kept under the pool's one lock: slabs, size classes, the two-class LRUs and the
//! key index. Changed only through the small functions below; nothing here touches payload
//! memory or does I/O.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use peercache_wire::{Layout, PageKey};

use crate::class;
use crate::{Evicted, PoolError, ReplClass};

/// Packed slot reference: slab index in the high half, slot index in the low half.
pub(crate) type SlotRef = u64;
pub(crate) const NIL: SlotRef = u64::MAX;
const NO_CLASS: u16 = u16::MAX;

pub(crate) fn pack(slab: u32, idx: u32) -> SlotRef {
    ((slab as u64) << 32) | idx as u64
}
pub(crate) fn unpack(r: SlotRef) -> (u32, u32) {
    ((r >> 32) as u32, r as u32)
}

/// Keys are already uniform hashes: fold and mix them instead of hashing again (the multiply
/// keeps the table's control bits well spread even for adversarially regular keys).
#[derive(Default)]
pub(crate) struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26)
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
}
pub(crate) type KeyIndex = HashMap<u128, SlotRef, BuildHasherDefault<KeyHasher>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotState {
    Free,
    Writing,
    Live,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct SlotMeta {
    pub(crate) key: PageKey,
    pub(crate) generation: u64,
    pub(crate) prev: SlotRef,
    pub(crate) next: SlotRef,
    pub(crate) len: u32,
    pub(crate) valid_len: u32,
    pub(crate) checksum: u64,
    pub(crate) layout: Layout,
    pub(crate) state: SlotState,
    pub(crate) repl: ReplClass,
    pub(crate) leases: u32,
}

impl SlotMeta {
    const FREE: SlotMeta = SlotMeta {
        key: PageKey(0),
        generation: 0,
        prev: NIL,
        next: NIL,
        len: 0,
        valid_len: 0,
        checksum: 0,
        layout: Layout::NONE,
        state: SlotState::Free,
        repl: ReplClass::Retained,
        leases: 0,
    };
}

pub(crate) struct Slab {
    pub(crate) class: u16,
    pub(crate) slots: Vec<SlotMeta>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    head: SlotRef,
    tail: SlotRef,
    pub(crate) len: u64,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

pub(crate) struct Class {
    pub(crate) stride: u64,
    per_slab: u32,
    free: Vec<SlotRef>,
    lru: [List; 2],
    slabs: u32,
}

pub(crate) struct State {
    pub(crate) slab_bytes: u64,
    pub(crate) slabs: Vec<Slab>,
    free_slabs: Vec<u32>,
    pub(crate) classes: Vec<Class>,
    class_by_payload: HashMap<u64, u16>,
    pub(crate) index: KeyIndex,
    next_generation: u64,
    pub(crate) pages: [u64; 2],
    pub(crate) bytes_used: u64,
    pub(crate) evictions: [u64; 2],
    pub(crate) slab_steals: u64,
}

impl State {
    /// The first `ready` slabs are free to use; the others join through
    /// [`State::add_free_slab`] once their memory is faulted in.
    pub(crate) fn new(
        region_len: u64,
        slab_bytes: u64,
        ready: u32,
        first_generation: u64,
    ) -> State {
        let n = (region_len / slab_bytes) as u32;
        let mut index = KeyIndex::default();
        index.reserve((region_len / (16 << 10)) as usize);
        State {
            slab_bytes,
            slabs: (0..n)
                .map(|_| Slab {
                    class: NO_CLASS,
                    slots: Vec::new(),
                })
                .collect(),
            free_slabs: (0..ready.min(n)).rev().collect(),
            classes: Vec::new(),
            class_by_payload: HashMap::new(),
            index,
            next_generation: first_generation.max(1),
            pages: [0; 2],
            bytes_used: 0,
            evictions: [0; 2],
            slab_steals: 0,
        }
    }

    /// A slab whose memory is now faulted in joins the free slabs.
    pub(crate) fn add_free_slab(&mut self, s: u32) {
        debug_assert!(self.slabs[s as usize].class == NO_CLASS);
        self.free_slabs.push(s);
    }

    pub(crate) fn meta(&self, r: SlotRef) -> &SlotMeta {
        let (s, i) = unpack(r);
        &self.slabs[s as usize].slots[i as usize]
    }

    pub(crate) fn meta_mut(&mut self, r: SlotRef) -> &mut SlotMeta {
        let (s, i) = unpack(r);
        &mut self.slabs[s as usize].slots[i as usize]
    }

    /// Byte offset of a slot (its header) inside the region.
    pub(crate) fn offset(&self, r: SlotRef) -> u64 {
        let (s, i) = unpack(r);
        let class = &self.classes[self.slabs[s as usize].class as usize];
        s as u64 * self.slab_bytes + i as u64 * class.stride
    }

    pub(crate) fn class_of(&self, r: SlotRef) -> u16 {
        self.slabs[unpack(r).0 as usize].class
    }

    fn class_for(&mut self, len: u64) -> u16 {
        let payload = class::class_payload(len);
        if let Some(&c) = self.class_by_payload.get(&payload) {
            return c;
        }
        let stride = class::stride(payload);
        let id = self.classes.len() as u16;
        self.classes.push(Class {
            stride,
            per_slab: (self.slab_bytes / stride) as u32,
            free: Vec::new(),
            lru: [List::EMPTY; 2],
            slabs: 0,
        });
        self.class_by_payload.insert(payload, id);
        id
    }

    // ----- LRU lists (front = most recent) -----

    fn push_front(&mut self, c: u16, repl: ReplClass, r: SlotRef) {
        let head = self.classes[c as usize].lru[repl as usize].head;
        {
            let m = self.meta_mut(r);
            m.prev = NIL;
            m.next = head;
            m.repl = repl;
        }
        if head != NIL {
            self.meta_mut(head).prev = r;
        }
        let l = &mut self.classes[c as usize].lru[repl as usize];
        l.head = r;
        if l.tail == NIL {
            l.tail = r;
        }
        l.len += 1;
    }

    fn unlink(&mut self, c: u16, r: SlotRef) {
        let (prev, next, repl) = {
            let m = self.meta(r);
            (m.prev, m.next, m.repl)
        };
        if prev != NIL {
            self.meta_mut(prev).next = next;
        }
        if next != NIL {
            self.meta_mut(next).prev = prev;
        }
        let l = &mut self.classes[c as usize].lru[repl as usize];
        if l.head == r {
            l.head = next;
        }
        if l.tail == r {
            l.tail = prev;
        }
        l.len -= 1;
        let m = self.meta_mut(r);
        m.prev = NIL;
        m.next = NIL;
    }

    /// A hit or duplicate insert: most recent within its class, never migrating.
    pub(crate) fn refresh(&mut self, r: SlotRef) {
        if self.meta(r).state != SlotState::Live {
            return;
        }
        let c = self.class_of(r);
        let repl = self.meta(r).repl;
        self.unlink(c, r);
        self.push_front(c, repl, r);
    }

    /// Moves a live retained page to the reclaimable class (the "≥3 live owners" hint).
    pub(crate) fn demote(&mut self, r: SlotRef) -> bool {
        let m = self.meta(r);
        if m.state != SlotState::Live || m.repl == ReplClass::Reclaimable {
            return false;
        }
        let c = self.class_of(r);
        self.unlink(c, r);
        self.push_front(c, ReplClass::Reclaimable, r);
        self.pages[0] -= 1;
        self.pages[1] += 1;
        true
    }

    // ----- allocation and eviction -----

    /// Reserves a slot for a new page; evicted pages are appended to `evicted`.
    pub(crate) fn reserve(
        &mut self,
        key: PageKey,
        len: u32,
        valid_len: u32,
        layout: Layout,
        repl: ReplClass,
        evicted: &mut Vec<Evicted>,
    ) -> Result<SlotRef, PoolError> {
        let c = self.class_for(len as u64);
        let r = self.take_slot(c, len as u64, evicted)?;
        let generation = self.next_generation;
        self.next_generation += 1;
        *self.meta_mut(r) = SlotMeta {
            key,
            generation,
            prev: NIL,
            next: NIL,
            len,
            valid_len,
            checksum: 0,
            layout,
            state: SlotState::Writing,
            repl,
            leases: 0,
        };
        self.index.insert(key.0, r);
        Ok(r)
    }

    /// Returns a reserved (Writing) slot to its class's free list.
    pub(crate) fn abort(&mut self, r: SlotRef) {
        let c = self.class_of(r);
        let key = self.meta(r).key;
        self.index.remove(&key.0);
        self.meta_mut(r).state = SlotState::Free;
        self.classes[c as usize].free.push(r);
    }

    /// Marks a written slot live and most recent in its class.
    pub(crate) fn commit(&mut self, r: SlotRef, checksum: u64) {
        let c = self.class_of(r);
        let (repl, len) = {
            let m = self.meta_mut(r);
            m.state = SlotState::Live;
            m.checksum = checksum;
            (m.repl, m.len)
        };
        self.push_front(c, repl, r);
        self.pages[repl as usize] += 1;
        self.bytes_used += len as u64;
        debug_assert_eq!(self.index.get(&self.meta(r).key.0), Some(&r));
    }

    fn take_slot(
        &mut self,
        c: u16,
        len: u64,
        evicted: &mut Vec<Evicted>,
    ) -> Result<SlotRef, PoolError> {
        if let Some(r) = self.classes[c as usize].free.pop() {
            return Ok(r);
        }
        if let Some(s) = self.free_slabs.pop() {
            self.assign_slab(s, c);
            return self.classes[c as usize]
                .free
                .pop()
                .ok_or(PoolError::Full { len });
        }
        if let Some(r) = self.evict_one(c, evicted) {
            return Ok(r);
        }
        if let Some(s) = self.steal_slab(c, evicted) {
            self.assign_slab(s, c);
            return self.classes[c as usize]
                .free
                .pop()
                .ok_or(PoolError::Full { len });
        }
        Err(PoolError::Full { len })
    }

    fn assign_slab(&mut self, s: u32, c: u16) {
        let per = self.classes[c as usize].per_slab;
        let slab = &mut self.slabs[s as usize];
        slab.class = c;
        slab.slots.clear();
        slab.slots.resize(per as usize, SlotMeta::FREE);
        let class = &mut self.classes[c as usize];
        class.slabs += 1;
        class.free.extend((0..per).rev().map(|i| pack(s, i)));
    }

    /// Frees a live, unleased slot: out of the index and its list, counted as an eviction.
    fn evict_slot(&mut self, c: u16, r: SlotRef, evicted: &mut Vec<Evicted>) {
        self.unlink(c, r);
        let m = *self.meta(r);
        self.index.remove(&m.key.0);
        self.pages[m.repl as usize] -= 1;
        self.bytes_used -= m.len as u64;
        self.evictions[m.repl as usize] += 1;
        evicted.push(Evicted {
            key: m.key,
            generation: m.generation,
            class: m.repl,
        });
        let meta = self.meta_mut(r);
        meta.state = SlotState::Free;
    }

    /// Evicts the least recent unleased page of class `c`: reclaimable first, then retained.
    fn evict_one(&mut self, c: u16, evicted: &mut Vec<Evicted>) -> Option<SlotRef> {
        for repl in [ReplClass::Reclaimable, ReplClass::Retained] {
            let mut r = self.classes[c as usize].lru[repl as usize].tail;
            // Leased pages are skipped; a bounded walk keeps the cost O(1) in practice.
            let mut steps = 0;
            while r != NIL && steps < 256 {
                let m = self.meta(r);
                if m.leases == 0 && m.state == SlotState::Live {
                    self.evict_slot(c, r, evicted);
                    return Some(r);
                }
                r = m.prev;
                steps += 1;
            }
        }
        None
    }

    /// Takes a whole slab from the class holding the most slabs, evicting its pages.
    fn steal_slab(&mut self, want: u16, evicted: &mut Vec<Evicted>) -> Option<u32> {
        let victim_class = (0..self.classes.len() as u16)
            .filter(|&c| c != want && self.classes[c as usize].slabs > 0)
            .max_by_key(|&c| self.classes[c as usize].slabs)?;
        let s = (0..self.slabs.len() as u32).find(|&s| {
            let slab = &self.slabs[s as usize];
            slab.class == victim_class
                && slab
                    .slots
                    .iter()
                    .all(|m| m.leases == 0 && m.state != SlotState::Writing)
        })?;
        let n = self.slabs[s as usize].slots.len() as u32;
        for i in 0..n {
            let r = pack(s, i);
            if self.meta(r).state == SlotState::Live {
                self.evict_slot(victim_class, r, evicted);
            }
        }
        let class = &mut self.classes[victim_class as usize];
        class.free.retain(|&r| unpack(r).0 != s);
        class.slabs -= 1;
        self.slabs[s as usize].class = NO_CLASS;
        self.slab_steals += 1;
        Some(s)
    }

    /// Removes a page if it is live, unleased, and (when given) of the expected generation.
    pub(crate) fn remove(&mut self, key: PageKey, generation: Option<u64>) -> bool {
        let Some(&r) = self.index.get(&key.0) else {
            return false;
        };
        let m = *self.meta(r);
        if m.state != SlotState::Live
            || m.leases > 0
            || generation.is_some_and(|g| g != m.generation)
        {
            return false;
        }
        let c = self.class_of(r);
        self.unlink(c, r);
        self.index.remove(&key.0);
        self.pages[m.repl as usize] -= 1;
        self.bytes_used -= m.len as u64;
        self.meta_mut(r).state = SlotState::Free;
        self.classes[c as usize].free.push(r);
        true
    }

    /// Checks the structural invariants (tests and debug builds).
    pub(crate) fn check_invariants(&self) {
        let mut live = [0u64; 2];
        for (s, slab) in self.slabs.iter().enumerate() {
            for (i, m) in slab.slots.iter().enumerate() {
                if m.state == SlotState::Live {
                    live[m.repl as usize] += 1;
                    assert_eq!(
                        self.index.get(&m.key.0),
                        Some(&pack(s as u32, i as u32)),
                        "live slot not indexed"
                    );
                }
            }
        }
        assert_eq!(live, self.pages, "page counts drifted");
        for c in 0..self.classes.len() {
            for repl in [ReplClass::Retained, ReplClass::Reclaimable] {
                let mut n = 0;
                let mut r = self.classes[c].lru[repl as usize].head;
                while r != NIL {
                    let m = self.meta(r);
                    assert_eq!(m.repl, repl, "page on the wrong class list");
                    assert_eq!(m.state, SlotState::Live);
                    n += 1;
                    r = m.next;
                }
                assert_eq!(
                    n, self.classes[c].lru[repl as usize].len,
                    "list length drifted"
                );
            }
        }
    }
}

//! What the shard's arena holds: a key's entry and each owner's 36-byte copy record.

use peercache_wire::PageKey;
use smallvec::SmallVec;

use crate::location::{CopyClass, Location};

/// One owner's copy of a page: the owner-table id and what differs per page.
///
/// Packed to 4-byte alignment (36 bytes, not 40): fields are read by value, never borrowed.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub(super) struct Copy36 {
    /// Owner-table id << 2 | reclaimable << 1 | resident.
    pub(super) owner: u32,
    pub(super) len: u32,
    pub(super) valid_len: u32,
    pub(super) addr: u64,
    pub(super) generation: u64,
    pub(super) checksum: u64,
}

/// Flag bit of [`Copy36::owner`]: the copy is in memory.
pub(super) const RESIDENT: u32 = 1;
/// Flag bit of [`Copy36::owner`]: the copy is reclaimable.
pub(super) const RECLAIMABLE: u32 = 2;

impl Copy36 {
    pub(super) fn new(id: u32, loc: &Location) -> Copy36 {
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
    pub(super) fn id(&self) -> u32 {
        self.owner >> 2
    }
    pub(super) fn resident(&self) -> bool {
        self.owner & RESIDENT != 0
    }
    pub(super) fn reclaimable(&self) -> bool {
        self.owner & RECLAIMABLE != 0
    }
}

/// Keys warmed together by the batch lookups (their lines stay in the first-level cache).
pub(super) const WARM: usize = 32;

/// A key's copies; two inline (the default replica count), more on the heap.
pub(super) type Copies = SmallVec<[Copy36; 2]>;

/// A key's entry in the shard's arena.
#[derive(Debug)]
pub(super) struct Entry {
    /// The page key as two words (8-byte alignment keeps the entry at 104 bytes).
    pub(super) key: [u64; 2],
    pub(super) copies: Copies,
    /// Last use in milliseconds, with [`REFERENCED`] and [`VACANT`] in the top bits.
    pub(super) stamp: u64,
}

/// Used since the clock hand last passed (a second chance before eviction).
pub(super) const REFERENCED: u64 = 1 << 63;
/// A free slot of the arena.
pub(super) const VACANT: u64 = 1 << 62;
/// The time bits of a stamp.
pub(super) const TIME: u64 = VACANT - 1;

impl Default for Entry {
    fn default() -> Self {
        Entry {
            key: [0; 2],
            copies: Copies::new(),
            stamp: VACANT,
        }
    }
}

/// A key as the two words an entry stores.
pub(super) fn split(key: PageKey) -> [u64; 2] {
    [key.0 as u64, (key.0 >> 64) as u64]
}

/// The key an entry's two words store.
pub(super) fn join(k: [u64; 2]) -> PageKey {
    PageKey(u128::from(k[0]) | (u128::from(k[1]) << 64))
}

/// Keys are already uniform hashes: fold and mix the two words.
pub(super) fn hash_key(k: [u64; 2]) -> u64 {
    (k[0] ^ k[1])
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .rotate_left(26)
}

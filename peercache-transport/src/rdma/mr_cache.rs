//! The lazy local-MR cache: caller memory outside registered regions is registered on first
//! use, by page-aligned range, and kept for the batches that reuse it — SGLang reads into a
//! bounded set of host pages, so the cache converges after first touch and a steady read path
//! registers nothing. Sans-IO: it decides what to register and deregister; the RDMA path does
//! it.
//!
//! * Bounded by entries and by bytes; past either bound the least recently used entries that no
//!   batch holds are released.
//! * An entry is pinned while a batch uses it (the engine has drained every request that
//!   targets it before the batch releases it), so eviction and invalidation never deregister
//!   memory a queue pair may still write.
//! * Invalidation: memory the caller is about to unmap or reuse ([`MrCache::invalidate`]) —
//!   entries overlapping it are released at once, or when their last batch ends if pinned.
//!   A registration pins the physical pages it was made on; a range unmapped and mapped again
//!   under the same address would otherwise receive nothing (the reader's checksum then
//!   refuses the page, and the store invalidates the range).

/// Default bound on cached registrations.
pub const MAX_ENTRIES: usize = 256;
/// Default bound on cached bytes (registered memory is pinned: kept well below typical
/// `RLIMIT_MEMLOCK` settings of inference hosts).
pub const MAX_BYTES: u64 = 1 << 30;

/// One cached registration of `[start, end)`.
#[derive(Debug)]
struct Entry<K> {
    id: u64,
    start: u64,
    end: u64,
    keys: K,
    /// Batches using it now.
    pins: u32,
    /// Recency stamp (larger: used later).
    used: u64,
    /// Invalidated while pinned: released when the last pin goes.
    doomed: bool,
}

/// The cache; `K` is what a registration returns (the rails' keys).
#[derive(Debug)]
pub struct MrCache<K> {
    entries: Vec<Entry<K>>,
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    clock: u64,
    next_id: u64,
}

/// A registration held for one batch: release it with [`MrCache::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pin(u64);

impl<K: Clone> MrCache<K> {
    /// An empty cache bounded by `max_entries` registrations and `max_bytes` bytes.
    pub fn new(max_entries: usize, max_bytes: u64) -> Self {
        MrCache {
            entries: Vec::new(),
            max_entries: max_entries.max(1),
            max_bytes,
            bytes: 0,
            clock: 0,
            next_id: 1,
        }
    }

    /// Registrations held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes the held registrations cover.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A cached registration covering `[start, end)`, pinned for one batch, with its keys.
    pub fn get(&mut self, start: u64, end: u64) -> Option<(Pin, K)> {
        self.clock += 1;
        let now = self.clock;
        let e = self
            .entries
            .iter_mut()
            .find(|e| !e.doomed && e.start <= start && end <= e.end)?;
        e.pins += 1;
        e.used = now;
        Some((Pin(e.id), e.keys.clone()))
    }

    /// Caches a registration of `[start, end)` just made, pinned for one batch. Returns its pin
    /// and the registrations to release now to stay within the bounds (least recently used
    /// first; entries in use stay, so the bound is exceeded only while every entry is in use).
    pub fn insert(&mut self, start: u64, end: u64, keys: K) -> (Pin, Vec<K>) {
        self.clock += 1;
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(Entry {
            id,
            start,
            end,
            keys,
            pins: 1,
            used: self.clock,
            doomed: false,
        });
        self.bytes += end - start;
        (Pin(id), self.shrink())
    }

    /// Ends one batch's use of `pins`; returns the registrations to release now (invalidated
    /// while in use, or over the bounds).
    pub fn release(&mut self, pins: &[Pin]) -> Vec<K> {
        let mut out = Vec::new();
        for p in pins {
            if let Some(i) = self.entries.iter().position(|e| e.id == p.0) {
                let e = &mut self.entries[i];
                e.pins = e.pins.saturating_sub(1);
                if e.pins == 0 && e.doomed {
                    out.push(self.remove(i));
                }
            }
        }
        out.extend(self.shrink());
        out
    }

    /// Drops every registration overlapping `[start, end)` (memory the caller unmaps or reuses):
    /// returns those no batch uses, to release now; the rest go when their last batch ends.
    pub fn invalidate(&mut self, start: u64, end: u64) -> Vec<K> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            if e.start < end && start < e.end {
                if e.pins == 0 {
                    out.push(self.remove(i));
                    continue;
                }
                e.doomed = true;
            }
            i += 1;
        }
        out
    }

    /// Drops everything not in use (shutdown); returns the registrations to release.
    pub fn clear(&mut self) -> Vec<K> {
        self.invalidate(0, u64::MAX)
    }

    fn remove(&mut self, i: usize) -> K {
        let e = self.entries.swap_remove(i);
        self.bytes -= e.end - e.start;
        e.keys
    }

    /// Releases the least recently used unpinned entries while over a bound.
    fn shrink(&mut self) -> Vec<K> {
        let mut out = Vec::new();
        while self.entries.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some(i) = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| e.pins == 0)
                .min_by_key(|(_, e)| e.used)
                .map(|(i, _)| i)
            else {
                break;
            };
            out.push(self.remove(i));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_range_hits_and_a_covered_subrange_too() {
        let mut c: MrCache<u32> = MrCache::new(4, 1 << 20);
        assert!(c.get(0, 4096).is_none());
        let (p, evicted) = c.insert(0, 8192, 7);
        assert!(evicted.is_empty());
        assert!(c.release(&[p]).is_empty());
        let (p1, k) = c.get(0, 8192).unwrap();
        assert_eq!(k, 7);
        let (p2, _) = c.get(4096, 8192).unwrap();
        assert!(c.get(4096, 12288).is_none(), "not covered: a miss");
        assert!(c.release(&[p1, p2]).is_empty());
        assert_eq!((c.len(), c.bytes()), (1, 8192));
    }

    #[test]
    fn bounds_release_the_least_recently_used_entry_not_in_use() {
        let mut c: MrCache<u32> = MrCache::new(2, 1 << 20);
        let (a, _) = c.insert(0, 4096, 1);
        let (b, _) = c.insert(4096, 8192, 2);
        c.release(&[a, b]);
        // Touch 1 so 2 is the oldest.
        let (a, _) = c.get(0, 4096).unwrap();
        c.release(&[a]);
        let (x, out) = c.insert(8192, 12288, 3);
        assert_eq!(out, vec![2]);
        // Every entry in use: the bound waits for a release instead of pulling memory from
        // under a batch.
        let (a, _) = c.get(0, 4096).unwrap();
        let (y, out) = c.insert(12288, 16384, 4);
        assert!(out.is_empty());
        assert_eq!(c.len(), 3);
        let out = c.release(&[a, x, y]);
        assert_eq!(
            out,
            vec![3],
            "over the bound once a batch ends: least recently used out"
        );
        assert_eq!(c.len(), 2);
        // The byte bound too.
        let mut c: MrCache<u32> = MrCache::new(100, 8192);
        let (a, _) = c.insert(0, 8192, 1);
        c.release(&[a]);
        let (b, out) = c.insert(1 << 20, (1 << 20) + 4096, 2);
        assert_eq!(out, vec![1]);
        assert_eq!(c.bytes(), 4096);
        c.release(&[b]);
    }

    #[test]
    fn invalidation_releases_at_once_or_after_the_last_batch() {
        let mut c: MrCache<u32> = MrCache::new(8, 1 << 20);
        let (a, _) = c.insert(0, 8192, 1);
        let (b, _) = c.insert(16384, 20480, 2);
        c.release(&[b]);
        // Overlapping both: 2 is idle and goes now; 1 is in use and goes when released.
        assert_eq!(c.invalidate(4096, 20000), vec![2]);
        assert!(
            c.get(0, 4096).is_none(),
            "a doomed entry is never handed out"
        );
        assert_eq!(c.release(&[a]), vec![1]);
        assert!(c.is_empty());
        assert_eq!(c.bytes(), 0);
        // Touching ranges do not overlap.
        let (p, _) = c.insert(0, 4096, 3);
        c.release(&[p]);
        assert!(c.invalidate(4096, 8192).is_empty());
        assert_eq!(c.clear(), vec![3]);
    }
}

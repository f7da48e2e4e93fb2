//! A growable array in fixed-size chunks, indexed by `u32`.
//!
//! A `Vec` doubles its capacity as it grows, so a shard of 10 M entries could hold room for
//! 16.7 M; chunks keep the unused room under one chunk, and growing never moves (or briefly
//! doubles) what is already stored.

/// Entries per chunk (a power of two).
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const MASK: u32 = (CHUNK as u32) - 1;

/// The chunked array; `T::default()` fills a chunk's unused room.
#[derive(Debug, Default)]
pub(crate) struct Arena<T> {
    chunks: Vec<Box<[T]>>,
    len: u32,
}

impl<T: Default> Arena<T> {
    /// Appends `v`; returns its index. `None` past `u32::MAX - 1` items.
    pub(crate) fn push(&mut self, v: T) -> Option<u32> {
        if self.len == u32::MAX - 1 {
            return None;
        }
        let i = self.len;
        if (i >> CHUNK_BITS) as usize == self.chunks.len() {
            self.chunks
                .push(std::iter::repeat_with(T::default).take(CHUNK).collect());
        }
        self.chunks[(i >> CHUNK_BITS) as usize][(i & MASK) as usize] = v;
        self.len += 1;
        Some(i)
    }
}

impl<T> Arena<T> {
    /// Items pushed.
    pub(crate) fn len(&self) -> u32 {
        self.len
    }

    /// Item `i` (below the pushed length).
    #[inline]
    pub(crate) fn get(&self, i: u32) -> &T {
        &self.chunks[(i >> CHUNK_BITS) as usize][(i & MASK) as usize]
    }

    /// Item `i`, mutably.
    #[inline]
    pub(crate) fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.chunks[(i >> CHUNK_BITS) as usize][(i & MASK) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_across_chunks_and_keeps_values() {
        let mut a: Arena<u64> = Arena::default();
        for i in 0..(3 * CHUNK as u64 + 5) {
            assert_eq!(a.push(i * 7), Some(i as u32));
        }
        assert_eq!(a.chunks.len(), 4);
        assert_eq!(*a.get(CHUNK as u32), CHUNK as u64 * 7);
        *a.get_mut(2) = 1;
        assert_eq!(*a.get(2), 1);
        assert_eq!(*a.get(3 * CHUNK as u32 + 4), (3 * CHUNK as u64 + 4) * 7);
    }
}

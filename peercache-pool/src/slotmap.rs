//! The slotmap layout: directory-free placement. A key's bucket comes from a hash of the key
//! (independent of the ring's), and the page lives in one of the bucket's `ways` slots.
//!
//! ```text
//! bucket b at b × bucket_stride:
//!   | header way 0 | header way 1 | … | header way W-1 |   W × 64 bytes: one small read
//!   | payload way 0 (stride bytes) | payload way 1 | … |      answers exists and misses
//! ```
//!
//! A header is 64 bytes, little-endian: `seq u64` (seqlock: odd while the slot is written),
//! `magic u32 "PCSM"`, `version u16`, `flags u16`, `key u128`, `payload_len u32`, `reserved
//! u32`, `checksum u64` (XXH3-64 of the payload), `stamp u64` (write order, for the way
//! choice), `layout u64` (the page's layout fingerprint; 0 = none). Only the owner writes its region (under one lock), so two writers
//! never race on a slot; readers — local or remote, one-sided — accept a slot only if its
//! header is sound, matches the key, length and the reader's layout, its seq is even and unchanged across the
//! payload read, and the payload's checksum matches. Anything else is a clean miss.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use parking_lot::Mutex;
use peercache_wire::{Layout, PageKey};

use crate::PoolError;
use crate::mem::{Mapping, MmapAlloc, RegionAlloc};

/// Header magic, "PCSM".
pub const MAGIC: u32 = u32::from_le_bytes(*b"PCSM");
/// Header layout version.
pub const VERSION: u16 = 1;
/// Header bytes per way.
pub const HEADER: usize = 64;
const BUCKET_SEED: u64 = 0x5EED_B0C4_E7C0_FFEE;

/// Where slots are: derived from the region size and the three settings, identical on every
/// node that uses the same settings and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Largest payload a slot holds (`slot_max_page_bytes`).
    pub max_page: u32,
    /// Payload bytes per way (`max_page` rounded up to 64).
    pub payload_stride: u64,
    /// Slots per bucket (`slot_ways`).
    pub ways: u32,
    /// Buckets (`slot_num_buckets`, or derived).
    pub buckets: u64,
}

impl Geometry {
    /// The geometry of a region of `region_len` bytes; `buckets` 0 derives the most that fit.
    pub fn new(
        max_page: u32,
        ways: u32,
        buckets: u64,
        region_len: u64,
    ) -> Result<Geometry, PoolError> {
        if max_page == 0 || ways == 0 {
            return Err(PoolError::Geometry(
                "slotmap: slot_max_page_bytes and slot_ways must be positive".into(),
            ));
        }
        let payload_stride = (max_page as u64).div_ceil(64) * 64;
        let mut g = Geometry {
            max_page,
            payload_stride,
            ways,
            buckets: 1,
        };
        let fit = region_len / g.bucket_stride();
        g.buckets = if buckets == 0 { fit } else { buckets };
        if g.buckets == 0 || g.buckets > fit {
            return Err(PoolError::Geometry(format!(
                "slotmap: {} buckets of {} bytes do not fit {region_len} bytes",
                g.buckets.max(1),
                g.bucket_stride()
            )));
        }
        Ok(g)
    }

    /// Bytes of one bucket (headers + payloads).
    pub fn bucket_stride(&self) -> u64 {
        self.ways as u64 * (HEADER as u64 + self.payload_stride)
    }

    /// Bytes of a bucket's header block.
    pub fn header_block(&self) -> u64 {
        self.ways as u64 * HEADER as u64
    }

    /// Region bytes in use.
    pub fn region_len(&self) -> u64 {
        self.buckets * self.bucket_stride()
    }

    /// The bucket of `key` (a hash independent of the ring's).
    pub fn bucket_of(&self, key: PageKey) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(&key.0.to_le_bytes(), BUCKET_SEED) % self.buckets
    }

    /// Offset of bucket `b`'s header block.
    pub fn bucket_offset(&self, b: u64) -> u64 {
        b * self.bucket_stride()
    }

    /// Offset of the header of way `w` in bucket `b`.
    pub fn header_offset(&self, b: u64, w: u32) -> u64 {
        self.bucket_offset(b) + w as u64 * HEADER as u64
    }

    /// Offset of the payload of way `w` in bucket `b`.
    pub fn payload_offset(&self, b: u64, w: u32) -> u64 {
        self.bucket_offset(b) + self.header_block() + w as u64 * self.payload_stride
    }
}

/// A decoded slot header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    /// Seqlock word (odd: being written).
    pub seq: u64,
    /// Page key.
    pub key: PageKey,
    /// Payload bytes.
    pub len: u32,
    /// XXH3-64 of the payload.
    pub checksum: u64,
    /// Write order.
    pub stamp: u64,
    /// Layout fingerprint of the payload.
    pub layout: Layout,
}

impl SlotHeader {
    /// Decodes a header; None unless the magic and version are ours (empty or foreign slot).
    pub fn decode(b: &[u8]) -> Option<SlotHeader> {
        if b.len() < HEADER {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        let magic = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        let version = u16::from_le_bytes(b[12..14].try_into().expect("2"));
        if magic != MAGIC || version != VERSION {
            return None;
        }
        Some(SlotHeader {
            seq: u64_at(0),
            key: PageKey(u128::from_le_bytes(b[16..32].try_into().expect("16"))),
            len: u32::from_le_bytes(b[32..36].try_into().expect("4")),
            checksum: u64_at(40),
            stamp: u64_at(48),
            layout: Layout(u64_at(56)),
        })
    }

    fn encode_fields(&self, b: &mut [u8; HEADER]) {
        b[8..12].copy_from_slice(&MAGIC.to_le_bytes());
        b[12..14].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.key.0.to_le_bytes());
        b[32..36].copy_from_slice(&self.len.to_le_bytes());
        b[40..48].copy_from_slice(&self.checksum.to_le_bytes());
        b[48..56].copy_from_slice(&self.stamp.to_le_bytes());
        b[56..64].copy_from_slice(&self.layout.0.to_le_bytes());
    }
}

/// Why a slot read was not a hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotMiss {
    /// No way holds the key (never written, overwritten, or a different length).
    Absent,
    /// A way held the key but was being written or changed under the read (torn): rejected.
    Torn,
    /// A way held the key in another layout than the reader's: sound bytes of the wrong shape.
    Layout,
}

/// The reader's decision, given the bucket's header block read first, then the chosen way's
/// payload and its header read again after it.
pub fn accept(
    before: &SlotHeader,
    payload: &[u8],
    after: &[u8],
    key: PageKey,
    len: u32,
    layout: Layout,
) -> Result<(), SlotMiss> {
    let Some(after) = SlotHeader::decode(after) else {
        return Err(SlotMiss::Torn);
    };
    if before.seq & 1 == 1
        || after.seq != before.seq
        || after.key != key
        || after.len != len
        || after.layout != before.layout
    {
        return Err(SlotMiss::Torn);
    }
    if before.layout != layout {
        return Err(SlotMiss::Layout);
    }
    if payload.len() != len as usize || crate::header::checksum(payload) != before.checksum {
        return Err(SlotMiss::Torn);
    }
    Ok(())
}

/// The way of `key` in a bucket's header block, if any: (way, header).
pub fn find_way(block: &[u8], key: PageKey, len: Option<u32>) -> Option<(u32, SlotHeader)> {
    block
        .chunks_exact(HEADER)
        .enumerate()
        .filter_map(|(w, h)| SlotHeader::decode(h).map(|h| (w as u32, h)))
        .find(|(_, h)| h.key == key && h.seq & 1 == 0 && len.is_none_or(|l| h.len == l))
}

/// One node's slotmap region.
pub struct SlotMap {
    map: Mapping,
    geo: Geometry,
    write_lock: Mutex<u64>,
}

impl std::fmt::Debug for SlotMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMap")
            .field("geometry", &self.geo)
            .finish()
    }
}

impl SlotMap {
    /// Maps and pre-faults a region of `region_len` bytes laid out by `geo`'s settings.
    pub fn new(
        max_page: u32,
        ways: u32,
        buckets: u64,
        region_len: u64,
    ) -> Result<SlotMap, PoolError> {
        let geo = Geometry::new(max_page, ways, buckets, region_len)?;
        let map = MmapAlloc::default().map(geo.region_len() as usize)?;
        Ok(SlotMap {
            map,
            geo,
            write_lock: Mutex::new(0),
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Region start (for registration).
    pub fn base(&self) -> *mut u8 {
        self.map.ptr()
    }

    /// Region bytes.
    pub fn len(&self) -> usize {
        self.geo.region_len() as usize
    }

    /// Never empty (the geometry has at least one bucket).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn seq(&self, off: u64) -> &AtomicU64 {
        // SAFETY: header offsets are 64-byte aligned and inside the mapping, which lives as
        // long as `self`; the seq word is only accessed through this atomic view.
        unsafe { &*(self.map.ptr().add(off as usize) as *const AtomicU64) }
    }

    fn bytes(&self, off: u64, len: usize) -> &[u8] {
        // SAFETY: callers pass ranges inside the region. The bytes may change under a reader;
        // readers validate them with the seqlock and the checksum before trusting them.
        unsafe { std::slice::from_raw_parts(self.map.ptr().add(off as usize), len) }
    }

    /// Writes a page (owner side): way = the key's own way, else an empty one, else the
    /// oldest. Returns the way, or an error for a page larger than a slot.
    pub fn write(
        &self,
        key: PageKey,
        segments: &[&[u8]],
        layout: Layout,
    ) -> Result<u32, PoolError> {
        let len: usize = segments.iter().map(|s| s.len()).sum();
        if len == 0 {
            return Err(PoolError::EmptyPage(key));
        }
        if len > self.geo.max_page as usize {
            return Err(PoolError::TooLarge {
                key,
                len: len as u64,
                max: self.geo.max_page as u64,
            });
        }
        let b = self.geo.bucket_of(key);
        let mut stamp = self.write_lock.lock();
        let block = self.bytes(self.geo.bucket_offset(b), self.geo.header_block() as usize);
        let heads: Vec<Option<SlotHeader>> =
            block.chunks_exact(HEADER).map(SlotHeader::decode).collect();
        let way = heads
            .iter()
            .position(|h| h.is_some_and(|h| h.key == key))
            .or_else(|| heads.iter().position(|h| h.is_none()))
            .unwrap_or_else(|| {
                (0..heads.len())
                    .min_by_key(|&w| heads[w].map_or(0, |h| h.stamp))
                    .unwrap_or(0)
            }) as u32;
        *stamp += 1;
        let hoff = self.geo.header_offset(b, way);
        let seq = self.seq(hoff);
        let s = seq.load(Ordering::Relaxed);
        let odd = (s | 1).wrapping_add(if s & 1 == 1 { 2 } else { 0 });
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        let poff = self.geo.payload_offset(b, way) as usize;
        // SAFETY: the payload range of this way is inside the mapping and, under the write
        // lock, written by nobody else; readers detect the odd seq or the changed checksum.
        let checksum =
            unsafe { crate::fused::copy_and_checksum(segments, self.map.ptr().add(poff)) };
        let h = SlotHeader {
            seq: odd,
            key,
            len: len as u32,
            checksum,
            stamp: *stamp,
            layout,
        };
        let mut buf = [0u8; HEADER];
        h.encode_fields(&mut buf);
        // SAFETY: bytes 8..64 of this header, inside the mapping, owned by the writer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr().add(8),
                self.map.ptr().add(hoff as usize + 8),
                HEADER - 8,
            );
        }
        fence(Ordering::Release);
        seq.store(odd.wrapping_add(1), Ordering::Release);
        Ok(way)
    }

    /// Reads `key` locally into `dst` (its length must be the page's), with the same checks a
    /// remote reader makes, `layout` being the reader's.
    pub fn read(
        &self,
        key: PageKey,
        dst: &mut [&mut [u8]],
        layout: Layout,
    ) -> Result<(), SlotMiss> {
        let len: usize = dst.iter().map(|d| d.len()).sum();
        let b = self.geo.bucket_of(key);
        let block = self.bytes(self.geo.bucket_offset(b), self.geo.header_block() as usize);
        let (way, before) = find_way(block, key, Some(len as u32)).ok_or(SlotMiss::Absent)?;
        if before.layout != layout {
            return Err(SlotMiss::Layout);
        }
        fence(Ordering::Acquire);
        let payload = self.bytes(self.geo.payload_offset(b, way), len);
        let mut at = 0;
        for d in dst.iter_mut() {
            d.copy_from_slice(&payload[at..at + d.len()]);
            at += d.len();
        }
        fence(Ordering::Acquire);
        let after = self.bytes(self.geo.header_offset(b, way), HEADER);
        // Validate what was copied: the destination holds exactly the bytes checked.
        if let [one] = dst {
            return accept(&before, one, after, key, len as u32, layout);
        }
        let mut h = twox_hash::XxHash3_64::with_seed(0);
        for d in dst.iter() {
            std::hash::Hasher::write(&mut h, d);
        }
        let sum = std::hash::Hasher::finish(&h);
        match SlotHeader::decode(after) {
            Some(a)
                if before.seq & 1 == 0
                    && a.seq == before.seq
                    && a.key == key
                    && a.len == len as u32
                    && a.layout == before.layout
                    && sum == before.checksum =>
            {
                Ok(())
            }
            _ => Err(SlotMiss::Torn),
        }
    }

    /// Whether `key` is present with a sound header (any length).
    pub fn contains(&self, key: PageKey) -> bool {
        let b = self.geo.bucket_of(key);
        let block = self.bytes(self.geo.bucket_offset(b), self.geo.header_block() as usize);
        find_way(block, key, None).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> PageKey {
        PageKey::from_key(&format!("slot-{i}"))
    }

    #[test]
    fn geometry_derives_and_refuses() {
        let g = Geometry::new(1000, 4, 0, 1 << 20).unwrap();
        assert_eq!(g.payload_stride, 1024);
        assert_eq!(g.bucket_stride(), 4 * (64 + 1024));
        assert_eq!(g.buckets, (1 << 20) / g.bucket_stride());
        assert!(Geometry::new(1000, 4, 1 << 30, 1 << 20).is_err());
        assert!(Geometry::new(0, 4, 0, 1 << 20).is_err());
    }

    #[test]
    fn write_read_overwrite_overflow_and_length_mismatch() {
        // One bucket of four ways: every key lands in it.
        let m = SlotMap::new(4096, 4, 1, 4 * (64 + 4096)).unwrap();
        let pages: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i + 1; 3000]).collect();
        for (i, p) in pages.iter().enumerate().take(4) {
            m.write(key(i as u64), &[p], Layout::NONE).unwrap();
        }
        for (i, p) in pages.iter().enumerate().take(4) {
            let mut out = vec![0u8; 3000];
            m.read(key(i as u64), &mut [&mut out[..]], Layout::NONE)
                .unwrap();
            assert_eq!(&out, p);
        }
        // Overwrite in place.
        m.write(key(1), &[&[9u8; 3000]], Layout::NONE).unwrap();
        let mut out = vec![0u8; 3000];
        m.read(key(1), &mut [&mut out[..]], Layout::NONE).unwrap();
        assert_eq!(out, vec![9u8; 3000]);
        // Beyond the ways: the oldest (key 0) goes.
        m.write(key(4), &[&pages[4]], Layout::NONE).unwrap();
        assert_eq!(
            m.read(key(0), &mut [&mut out[..]], Layout::NONE),
            Err(SlotMiss::Absent)
        );
        assert!(m.contains(key(4)));
        // Into two segments (K and V halves).
        let (mut k, mut v) = (vec![0u8; 1000], vec![0u8; 2000]);
        m.read(key(2), &mut [&mut k[..], &mut v[..]], Layout::NONE)
            .unwrap();
        assert_eq!([k, v].concat(), pages[2]);
        // A different length is a miss, not a truncated page.
        let mut short = vec![0u8; 2999];
        assert_eq!(
            m.read(key(2), &mut [&mut short[..]], Layout::NONE),
            Err(SlotMiss::Absent)
        );
        assert!(m.write(key(9), &[&[0u8; 4097]], Layout::NONE).is_err());
    }
}

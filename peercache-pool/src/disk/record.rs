//! The on-disk record: a 64-byte header, then the payload. One record per file.
//!
//! ```text
//! off size field
//!   0    4 magic "PCDK"
//!   4    2 version (1)
//!   6    2 flags (0)
//!   8   16 page key
//!  24    4 payload length
//!  28    4 valid length
//!  32    8 XXH3-64 of the payload
//!  40    8 generation of the pool copy it was written from (informational)
//!  48    8 header checksum: XXH3-64 of bytes 0..48, seeded with the layout
//!  56    8 layout fingerprint (0: none; every record before layouts existed)
//! ```
//!
//! Seeding the header checksum with the layout keeps records without one readable unchanged
//! (seed 0 is plain XXH3-64) and makes a flipped layout word a header-checksum failure.

use peercache_wire::{Layout, PageKey};

/// Header size.
pub const RECORD_HEADER: usize = 64;
/// Record magic.
pub const RECORD_MAGIC: [u8; 4] = *b"PCDK";
/// Record version.
pub const RECORD_VERSION: u16 = 1;

/// A decoded record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Page key.
    pub key: PageKey,
    /// Payload bytes.
    pub len: u32,
    /// Valid bytes.
    pub valid_len: u32,
    /// Payload checksum.
    pub checksum: u64,
    /// Pool generation when written.
    pub generation: u64,
    /// Layout fingerprint of the payload.
    pub layout: Layout,
}

/// Why a record was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Shorter than a header, or than its header says.
    Truncated,
    /// Not a record (magic), or a version this build does not read.
    BadHeader,
    /// The header's own checksum does not match.
    HeaderChecksum,
    /// The payload does not match its checksum.
    PayloadChecksum,
}

impl RecordHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; RECORD_HEADER] {
        let mut b = [0u8; RECORD_HEADER];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..6].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        b[8..24].copy_from_slice(&self.key.0.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.valid_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.checksum.to_le_bytes());
        b[40..48].copy_from_slice(&self.generation.to_le_bytes());
        let hc = xxhash_rust::xxh3::xxh3_64_with_seed(&b[..48], self.layout.0);
        b[48..56].copy_from_slice(&hc.to_le_bytes());
        b[56..64].copy_from_slice(&self.layout.0.to_le_bytes());
        b
    }

    /// Decodes and checks a header (not the payload).
    pub fn decode(b: &[u8]) -> Result<RecordHeader, RecordError> {
        if b.len() < RECORD_HEADER {
            return Err(RecordError::Truncated);
        }
        if b[0..4] != RECORD_MAGIC || u16::from_le_bytes([b[4], b[5]]) != RECORD_VERSION {
            return Err(RecordError::BadHeader);
        }
        let hc = u64::from_le_bytes(b[48..56].try_into().expect("8 bytes"));
        let layout = Layout(u64::from_le_bytes(b[56..64].try_into().expect("8 bytes")));
        if hc != xxhash_rust::xxh3::xxh3_64_with_seed(&b[..48], layout.0) {
            return Err(RecordError::HeaderChecksum);
        }
        let h = RecordHeader {
            key: PageKey(u128::from_le_bytes(b[8..24].try_into().expect("16 bytes"))),
            len: u32::from_le_bytes(b[24..28].try_into().expect("4 bytes")),
            valid_len: u32::from_le_bytes(b[28..32].try_into().expect("4 bytes")),
            checksum: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
            generation: u64::from_le_bytes(b[40..48].try_into().expect("8 bytes")),
            layout,
        };
        if h.valid_len > h.len {
            return Err(RecordError::BadHeader);
        }
        Ok(h)
    }

    /// Checks a payload against this header.
    pub fn verify_payload(&self, payload: &[u8]) -> Result<(), RecordError> {
        if payload.len() != self.len as usize {
            return Err(RecordError::Truncated);
        }
        if crate::header::checksum(payload) != self.checksum {
            return Err(RecordError::PayloadChecksum);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_corruption_is_caught() {
        let payload = vec![9u8; 5000];
        let h = RecordHeader {
            key: PageKey::from_key("k"),
            len: 5000,
            valid_len: 4000,
            checksum: crate::header::checksum(&payload),
            generation: 7,
            layout: Layout(0xfeed),
        };
        let b = h.encode();
        assert_eq!(RecordHeader::decode(&b).unwrap(), h);
        assert!(h.verify_payload(&payload).is_ok());
        for i in 0..RECORD_HEADER {
            let mut c = b;
            c[i] ^= 0x40;
            assert!(
                RecordHeader::decode(&c).is_err(),
                "flipped byte {i} went unnoticed"
            );
        }
        assert_eq!(RecordHeader::decode(&b[..10]), Err(RecordError::Truncated));
        let mut bad = payload.clone();
        bad[100] ^= 1;
        assert_eq!(h.verify_payload(&bad), Err(RecordError::PayloadChecksum));
        assert_eq!(
            h.verify_payload(&payload[..10]),
            Err(RecordError::Truncated)
        );
    }

    #[test]
    fn a_record_written_before_layouts_existed_reads_with_no_layout() {
        // Version-1 records had zeros in bytes 56..64 and a plain XXH3-64 header checksum.
        let mut b = [0u8; RECORD_HEADER];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..6].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        b[8..24].copy_from_slice(&7u128.to_le_bytes());
        b[24..28].copy_from_slice(&10u32.to_le_bytes());
        b[28..32].copy_from_slice(&10u32.to_le_bytes());
        let hc = xxhash_rust::xxh3::xxh3_64(&b[..48]);
        b[48..56].copy_from_slice(&hc.to_le_bytes());
        let h = RecordHeader::decode(&b).unwrap();
        assert_eq!(h.layout, Layout::NONE);
        assert_eq!(h.key, PageKey(7));
    }
}

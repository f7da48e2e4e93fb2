//! The 64-byte header in front of every slot's payload. Part of the wire contract: remote
//! readers fetch header + payload in one op and verify them with [`verify`].
//!
//! ```text
//! off  size  field
//!   0     8  seq          seqlock word: odd while the slot is being written
//!   8     4  magic        "PCSL"
//!  12     2  version      1
//!  14     2  flags        bit 0: reclaimable
//!  16     8  generation   changes every time the slot is reused
//!  24    16  key          128-bit page key
//!  40     4  payload_len  bytes of payload
//!  44     4  valid_len    bytes that hold data (partial tail pages; = payload_len when full)
//!  48     8  checksum     xxh3-64 of the payload
//!  56     8  layout       layout fingerprint (0: none declared; every page before 0.9)
//! ```
//! All fields little-endian.

use peercache_wire::{Layout, PageKey};

/// Header size.
pub const HEADER_LEN: usize = 64;
/// Header magic.
pub const SLOT_MAGIC: u32 = u32::from_le_bytes(*b"PCSL");
/// Header version.
pub const SLOT_VERSION: u16 = 1;

/// A decoded slot header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    /// Seqlock word.
    pub seq: u64,
    /// Flags.
    pub flags: u16,
    /// Generation.
    pub generation: u64,
    /// Page key.
    pub key: PageKey,
    /// Payload bytes.
    pub payload_len: u32,
    /// Valid bytes.
    pub valid_len: u32,
    /// Payload checksum.
    pub checksum: u64,
    /// Layout fingerprint of the payload.
    pub layout: Layout,
}

/// Why a read was rejected. Every variant is a miss for the caller, never wrong bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifyError {
    /// Not a slot header (magic) or an unknown version.
    BadHeader,
    /// The slot was being written while read (odd or changed seq).
    Torn,
    /// The slot was reused since the location was handed out.
    Stale,
    /// The slot holds another key.
    WrongKey,
    /// Length differs from the location's (or the header claims more valid bytes than its
    /// payload holds).
    WrongLength,
    /// The payload does not match its checksum.
    Checksum,
    /// The page has another layout (model, dtype, geometry, ranks) than the reader's: its
    /// bytes are sound but the wrong shape for this reader.
    Layout,
}

impl VerifyError {
    /// Every [`VerifyError::label`], indexed by [`VerifyError::kind`].
    pub const KINDS: [&'static str; 7] = [
        "bad_header",
        "torn",
        "stale",
        "wrong_key",
        "wrong_length",
        "checksum",
        "layout",
    ];

    /// This error's index in [`VerifyError::KINDS`].
    pub fn kind(self) -> usize {
        match self {
            VerifyError::BadHeader => 0,
            VerifyError::Torn => 1,
            VerifyError::Stale => 2,
            VerifyError::WrongKey => 3,
            VerifyError::WrongLength => 4,
            VerifyError::Checksum => 5,
            VerifyError::Layout => 6,
        }
    }

    /// Short label for metrics.
    pub fn label(self) -> &'static str {
        Self::KINDS[self.kind()]
    }
}

impl SlotHeader {
    /// Encodes the header (seq included).
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..12].copy_from_slice(&SLOT_MAGIC.to_le_bytes());
        out[12..14].copy_from_slice(&SLOT_VERSION.to_le_bytes());
        out[14..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.generation.to_le_bytes());
        out[24..40].copy_from_slice(&self.key.0.to_le_bytes());
        out[40..44].copy_from_slice(&self.payload_len.to_le_bytes());
        out[44..48].copy_from_slice(&self.valid_len.to_le_bytes());
        out[48..56].copy_from_slice(&self.checksum.to_le_bytes());
        out[56..64].copy_from_slice(&self.layout.0.to_le_bytes());
    }

    /// Decodes a header; fails on a wrong magic or version.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<SlotHeader, VerifyError> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(8) != SLOT_MAGIC || u16::from_le_bytes([b[12], b[13]]) != SLOT_VERSION {
            return Err(VerifyError::BadHeader);
        }
        Ok(SlotHeader {
            seq: u64_at(0),
            flags: u16::from_le_bytes([b[14], b[15]]),
            generation: u64_at(16),
            key: PageKey(u128::from_le_bytes(b[24..40].try_into().expect("16 bytes"))),
            payload_len: u32_at(40),
            valid_len: u32_at(44),
            checksum: u64_at(48),
            layout: Layout(u64_at(56)),
        })
    }
}

/// What a reader expects, from the location it was handed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// Page key.
    pub key: PageKey,
    /// Generation in the location.
    pub generation: u64,
    /// Payload length in the location.
    pub len: u32,
    /// The reader's layout: a page of another layout is rejected ([`VerifyError::Layout`]).
    pub layout: Layout,
}

/// The checksum of a payload: XXH3-64 (seed 0), with AVX2 chosen at run time where present.
pub fn checksum(payload: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(payload)
}

/// [`checksum`] of a payload held in several segments, without joining them.
pub fn checksum_segments(segments: &[&[u8]]) -> u64 {
    use std::hash::Hasher;
    let mut h = twox_hash::XxHash3_64::with_seed(0);
    for s in segments {
        h.write(s);
    }
    h.finish()
}

/// The checks that do not need the payload bytes: a sound header, an even seqlock word, and
/// the expected generation, key and length.
fn check_header(
    header: &[u8; HEADER_LEN],
    payload_len: usize,
    expect: &Expect,
) -> Result<SlotHeader, VerifyError> {
    let h = SlotHeader::decode(header)?;
    if h.seq & 1 == 1 {
        return Err(VerifyError::Torn);
    }
    if h.generation != expect.generation {
        return Err(VerifyError::Stale);
    }
    if h.key != expect.key {
        return Err(VerifyError::WrongKey);
    }
    if h.layout != expect.layout {
        return Err(VerifyError::Layout);
    }
    if h.payload_len != expect.len
        || payload_len != expect.len as usize
        || h.valid_len > h.payload_len
    {
        return Err(VerifyError::WrongLength);
    }
    Ok(h)
}

/// Verifies a header and payload fetched together (by a remote reader, or a local unleased
/// copy): seq even, same generation, key and length, payload matching its checksum.
pub fn verify(
    header: &[u8; HEADER_LEN],
    payload: &[u8],
    expect: &Expect,
) -> Result<SlotHeader, VerifyError> {
    let h = check_header(header, payload.len(), expect)?;
    if checksum(payload) != h.checksum {
        return Err(VerifyError::Checksum);
    }
    Ok(h)
}

/// Verifies a payload that arrived scattered over several segments (K and V, layers).
pub fn verify_segments(
    header: &[u8; HEADER_LEN],
    segments: &[&[u8]],
    expect: &Expect,
) -> Result<SlotHeader, VerifyError> {
    let total: usize = segments.iter().map(|s| s.len()).sum();
    let h = check_header(header, total, expect)?;
    let mut st = twox_hash::XxHash3_64::new();
    for s in segments {
        std::hash::Hasher::write(&mut st, s);
    }
    if std::hash::Hasher::finish(&st) != h.checksum {
        return Err(VerifyError::Checksum);
    }
    Ok(h)
}

/// Verifies a page whose payload this process cannot read: device (GPU) memory the NIC wrote
/// straight into (GPUDirect RDMA). `header` was fetched with the payload and `after` is the same
/// slot's header read again once the payload had landed. The first must pass every header
/// check (seq even, generation, key, layout, length) and the second must be identical: a
/// writer bumps the seqlock word before it touches the payload and again after, and gives the
/// slot a new generation, so equal headers around the payload read mean no writer touched it.
/// The payload's checksum is not checked (the CPU never sees those bytes): integrity on the
/// wire rests on the RDMA link's own CRC, as it does for every GPUDirect reader.
pub fn verify_unseen(
    header: &[u8; HEADER_LEN],
    after: &[u8; HEADER_LEN],
    payload_len: usize,
    expect: &Expect,
) -> Result<SlotHeader, VerifyError> {
    let h = check_header(header, payload_len, expect)?;
    if header != after {
        return Err(VerifyError::Torn);
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> ([u8; HEADER_LEN], Expect) {
        let h = SlotHeader {
            seq: 4,
            flags: 0,
            generation: 77,
            key: PageKey::from_key("k"),
            payload_len: payload.len() as u32,
            valid_len: payload.len() as u32,
            checksum: checksum(payload),
            layout: Layout(0xb16),
        };
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        (
            b,
            Expect {
                key: h.key,
                generation: 77,
                len: payload.len() as u32,
                layout: Layout(0xb16),
            },
        )
    }

    #[test]
    fn checksum_is_standard_xxh3_64() {
        // Same function as every other XXH3 implementation: remote readers in any language agree.
        for len in [0usize, 1, 17, 240, 241, 1000, 131072] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            assert_eq!(
                checksum(&data),
                xxhash_rust::xxh3::xxh3_64(&data),
                "len {len}"
            );
        }
    }

    #[test]
    fn good_header_verifies_and_every_corruption_is_caught() {
        let payload = vec![5u8; 1000];
        let (b, e) = sample(&payload);
        assert!(verify(&b, &payload, &e).is_ok());
        let split = [&payload[..300], &payload[300..]];
        assert!(verify_segments(&b, &split, &e).is_ok());

        let mut torn = b;
        torn[0] = 5;
        assert_eq!(verify(&torn, &payload, &e), Err(VerifyError::Torn));
        assert_eq!(
            verify(
                &b,
                &payload,
                &Expect {
                    generation: 78,
                    ..e
                }
            ),
            Err(VerifyError::Stale)
        );
        assert_eq!(
            verify(
                &b,
                &payload,
                &Expect {
                    key: PageKey(1),
                    ..e
                }
            ),
            Err(VerifyError::WrongKey)
        );
        assert_eq!(
            verify(&b, &payload[..999], &e),
            Err(VerifyError::WrongLength)
        );
        let mut bad = payload.clone();
        bad[500] ^= 1;
        assert_eq!(verify(&b, &bad, &e), Err(VerifyError::Checksum));
        let mut magic = b;
        magic[8] = 0;
        assert_eq!(verify(&magic, &payload, &e), Err(VerifyError::BadHeader));
        // A header claiming more valid bytes than its payload holds is refused: the valid
        // length a reader hands back comes from a verified header, so it must be sound.
        let mut long = b;
        long[44..48].copy_from_slice(&1001u32.to_le_bytes());
        assert_eq!(verify(&long, &payload, &e), Err(VerifyError::WrongLength));
    }

    #[test]
    fn a_page_of_another_layout_or_of_none_is_refused_though_its_bytes_are_sound() {
        let payload = vec![9u8; 512];
        let (b, e) = sample(&payload);
        let fp8 = Expect {
            layout: Layout(0xf8),
            ..e
        };
        assert_eq!(verify(&b, &payload, &fp8), Err(VerifyError::Layout));
        assert_eq!(
            verify_segments(&b, &[&payload[..100], &payload[100..]], &fp8),
            Err(VerifyError::Layout)
        );
        // A page from before layouts existed: the reserved word was zero.
        let mut old = b;
        old[56..64].fill(0);
        assert_eq!(verify(&old, &payload, &e), Err(VerifyError::Layout));
        assert_eq!(
            SlotHeader::decode(&old).unwrap().layout,
            Layout::NONE,
            "old pages decode, with no layout"
        );
        assert_eq!(SlotHeader::decode(&b).unwrap().layout, Layout(0xb16));
        assert_eq!(VerifyError::Layout.label(), "layout");
    }

    #[test]
    fn an_unseen_payload_is_served_only_between_two_equal_sound_headers() {
        let payload = vec![7u8; 256];
        let (h, expect) = sample(&payload);
        assert!(verify_unseen(&h, &h, payload.len(), &expect).is_ok());
        // A writer moved the seqlock word (or reused the slot) between the two reads.
        let mut after = h;
        after[0] ^= 2;
        assert_eq!(
            verify_unseen(&h, &after, payload.len(), &expect).unwrap_err(),
            VerifyError::Torn
        );
        // The first header itself must be sound: a wrong generation is stale, whatever follows.
        let stale = Expect {
            generation: 78,
            ..expect
        };
        assert_eq!(
            verify_unseen(&h, &h, payload.len(), &stale).unwrap_err(),
            VerifyError::Stale
        );
        assert_eq!(
            verify_unseen(&h, &h, payload.len() - 1, &expect).unwrap_err(),
            VerifyError::WrongLength
        );
    }
}

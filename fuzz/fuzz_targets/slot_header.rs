//! Any bytes as a fetched slot (64-byte header + payload): decoding and verification return a
//! typed verdict; nothing is accepted unless it really matches, including the reader's layout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_pool::header::{self, Expect, HEADER_LEN, SlotHeader};
use peercache_wire::PageKey;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let (h, payload) = data.split_at(HEADER_LEN);
    let h: &[u8; HEADER_LEN] = h.try_into().expect("64 bytes");
    if let Ok(d) = SlotHeader::decode(h) {
        let expect = Expect {
            key: d.key,
            generation: d.generation,
            len: payload.len() as u32,
            layout: d.layout,
        };
        if header::verify(h, payload, &expect).is_ok() {
            assert_eq!(header::checksum(payload), d.checksum);
            assert_eq!(d.seq & 1, 0);
        }
        let wrong = Expect {
            key: PageKey(d.key.0 ^ 1),
            ..expect
        };
        assert!(header::verify(h, payload, &wrong).is_err());
        let other = Expect {
            layout: peercache_wire::Layout(d.layout.0 ^ 1),
            ..expect
        };
        assert!(header::verify(h, payload, &other).is_err());
    }
});

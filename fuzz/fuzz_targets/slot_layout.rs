//! Any bytes as a member's announced slotmap layout: decoding returns a layout within the
//! reader's bounds or a typed error — no panic, no overflow, nothing a reader would size by an
//! unchecked field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_store::layout::slot::{MAX_REGION_BYTES, MAX_WAYS, decode_layout};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((_region, base, g)) = decode_layout(s) {
        assert!(g.ways >= 1 && g.ways <= MAX_WAYS);
        assert!(g.buckets >= 1);
        assert!(g.header_block() <= u64::from(MAX_WAYS) * 64);
        let len = g.region_len();
        assert!(len <= MAX_REGION_BYTES);
        assert!(base.checked_add(len).is_some());
        // Every bucket's offsets stay inside the region.
        let last = g.buckets - 1;
        assert!(g.payload_offset(last, g.ways - 1) + g.payload_stride <= len);
    }
});

//! Any bytes as a remote bucket read in slotmap mode: a header block, then a payload and the
//! way's header read again. Decoding never panics, and nothing is accepted unless the header is
//! ours, unchanged across the payload read, even, for the key and length, and the checksum
//! matches the payload; a reader of another layout accepts nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_pool::slotmap::{HEADER, SlotHeader, accept, find_way};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 * HEADER {
        return;
    }
    let ways = (data[0] as usize % 8).max(1);
    let block_len = (ways * HEADER).min(data.len() - HEADER);
    let (block, rest) = data.split_at(block_len);
    let (after, payload) = rest.split_at(HEADER.min(rest.len()));
    for h in block.chunks_exact(HEADER) {
        let _ = SlotHeader::decode(h);
    }
    let Some(first) = block.chunks_exact(HEADER).find_map(SlotHeader::decode) else {
        return;
    };
    if let Some((_, before)) = find_way(block, first.key, Some(payload.len() as u32)) {
        let other = peercache_wire::Layout(before.layout.0 ^ 1);
        assert!(accept(&before, payload, after, first.key, payload.len() as u32, other).is_err());
        if accept(&before, payload, after, first.key, payload.len() as u32, before.layout).is_ok() {
            assert_eq!(before.seq & 1, 0);
            assert_eq!(peercache_pool::header::checksum(payload), before.checksum);
            let a = SlotHeader::decode(after).expect("accepted after-header decodes");
            assert_eq!((a.seq, a.key, a.len), (before.seq, first.key, payload.len() as u32));
        }
    }
});

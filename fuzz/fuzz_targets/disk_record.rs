//! Any bytes as a disk record: the header decodes or is refused, and a payload is accepted only
//! when it matches the header's length and checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_pool::disk::RecordHeader;
use peercache_pool::disk::record::RECORD_HEADER;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = RecordHeader::decode(data) else {
        return;
    };
    assert!(h.valid_len <= h.len);
    let payload = &data[RECORD_HEADER.min(data.len())..];
    if h.verify_payload(payload).is_ok() {
        assert_eq!(payload.len(), h.len as usize);
        assert_eq!(peercache_pool::header::checksum(payload), h.checksum);
    }
});

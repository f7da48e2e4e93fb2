//! Any bytes as a data-plane request: header and op descriptors decode and every op is checked
//! against a region table (bounds with overflow, key, access, length) without panicking; the
//! same bytes go through the host-local decoders (invitation, region table).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peercache_transport::fuzz_request(data);
});

//! Any bytes as a length-delimited stream: frames are read up to a 64 KiB limit; an oversize
//! length must be refused before any buffer is sized from it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut buf = Vec::new();
    for _ in 0..64 {
        if peercache_wire::frame::read_frame(&mut r, 64 << 10, &mut buf).is_err() {
            break;
        }
        assert!(buf.len() <= 64 << 10);
    }
});

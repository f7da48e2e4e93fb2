//! Any bytes as a store control request or reply (promote, prepare, commit, abort, ingest,
//! slot write) or a client-API request or reply (put, get, exists): decoding returns a value or
//! a typed error — no panic, no allocation sized by an unchecked length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_store::client::{ClientReply, ClientRequest};
use peercache_store::control::{StoreReply, StoreRequest};
use peercache_wire::Envelope;

fuzz_target!(|data: &[u8]| {
    let Ok(env) = Envelope::parse(data) else {
        return;
    };
    let _ = env.decode::<StoreRequest>();
    let _ = env.decode::<StoreReply>();
    let _ = env.decode::<ClientRequest>();
    let _ = env.decode::<ClientReply>();
});

//! Any bytes as a control-plane frame: parse the envelope, walk its extensions, decode it as
//! every message type. Must never panic, hang or allocate by an unchecked length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use peercache_wire::Envelope;

fuzz_target!(|data: &[u8]| {
    let Ok(env) = Envelope::parse(data) else {
        return;
    };
    for ext in env.extensions() {
        if ext.is_err() {
            break;
        }
    }
    let _ = env.check_extensions(&[]);
    let _ = env.decode::<peercache_wire::handshake::Hello>();
    let _ = env.decode::<peercache_wire::handshake::HelloReply>();
    let _ = env.decode::<peercache_wire::handshake::AuthChallenge>();
    let _ = env.decode::<peercache_wire::handshake::AuthProof>();
    let _ = env.decode::<peercache_wire::rpc::RpcError>();
    let _ = env.decode::<peercache_wire::qp::QpInfo>();
    let _ = env.decode::<peercache_wire::qp::QpReply>();
    let _ = env.decode::<peercache_wire::qp::BootstrapRequest>();
    let _ = env.decode::<peercache_wire::qp::RegionTable>();
    let _ = env.decode::<peercache_directory::DirRequest<'static>>();
    let _ = env.decode::<peercache_directory::DirReply>();
    let _ = env.decode::<peercache_discovery::DiscRequest>();
    let _ = env.decode::<peercache_discovery::DiscReply>();
});

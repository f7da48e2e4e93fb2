//! Any bytes as the frames a stranger sends during an authenticated handshake: the server's
//! state machine must answer with a typed error or a refusal — never accept, panic or hang.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use peercache_wire::handshake::{Acceptor, ClientHandshake, Hello, Plane, ServerHandshake, Step};
use peercache_wire::{Auth, Incarnation};

static ACCEPTOR: LazyLock<Acceptor> = LazyLock::new(|| Acceptor {
    planes: vec![Plane::Control, Plane::Data],
    node: None,
    incarnation: Incarnation(1),
    auth: Auth::from_secret(b"fuzzing-cluster-secret").unwrap(),
});

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| *b as usize).min(data.len());
    let (first, second) = data.split_at(split);
    let mut srv = ServerHandshake::new(&ACCEPTOR);
    if let Ok(Step::Send(_)) = srv.on_frame(first) {
        // Without the secret no second frame can be a valid proof.
        if let Ok(Step::Finish(_, r)) = srv.on_frame(second) {
            assert!(r.is_err(), "a stranger was accepted");
        }
    }
    // The client side answers a challenge with its proof (the client proves first), but must
    // never accept a server that cannot prove the secret.
    let hello = Hello::new(Plane::Control, None, Incarnation(2));
    let (mut cli, _) = ClientHandshake::new(&hello, &ACCEPTOR.auth).unwrap();
    match cli.on_frame(first) {
        Ok(Step::Finish(_, r)) => assert!(r.is_err(), "a forged acceptance was taken"),
        Ok(Step::Send(_)) => {
            if let Ok(Step::Finish(_, r)) = cli.on_frame(second) {
                assert!(r.is_err(), "a forged acceptance was taken");
            }
        }
        Err(_) => {}
    }
});

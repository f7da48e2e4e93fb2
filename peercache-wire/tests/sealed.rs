//! Encryption in transit on the RPC planes, seen from a proxy in the middle of real loopback
//! connections.

#[path = "../src/testkit/tap.rs"]
#[allow(unreachable_pub)] // the module is public API of the `testkit` feature
mod tap;

use std::time::{Duration, Instant};

mod common;

use common::Echo;
use peercache_wire::envelope;
use peercache_wire::rpc::{self, RpcClient, RpcServer};
use peercache_wire::{Auth, WireError};
use tap::{Tap, Way};

const SECRET: &[u8] = b"a cluster secret for sealed rpc";

fn server(addr: &str, auth: Auth) -> RpcServer {
    common::echo_server(addr, auth, 1 << 20, "sealed-test")
}

fn client(auth: Auth) -> RpcClient {
    common::echo_client(auth, 1 << 20)
}

/// A request whose text is recognisable in a capture.
fn marked(n: u64) -> (Vec<u8>, String) {
    let text = format!("page-bytes-that-must-not-show-{n:08}-").repeat(64);
    (envelope::encode(&Echo(n, text.clone()), &[]).unwrap(), text)
}

fn call(c: &RpcClient, at: std::net::SocketAddr, n: u64) -> Result<Echo, WireError> {
    let (req, _) = marked(n);
    let reply = c.call(at, &req, Duration::from_secs(2))?;
    rpc::decode_reply::<Echo>(&reply)
}

#[test]
fn a_sealed_rpc_shows_no_plaintext_on_the_path_and_an_open_one_does() {
    let auth = Auth::from_secret(SECRET).unwrap();
    let sealed = server("127.0.0.61:0", auth.requiring_encryption(true));
    let tap = Tap::start("127.0.0.61:0", sealed.local_addr());
    // The client only offers sealing; the server requires it.
    let c = client(auth.clone());
    for n in 0..3 {
        let got = call(&c, tap.addr(), n).unwrap();
        assert_eq!(got, Echo(n + 1, marked(n).1));
    }
    let seen = tap.seen();
    assert!(
        seen.len() > 3 * 2 * 2000,
        "the tap relayed {} bytes",
        seen.len()
    );
    assert!(!tap::contains(&seen, b"page-bytes-that-must-not-show"));

    // The control: neither side requires it, the same text is in the clear.
    let open = server("127.0.0.62:0", auth.clone());
    let open_tap = Tap::start("127.0.0.62:0", open.local_addr());
    call(&c, open_tap.addr(), 7).unwrap();
    assert!(tap::contains(
        &open_tap.seen(),
        b"page-bytes-that-must-not-show"
    ));
}

#[test]
fn a_byte_changed_on_the_path_is_refused_in_either_direction() {
    let auth = Auth::from_secret(SECRET).unwrap();
    let sealed = server("127.0.0.63:0", auth.requiring_encryption(true));
    let tap = Tap::start("127.0.0.63:0", sealed.local_addr());
    let c = client(auth.clone());
    call(&c, tap.addr(), 1).unwrap();

    // A reply byte flipped: the client refuses the reply, typed; it never decodes it.
    tap.flip(Way::ToClient, 100);
    let err = call(&c, tap.addr(), 2).unwrap_err();
    assert!(matches!(err, WireError::Integrity(_)), "{err:?}");

    // A request byte flipped: the server closes that connection without answering it and
    // counts it; the client's retry on a fresh connection is answered.
    call(&c, tap.addr(), 3).unwrap();
    tap.flip(Way::ToServer, 100);
    let got = call(&c, tap.addr(), 4).unwrap();
    assert_eq!(got.0, 5);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sealed.counters().sealed_refused.get() < 1 {
        assert!(Instant::now() < deadline, "the refusal was not counted");
        std::thread::yield_now();
    }
    assert_eq!(
        sealed.counters().requests.get(),
        4,
        "the changed request was not served"
    );
}

#[test]
fn a_client_that_requires_sealing_refuses_an_open_server() {
    let open = server("127.0.0.64:0", Auth::none());
    let c = client(
        Auth::from_secret(SECRET)
            .unwrap()
            .requiring_encryption(true),
    );
    let err = call(&c, open.local_addr(), 1).unwrap_err();
    assert!(matches!(err, WireError::Integrity(_)), "{err:?}");
}

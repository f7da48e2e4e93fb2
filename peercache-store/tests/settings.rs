//! Settings that bound a node's resources take effect: each is set on a real node on loopback
//! and its effect observed on real sockets.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Auth, Incarnation, envelope};
use serde_json::json;

mod common;

const SECRET: &str = "settings test secret, long enough";

/// Whether the server closes `s` within `within` (end of stream or reset) without it sending.
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn max_inbound_connections_refuses_the_connection_past_the_cap() {
    let port = common::free_port();
    let n = common::node(
        71,
        71,
        port,
        json!({"max_inbound_connections": 2, "cluster_secret": SECRET, "op_timeout": 3.0}),
    );
    for addr in [n.data_endpoint(), n.control_endpoint()] {
        // Two connections fill the cap (they sit in their handshake); the third is refused at
        // once, while the first two stay open.
        let mut first: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The accept loop takes connections in arrival order and counts each before the
        // next, so the third is judged against a full cap.
        let mut third = TcpStream::connect(addr).unwrap();
        let t0 = Instant::now();
        assert!(
            closed_by_server(&mut third, Duration::from_secs(2)),
            "{addr}: the connection past the cap was not refused"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "{addr}: refused only after {:?}",
            t0.elapsed()
        );
        for s in &mut first {
            assert!(
                !closed_by_server(s, Duration::from_millis(200)),
                "{addr}: a connection inside the cap was closed"
            );
        }
    }
    n.shutdown();
}

#[test]
fn max_frame_bytes_refuses_a_larger_control_frame() {
    let port = common::free_port();
    let n = common::node(
        72,
        72,
        port,
        json!({"max_frame_bytes": "64kb", "cluster_secret": SECRET}),
    );
    let c = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(5)),
        max_idle_per_peer: 1,
        max_frame: 1 << 20,
        auth: Auth::from_secret(SECRET.as_bytes()).unwrap(),
    });
    // A directory lookup of 8 keys fits; one of 8,000 keys (~130 KB) exceeds 64 KiB.
    let small: Vec<peercache_wire::PageKey> = (0..8)
        .map(|i| peercache_wire::PageKey::from_key(&format!("k{i}")))
        .collect();
    let big: Vec<peercache_wire::PageKey> = (0..8000)
        .map(|i| peercache_wire::PageKey::from_key(&format!("k{i}")))
        .collect();
    let lookup = |keys: &[peercache_wire::PageKey]| {
        let req = peercache_directory::DirRequest::Lookup(keys.into());
        envelope::encode(&req, &[]).unwrap()
    };
    let ok = c.call(
        n.control_endpoint(),
        &lookup(&small),
        Duration::from_secs(5),
    );
    assert!(ok.is_ok(), "{ok:?}");
    let big_req = lookup(&big);
    assert!(big_req.len() > 64 << 10, "{} bytes", big_req.len());
    let refused = c.call(n.control_endpoint(), &big_req, Duration::from_secs(5));
    assert!(refused.is_err(), "a frame over max_frame_bytes was served");
    n.shutdown();
}

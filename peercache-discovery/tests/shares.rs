//! The meta port's share per source address: past it a connection is closed at accept and
//! counted, the connections held go on, and the address is served again once one ends.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use peercache_discovery::{DiscReply, DiscRequest, DiscoveryServer};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::shares::SourceShare;
use peercache_wire::{Auth, Incarnation, envelope};

const SECRET: &[u8] = b"discovery-shares-test-secret";

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True once the server closed `s` (end of stream or a reset), within `within`.
fn closed(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn members_answered(at: SocketAddr) -> bool {
    let tool = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Discovery, None, Incarnation(5)),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth: Auth::from_secret(SECRET).unwrap(),
    });
    let f = envelope::encode(&DiscRequest::Members, &[]).unwrap();
    matches!(
        tool.call(at, &f, Duration::from_secs(3))
            .and_then(|r| rpc::decode_reply::<DiscReply>(&r)),
        Ok(DiscReply::Members { .. })
    )
}

#[test]
fn a_source_past_its_share_of_the_meta_port_is_refused_at_accept_and_served_once_one_ends() {
    let mut shares = DiscoveryServer::default_shares();
    shares.per_source = Some(SourceShare::new(2));
    let srv = DiscoveryServer::start_with(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(30),
        None,
        Auth::from_secret(SECRET).unwrap(),
        shares,
    )
    .unwrap();
    let at = srv.local_addr();
    // Two silent connections hold this address's share (the handshake deadline, 2 s, is far
    // longer than what follows needs).
    let mut a = TcpStream::connect(at).unwrap();
    let b = TcpStream::connect(at).unwrap();
    let mut third = TcpStream::connect(at).unwrap();
    wait_for("the refusal to be counted", || {
        srv.refused_for_source() == 1
    });
    assert!(
        closed(&mut third, Duration::from_secs(2)),
        "the third is closed"
    );
    assert!(
        !closed(&mut a, Duration::from_millis(100)),
        "the held ones stay"
    );
    // One ends: the address is served again, a real request answered.
    drop(b);
    drop(a);
    wait_for("a request from the address to be answered", || {
        members_answered(at)
    });
}

#[test]
fn the_default_meta_port_charges_large_frames_to_a_budget_and_limits_no_source() {
    let d = DiscoveryServer::default_shares();
    assert!(d.per_source.is_none());
    assert_eq!(
        d.frame_budget.map(|b| b.cap()),
        Some(peercache_discovery::META_FRAME_BUDGET)
    );
}

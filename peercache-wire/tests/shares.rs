//! The RPC server's shares over real loopback sockets: a process-wide budget for frames still
//! arriving, and a per-source share of the connection cap.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use peercache_wire::envelope::{self, Message};
use peercache_wire::handshake::{self, Hello, Plane};
use peercache_wire::rpc::{self, Reply, RpcServer, ServerConfig, Shares};
use peercache_wire::shares::{FrameBudget, SourceShare};
use peercache_wire::{Auth, Incarnation, frame};
use serde::{Deserialize, Serialize};

const SECRET: &[u8] = b"sixteen-byte-secret!";
const DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Echo(u64, String);
impl Message for Echo {
    const KIND: u16 = 0x00e0;
    const NAME: &'static str = "Echo";
}

fn server(max_frame: usize, shares: Shares) -> RpcServer {
    let handler: rpc::Handler = Arc::new(|_peer, env| {
        let Echo(n, s) = env.decode().unwrap();
        Reply::Frame(envelope::encode(&Echo(n + 1, s.len().to_string()), &[]).unwrap())
    });
    RpcServer::start(
        ServerConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            planes: vec![Plane::Control],
            node: None,
            incarnation: Incarnation(1),
            max_frame,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 64,
            offload: &[],
            workers: 2,
            name: "test-shares",
            auth: Auth::from_secret(SECRET).unwrap(),
            shares,
        },
        handler,
    )
    .unwrap()
}

/// A socket connected to `addr` from the loopback address `from`.
fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt
        .block_on(async {
            let sock = tokio::net::TcpSocket::new_v4()?;
            sock.bind(format!("{from}:0").parse().unwrap())?;
            sock.connect(addr).await
        })
        .unwrap()
        .into_std()
        .unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.set_write_timeout(Some(DEADLINE)).unwrap();
    s
}

/// A member's connection from `from`, past the authenticated handshake.
fn member(from: &str, addr: SocketAddr) -> Result<TcpStream, peercache_wire::WireError> {
    let mut s = connect_from(from, addr);
    let hello = Hello::new(Plane::Control, None, Incarnation(2));
    handshake::client_sync(
        &mut s,
        &hello,
        &Auth::from_secret(SECRET).unwrap(),
        DEADLINE,
    )?;
    Ok(s)
}

/// One request and its reply on a member's connection.
fn echo(s: &mut TcpStream, n: u64, body: usize) -> Echo {
    frame::write_frame(
        s,
        &envelope::encode(&Echo(n, "x".repeat(body)), &[]).unwrap(),
    )
    .unwrap();
    let mut buf = Vec::new();
    frame::read_frame(s, 1 << 20, &mut buf).unwrap();
    rpc::decode_reply(&buf).unwrap()
}

/// The server closed this connection (end of stream or reset), without answering.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_frame_past_the_process_budget_closes_its_connection_and_the_held_one_completes() {
    let budget = FrameBudget::new(6 << 20);
    let srv = server(
        4 << 20,
        Shares {
            per_source: None,
            frame_budget: Some(budget.clone()),
        },
    );
    let addr = srv.local_addr();
    // A member announces a 3 MiB request and sends a third of it: the budget holds 3 MiB.
    let mut slow = member("127.0.0.1", addr).unwrap();
    let big = envelope::encode(&Echo(1, "y".repeat(3 << 20)), &[]).unwrap();
    slow.write_all(&(big.len() as u32).to_be_bytes()).unwrap();
    slow.write_all(&big[..1 << 20]).unwrap();
    wait_for("the slow frame to be charged", || {
        budget.held() == big.len()
    });
    // Another member's 4 MiB frame does not fit in what is left: its connection is closed and
    // counted, before the server buffers it.
    let mut second = member("127.0.0.1", addr).unwrap();
    second.write_all(&(4u32 << 20).to_be_bytes()).unwrap();
    assert!(closed(&mut second), "a frame past the budget was accepted");
    assert_eq!(srv.counters().over_budget.get(), 1);
    assert_eq!(srv.counters().malformed.get(), 0);
    // Small requests never touch the budget and are served meanwhile.
    let mut small = member("127.0.0.1", addr).unwrap();
    assert_eq!(echo(&mut small, 7, 100), Echo(8, "100".into()));
    // The slow frame completes and is answered; the budget is free again.
    slow.write_all(&big[1 << 20..]).unwrap();
    let mut buf = Vec::new();
    frame::read_frame(&mut slow, 1 << 20, &mut buf).unwrap();
    assert_eq!(
        rpc::decode_reply::<Echo>(&buf).unwrap(),
        Echo(2, (3 << 20).to_string())
    );
    assert_eq!(budget.held(), 0);
    assert_eq!(
        echo(&mut small, 9, 3 << 20),
        Echo(10, (3 << 20).to_string())
    );
    // A member that announces a large frame and goes away gives its share back.
    let mut gone = member("127.0.0.1", addr).unwrap();
    gone.write_all(&(4u32 << 20).to_be_bytes()).unwrap();
    wait_for("the abandoned frame to be charged", || {
        budget.held() == 4 << 20
    });
    drop(gone);
    wait_for("the abandoned frame's share to come back", || {
        budget.held() == 0
    });
}

#[test]
fn a_source_at_its_share_is_refused_at_accept_and_other_sources_are_served() {
    let srv = server(
        1 << 20,
        Shares {
            per_source: Some(SourceShare::new(2)),
            frame_budget: None,
        },
    );
    let addr = srv.local_addr();
    let mut a = member("127.0.0.1", addr).unwrap();
    let b = member("127.0.0.1", addr).unwrap();
    // A third connection from the same address is closed before its handshake.
    assert!(member("127.0.0.1", addr).is_err());
    wait_for("the refusal to be counted", || {
        srv.counters().refused_source.get() == 1
    });
    assert_eq!(srv.counters().refused_at_limit.get(), 0);
    // Another source address is served, and so are the two held connections.
    let mut other = member("127.0.0.2", addr).unwrap();
    assert_eq!(echo(&mut other, 1, 10), Echo(2, "10".into()));
    assert_eq!(echo(&mut a, 3, 10), Echo(4, "10".into()));
    // When one of the two ends, the source may connect again.
    drop(b);
    wait_for("the freed slot to admit a new connection", || {
        member("127.0.0.1", addr).is_ok()
    });
}

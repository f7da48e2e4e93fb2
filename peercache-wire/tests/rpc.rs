//! The shared RPC server and client over real loopback sockets.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peercache_wire::envelope;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{
    self, ClientConfig, Reply, RpcClient, RpcError, RpcServer, ServerConfig,
};
use peercache_wire::{Incarnation, WireError};

mod common;
use common::Echo;

fn server(addr: &str) -> RpcServer {
    common::echo_server(addr, peercache_wire::Auth::none(), 1 << 16, "test-rpc")
}

fn client() -> RpcClient {
    common::echo_client(peercache_wire::Auth::none(), 1 << 16)
}

#[test]
fn call_and_fan_out_across_three_servers() {
    let servers: Vec<_> = ["127.0.0.2:0", "127.0.0.3:0", "127.0.0.4:0"]
        .iter()
        .map(|a| server(a))
        .collect();
    let c = client();
    let reqs: Vec<Vec<u8>> = (0..3)
        .map(|i| envelope::encode(&Echo(i, format!("s{i}")), &[]).unwrap())
        .collect();
    let calls: Vec<(SocketAddr, &[u8])> = servers
        .iter()
        .zip(&reqs)
        .map(|(s, r)| (s.local_addr(), r.as_slice()))
        .collect();
    for _ in 0..3 {
        let replies = c.call_many(&calls, Duration::from_secs(2));
        for (i, r) in replies.into_iter().enumerate() {
            let e: Echo = rpc::decode_reply(&r.unwrap()).unwrap();
            assert_eq!(e, Echo(i as u64 + 1, format!("s{i}")));
        }
    }
    assert_eq!(servers[0].counters().requests.get(), 3);
}

#[test]
fn malformed_request_gets_an_error_and_only_that_connection_closes() {
    let s = server("127.0.0.1:0");
    let c = client();
    let bad = envelope::encode(
        &RpcError {
            code: 0,
            message: "x".into(),
        },
        &[],
    )
    .unwrap();
    let r = c
        .call(s.local_addr(), &bad, Duration::from_secs(2))
        .unwrap();
    let err = rpc::decode_reply::<Echo>(&r).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Remote {
                code: rpc::RpcError::CODE_MALFORMED,
                ..
            }
        ),
        "{err:?}"
    );
    // Garbage that is not even an envelope.
    let r = c
        .call(s.local_addr(), b"garbage!", Duration::from_secs(2))
        .unwrap();
    assert!(rpc::decode_reply::<Echo>(&r).is_err());
    // The server still serves.
    let ok = c
        .call(
            s.local_addr(),
            &envelope::encode(&Echo(1, "a".into()), &[]).unwrap(),
            Duration::from_secs(2),
        )
        .unwrap();
    assert_eq!(rpc::decode_reply::<Echo>(&ok).unwrap(), Echo(2, "a".into()));
    assert_eq!(s.counters().malformed.get(), 2);
}

#[test]
fn oversize_frame_closes_the_connection_without_allocating() {
    let s = server("127.0.0.1:0");
    let mut raw = std::net::TcpStream::connect(s.local_addr()).unwrap();
    peercache_wire::handshake::client_sync(
        &mut raw,
        &Hello::new(Plane::Control, None, Incarnation(3)),
        &peercache_wire::Auth::none(),
        Duration::from_secs(2),
    )
    .unwrap();
    raw.write_all(&[0x7f, 0xff, 0xff, 0xff]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 8];
    let n = std::io::Read::read(&mut raw, &mut buf).unwrap_or(0);
    assert_eq!(
        n, 0,
        "server must close a connection that announces an oversize frame"
    );
}

#[test]
fn silent_peer_times_out_within_the_deadline() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = client();
    let t0 = Instant::now();
    let err = c
        .call(
            l.local_addr().unwrap(),
            &envelope::encode(&Echo(1, String::new()), &[]).unwrap(),
            Duration::from_millis(300),
        )
        .unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
    assert!(took < Duration::from_millis(600), "{took:?}");
}

#[test]
fn wrong_plane_is_refused_in_the_handshake() {
    let s = server("127.0.0.1:0");
    let c = RpcClient::new(ClientConfig {
        hello: Hello::new(Plane::Discovery, None, Incarnation(2)),
        max_idle_per_peer: 1,
        max_frame: 1 << 16,
        auth: peercache_wire::Auth::none(),
    });
    let err = c
        .call(s.local_addr(), b"x", Duration::from_secs(2))
        .unwrap_err();
    assert!(matches!(err, WireError::Handshake(_)), "{err:?}");
}

#[test]
fn a_peer_that_timed_out_is_failed_fast_while_suspect() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = l.local_addr().unwrap();
    let c = client().with_suspect_for(Duration::from_secs(5));
    let req = envelope::encode(&Echo(1, String::new()), &[]).unwrap();
    let err = c.call(peer, &req, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
    let t0 = Instant::now();
    let err = c.call(peer, &req, Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, WireError::PeerSuspect { .. }), "{err:?}");
    assert!(t0.elapsed() < Duration::from_millis(20));
    // Other peers are unaffected.
    let s = server("127.0.0.1:0");
    assert!(c.call(s.local_addr(), &req, Duration::from_secs(1)).is_ok());
}

#[test]
fn a_stalled_peer_in_a_fan_out_does_not_time_out_the_others() {
    // Completes the handshake, then never answers.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let stalled = l.local_addr().unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        peercache_wire::handshake::server_sync(
            &mut s,
            &peercache_wire::handshake::Acceptor {
                planes: vec![Plane::Control],
                node: None,
                incarnation: Incarnation(1),
                auth: peercache_wire::Auth::none(),
            },
            Duration::from_secs(5),
        )
        .unwrap();
        let _ = release_rx.recv();
    });
    let good = server("127.0.0.1:0");
    let c = client().with_suspect_for(Duration::from_secs(5));
    let req = envelope::encode(&Echo(7, "x".into()), &[]).unwrap();
    let t0 = Instant::now();
    let r = c.call_many(
        &[
            (stalled, req.as_slice()),
            (good.local_addr(), req.as_slice()),
        ],
        Duration::from_millis(300),
    );
    assert!(t0.elapsed() < Duration::from_millis(600));
    assert!(matches!(r[0], Err(WireError::Timeout(_))), "{:?}", r[0]);
    let second = r[1]
        .as_ref()
        .expect("the answering peer's reply was waiting");
    assert_eq!(
        rpc::decode_reply::<Echo>(second).unwrap(),
        Echo(8, "x".into())
    );
    // Only the stalled peer is suspect.
    assert!(
        c.call(good.local_addr(), &req, Duration::from_secs(1))
            .is_ok()
    );
    assert!(matches!(
        c.call(stalled, &req, Duration::from_secs(1)),
        Err(WireError::PeerSuspect { .. })
    ));
    release_tx.send(()).unwrap();
    holder.join().unwrap();
}

/// Resident memory of this process, bytes (Linux `/proc/self/statm`).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn an_unauthenticated_large_frame_is_refused_and_never_buffered() {
    // A server whose post-authentication frame limit is large (the control port's is 64 MiB).
    let handler: rpc::Handler = Arc::new(|_, _| Reply::Frame(Vec::new()));
    let srv = RpcServer::start(
        ServerConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            planes: vec![Plane::Control],
            node: None,
            incarnation: Incarnation(1),
            max_frame: 64 << 20,
            handshake_timeout: Duration::from_secs(5),
            max_connections: 64,
            offload: &[],
            workers: 1,
            name: "test-rpc-big",
            auth: peercache_wire::Auth::from_secret(b"sixteen-byte-secret!").unwrap(),
            shares: Default::default(),
        },
        handler,
    )
    .unwrap();
    let addr = srv.local_addr();
    // Sixteen strangers at once, each announcing an 8 MiB first frame and streaming 2 MiB of it.
    let before = rss();
    let chunk = vec![0x5au8; 64 << 10];
    let strangers: Vec<std::net::TcpStream> = (0..16)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            if s.write_all(&(8u32 << 20).to_be_bytes()).is_ok() {
                for _ in 0..32 {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
            }
            s
        })
        .collect();
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 16 << 20,
        "the server buffered strangers' frames: RSS grew by {} MiB",
        grown >> 20
    );
    // Each was closed by the server (end of stream or reset), not left waiting for more.
    for mut s in strangers {
        let mut b = [0u8; 1];
        match std::io::Read::read(&mut s, &mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a stranger's connection is still open: {other:?}"),
        }
    }
    assert!(srv.counters().handshake_failures.get() >= 1);
    // The port still serves members: the frame limit after authentication is the large one.
    let c = RpcClient::new(ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(2)),
        max_idle_per_peer: 1,
        max_frame: 1 << 16,
        auth: peercache_wire::Auth::from_secret(b"sixteen-byte-secret!").unwrap(),
    });
    let big = envelope::encode(&Echo(1, "x".repeat(1 << 20)), &[]).unwrap();
    assert!(c.call(addr, &big, Duration::from_secs(5)).is_ok());
}

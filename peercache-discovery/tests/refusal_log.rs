//! A member hammering the meta port with forbidden requests cannot flood the log: every
//! refusal is counted, and the log gets one line per 10 s (with how many it held back).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peercache_discovery::{DiscReply, DiscRequest, DiscoveryServer};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Auth, envelope};

mod common;
use common::info;

const SECRET: &[u8] = b"discovery-refusal-log-secret";

/// The log, captured: every line the process writes through `tracing`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn five_hundred_forbidden_requests_are_counted_and_logged_once() {
    let log = Captured::default();
    let sink = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .init();
    let srv = DiscoveryServer::start(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(30),
        None,
        Auth::from_secret(SECRET).unwrap(),
    )
    .unwrap();
    let (a, b) = (info("node-a", 1), info("node-b", 2));
    let ca = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Discovery, Some(a.node.clone()), a.incarnation),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth: Auth::from_secret(SECRET).unwrap(),
    });
    let forged = envelope::encode(&DiscRequest::Register(b), &[]).unwrap();
    for _ in 0..500 {
        let reply = ca
            .call(srv.local_addr(), &forged, Duration::from_secs(3))
            .and_then(|f| rpc::decode_reply::<DiscReply>(&f));
        assert!(reply.is_err(), "a forged Register was accepted: {reply:?}");
    }
    assert_eq!(srv.identity_refused(), 500);
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("discovery request refused"))
        .count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} log lines for 500 refusals:\n{text}"
    );
}

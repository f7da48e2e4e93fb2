//! Helpers the store's integration tests share: loopback nodes and recognisable pages.
#![allow(dead_code)] // each test file uses a different subset

use std::net::TcpListener;
use std::time::{Duration, Instant};

use peercache_store::{PeerCacheConfig, Store};
use serde_json::json;

/// A free TCP port on loopback (for the cluster's meta port).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The cluster secret every node of this test process proves: generated once per process
/// (tests run the way a deployment should — authenticated — unless they say otherwise).
pub(crate) fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| peercache_wire::auth::generate_secret().expect("the OS random source"))
}

/// The config of a node on `host` whose seed is `seed` (both loopback addresses): TCP, every
/// listener on `host`, fast heartbeats, metrics off, 32 MiB pool, the test process's generated
/// [`secret`]; `extra` overrides any key.
pub(crate) fn config(
    host: &str,
    seed: &str,
    port: u16,
    extra: serde_json::Value,
) -> PeerCacheConfig {
    let mut m = json!({
        "discovery_addr": format!("{seed}:{port}"),
        "protocol": "tcp",
        "local_hostname": host, "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
        "global_segment_size": "32mb",
        "heartbeat_interval": 0.2, "member_ttl": 0.6, "op_timeout": 1.0,
        "metrics_enabled": false,
        "cluster_secret": secret(),
    });
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap().0
}

/// Starts a node and waits until it has joined.
pub(crate) fn start(cfg: PeerCacheConfig) -> Store {
    let s = Store::start(cfg).unwrap();
    s.wait_ready(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A node on 127.0.0.`n` seeded by 127.0.0.`seed`.
pub(crate) fn node(n: u8, seed: u8, port: u16, extra: serde_json::Value) -> Store {
    start(config(
        &format!("127.0.0.{n}"),
        &format!("127.0.0.{seed}"),
        port,
        extra,
    ))
}

/// Nodes on 127.0.0.`hosts[i]` (the first is the seed), each seeing all, rings in step.
pub(crate) fn cluster(hosts: &[u8], extra: serde_json::Value) -> Vec<Store> {
    let port = free_port();
    let nodes: Vec<Store> = hosts
        .iter()
        .map(|&n| node(n, hosts[0], port, extra.clone()))
        .collect();
    for s in &nodes {
        assert!(
            s.wait_members(hosts.len(), Duration::from_secs(10)),
            "{} sees {} members",
            s.node_id(),
            s.members().len()
        );
        s.sync_membership();
    }
    nodes
}

/// `len` pseudo-random bytes determined by `seed`.
#[allow(unused_imports)] // each test file uses a different subset
pub(crate) use peercache_wire::testkit::pattern as page;

/// Reads `keys` (one `len`-byte page each) on `s`: (hits, pages).
pub(crate) fn get(s: &Store, keys: &[String], len: usize) -> (Vec<bool>, Vec<Vec<u8>>) {
    let mut out = vec![vec![0u8; len]; keys.len()];
    let mut d: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
    let got = s.batch_get(keys, &mut d).unwrap();
    (got, out)
}

/// [`race`]'s shape: distinct keys, pages the writer publishes, 16-key reads of the reader.
pub(crate) struct Race {
    pub(crate) keys: u64,
    pub(crate) writes: u64,
    pub(crate) rounds: u64,
}

/// `w` publishes 16 KiB pages over `shape.keys` keys in batches of 16 (its small pool evicting
/// constantly) while `r` primes 16 keys with `batch_exists` and reads them after, so primed
/// locations go stale as slots are reused. Every page `r` accepts must be byte-exact (asserted
/// here); returns (accepted, missed).
pub(crate) fn race(w: &Store, r: &Store, shape: Race) -> (u64, u64) {
    let len = 16 << 10;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (w, stop) = (w.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < shape.writes {
                let keys: Vec<String> = (i..i + 16)
                    .map(|k| format!("race-{}", k % shape.keys))
                    .collect();
                let pages: Vec<Vec<u8>> = (i..i + 16).map(|k| page(k % shape.keys, len)).collect();
                let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
                w.batch_set(&keys, &refs).unwrap();
                i += 16;
            }
        })
    };
    let (mut accepted, mut missed) = (0u64, 0u64);
    for round in 0..shape.rounds {
        let keys: Vec<String> = (0..16)
            .map(|k| format!("race-{}", (round * 37 + k * 101) % shape.keys))
            .collect();
        r.batch_exists(&keys).unwrap();
        let (got, bufs) = get(r, &keys, len);
        for (k, (ok, b)) in keys.iter().zip(got.iter().zip(&bufs)) {
            if *ok {
                let id: u64 = k.trim_start_matches("race-").parse().unwrap();
                assert_eq!(b, &page(id, len), "accepted wrong bytes for {k}");
                accepted += 1;
            } else {
                missed += 1;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    (accepted, missed)
}

/// Kills the child process when dropped (a failing assertion leaves no stray node behind).
pub(crate) struct Killed(pub(crate) std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `peercache-node` process (the binary `exe`) with the command-line `flags` and a `--set`
/// for each of `sets` (`key=value`), serving the client API on `client_port`, proving the
/// cluster secret, metrics off and warnings only; killed when dropped.
pub(crate) fn node_process(exe: &str, flags: &[&str], sets: &[&str], client_port: u16) -> Killed {
    let client_port = format!("client_port={client_port}");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(flags);
    for set in sets.iter().chain(&[
        "client_enabled=true",
        client_port.as_str(),
        "metrics_enabled=false",
        "log_level=warn",
    ]) {
        cmd.args(["--set", set]);
    }
    Killed(
        cmd.env("PEERCACHE_CLUSTER_SECRET", secret())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// The body of `GET /metrics` at `addr` (one request, the connection closed after it).
pub(crate) fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the first sample of series `name` in a scrape (panics when absent).
pub(crate) fn sample_of(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// A client of the client API at `at` that proves the cluster secret, with a 5 s deadline.
pub(crate) fn client(at: std::net::SocketAddr) -> peercache_store::client::Client {
    peercache_store::client::Client::new(
        at,
        peercache_wire::Auth::from_secret(secret().as_bytes()).unwrap(),
        std::time::Duration::from_secs(5),
    )
}

/// One HTTP/1.1 request to `addr`: `method` and `path`, the `headers` given (each ending in
/// `\r\n`), then `body` (with its `Content-Length` when not empty), on a connection closed after
/// it. Returns the status code and the body. The node's HTTP port hands every client its
/// answer: even one it refuses on the length alone reads on until the body is in (within
/// bounds), so the write and the read must both succeed.
pub(crate) fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let length = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}{length}Connection: close\r\n\r\n{body}"
    )
    .expect("writing the request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the answer");
    let out = String::from_utf8_lossy(&raw);
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

/// Reads `keys` on `s` and checks that every page is served, with `pages`' bytes.
pub(crate) fn assert_reads_back<K: AsRef<str>>(s: &Store, keys: &[K], pages: &[Vec<u8>]) {
    let mut out: Vec<Vec<u8>> = pages.iter().map(|p| vec![0u8; p.len()]).collect();
    let mut dst: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
    let got = s.batch_get(keys, &mut dst).unwrap();
    assert!(got.iter().all(|&x| x), "{got:?}");
    assert_eq!(out, pages);
}

/// A batch of one op: `len` bytes at `addr` in the remote region `region`, and the start of
/// the local registration `h`.
pub(crate) fn one_op(
    region: u64,
    addr: u64,
    len: u32,
    h: &peercache_transport::RegionHandle,
) -> peercache_transport::Batch {
    let mut batch = peercache_transport::Batch::new();
    batch.push(
        peercache_transport::RemoteRange {
            region: peercache_transport::RegionKey(region),
            addr,
            len,
        },
        &[peercache_transport::Segment {
            region: h.key(),
            addr: h.addr(0),
            len,
        }],
    );
    batch
}

/// Waits until every one of `nodes` sees them all as members (10 s at most each), then has
/// each install that view as its ring.
pub(crate) fn settle(nodes: &[&Store]) {
    for s in nodes {
        assert!(s.wait_members(nodes.len(), Duration::from_secs(10)));
        s.sync_membership();
    }
}

/// Two nodes on the software RDMA fabric (127.0.0.`n`, the seed, and `n + 1`) and one that
/// speaks TCP only (`n + 2`), none reaching another through the same-host path, each with
/// `extra` settings too; settled.
pub(crate) fn soft_rdma_and_tcp(n: u8, extra: serde_json::Value) -> (Store, Store, Store) {
    let port = free_port();
    let with = |protocol: serde_json::Value| {
        let mut m = json!({"protocol": protocol, "host_local": false});
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        m
    };
    let mut rdma = with(json!("rdma"));
    rdma["rdma_backend"] = json!("soft");
    let a = node(n, n, port, rdma.clone());
    let b = node(n + 1, n, port, rdma);
    let c = node(n + 2, n, port, with(json!("tcp")));
    settle(&[&a, &b, &c]);
    (a, b, c)
}

/// Polls `cond` until it holds; fails the test naming `what` after `within`.
pub(crate) fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < until, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

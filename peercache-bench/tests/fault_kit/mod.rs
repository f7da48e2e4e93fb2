//! What the fault suite's tests share: node processes (`Proc`), the client node and its checked
//! load (`Load`), waiting on conditions, the partitioning proxy (`Proxy`) and the
//! disturb-then-heal run of one peer (`disturb_the_last_owner`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peercache_bench::cmd::serve::{key_for, page_for};
use peercache_store::{PeerCacheConfig, Store};
use serde_json::json;

/// Bytes per page.
pub(crate) const PAGE: usize = 16 << 10;
/// Pages each node publishes at start.
pub(crate) const PRELOAD: usize = 48;

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `peercache-bench serve` process.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) id: String,
    pub(crate) ip: String,
}

/// The cluster secret of this run's nodes (generated; every node and the client prove it).
pub(crate) fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| peercache_wire::auth::generate_secret().expect("the OS random source"))
}

impl Proc {
    pub(crate) fn spawn(
        ip: &str,
        seeds: &str,
        id: &str,
        preload: usize,
        extra: &[(&str, String)],
    ) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_peercache-bench"));
        cmd.arg("serve")
            .arg("--stop-on-stdin-eof")
            .arg("--discovery-addr")
            .arg(seeds)
            .arg("--host")
            .arg(ip)
            .arg("--preload")
            .arg(preload.to_string())
            .arg("--page-bytes")
            .arg(PAGE.to_string());
        let base = [
            ("node_id", id.to_string()),
            ("protocol", "tcp".into()),
            ("global_segment_size", "16mb".into()),
            ("metrics_enabled", "false".into()),
            ("op_timeout", "0.5".into()),
            ("startup_timeout", "15".into()),
            ("log_level", "error".into()),
            ("cluster_secret", secret().into()),
        ];
        for (k, v) in base.iter().chain(extra) {
            cmd.arg("--set").arg(format!("{k}={v}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning peercache-bench serve");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{id} did not get ready"));
        assert!(
            line.starts_with(&format!("READY {id} {preload}")),
            "{id}: {line:?}"
        );
        Proc {
            child,
            id: id.to_string(),
            ip: ip.to_string(),
        }
    }

    pub(crate) fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to a child process we own.
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.id);
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.signal_quiet(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    pub(crate) fn signal_quiet(&self, sig: i32) {
        // SAFETY: as in `signal`; failure (already reaped) is fine here.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

pub(crate) fn client(ip: &str, seeds: &str, extra: serde_json::Value) -> Store {
    let mut m = json!({
        "discovery_addr": seeds, "node_id": format!("client-{ip}"),
        "protocol": "tcp",
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "16mb", "metrics_enabled": false,
        "heartbeat_interval": 0.2, "member_ttl": 0.6, "op_timeout": 0.5, "suspect_for": 1.0,
        // The nodes stand in for separate hosts: a stall or a partition must reach the reads,
        // which shared memory between processes of one host would route around.
        "host_local": false,
        "cluster_secret": secret(),
    });
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    let (cfg, _) = PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap();
    let s = Store::start(cfg).unwrap();
    s.wait_ready(Some(Duration::from_secs(15))).unwrap();
    s
}

pub(crate) fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t0.elapsed()
}

/// Waits until the client's ring has every member and every owner's pages are found (the
/// nodes published before they all saw each other; hand-offs move the entries).
pub(crate) fn settle(c: &Store, members: usize, owners: &[String]) {
    wait_until("members", Duration::from_secs(15), || {
        c.members().len() == members
    });
    wait_until("every page found", Duration::from_secs(15), || {
        c.sync_membership();
        sweep(c, owners)
            .iter()
            .all(|(_, hits, _, wrong)| *hits == PRELOAD && *wrong == 0)
    });
}

pub(crate) fn is_member(s: &Store, id: &str) -> bool {
    s.members().iter().any(|m| m.node.as_str() == id)
}

/// Reads every key once; returns (hits, misses, wrong bytes) per owner id.
pub(crate) fn sweep(s: &Store, owners: &[String]) -> Vec<(String, usize, usize, usize)> {
    owners
        .iter()
        .map(|o| {
            let keys: Vec<String> = (0..PRELOAD).map(|i| key_for(o, i)).collect();
            let mut out = vec![vec![0u8; PAGE]; keys.len()];
            let mut d: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
            let got = s.batch_get(&keys, &mut d).unwrap();
            let mut hits = 0;
            let mut wrong = 0;
            for ((k, g), p) in keys.iter().zip(&got).zip(&out) {
                if *g {
                    hits += 1;
                    if *p != page_for(k, PAGE) {
                        wrong += 1;
                    }
                }
            }
            (o.clone(), hits, keys.len() - hits, wrong)
        })
        .collect()
}

/// A steady load from the client: exists + get over every owner's keys (bytes checked), and a
/// set of the client's own pages, in a loop on its own thread.
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) calls: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) max_us: AtomicU64,
    pub(crate) wrong: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    /// Misses of pages whose owner is not among `expected_down`.
    pub(crate) unexpected_misses: AtomicU64,
    pub(crate) expected_down: Mutex<Vec<String>>,
    pub(crate) stop: AtomicBool,
}

impl Load {
    pub(crate) fn record(&self, t0: Instant, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.max_us
            .fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    pub(crate) fn reset_max(&self) -> Duration {
        Duration::from_micros(self.max_us.swap(0, Ordering::Relaxed))
    }

    pub(crate) fn run(
        self: Arc<Self>,
        s: Store,
        owners: Vec<String>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let mut round = 0usize;
            while !self.stop.load(Ordering::Relaxed) {
                let o = &owners[round % owners.len()];
                let start = (round * 7) % (PRELOAD - 8);
                let keys: Vec<String> = (start..start + 8).map(|i| key_for(o, i)).collect();
                let t0 = Instant::now();
                let ok = s.batch_exists(&keys).is_ok();
                self.record(t0, ok);
                let mut out = vec![vec![0u8; PAGE]; keys.len()];
                let mut d: Vec<&mut [u8]> = out.iter_mut().map(|p| p.as_mut_slice()).collect();
                let t0 = Instant::now();
                let got = s.batch_get(&keys, &mut d);
                self.record(t0, got.is_ok());
                let down = self.expected_down.lock().contains(o);
                for ((k, g), p) in keys.iter().zip(got.unwrap_or_default()).zip(&out) {
                    if g {
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        if *p != page_for(k, PAGE) {
                            self.wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    } else {
                        self.misses.fetch_add(1, Ordering::Relaxed);
                        if !down {
                            self.unexpected_misses.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                if round.is_multiple_of(4) {
                    let k = format!("client-own/{round}");
                    let p = page_for(&k, PAGE);
                    let t0 = Instant::now();
                    let ok = s.batch_set(&[k], &[p.as_slice()]).is_ok();
                    self.record(t0, ok);
                }
                round += 1;
            }
        })
    }

    pub(crate) fn summary(&self) -> serde_json::Value {
        json!({
            "calls": self.calls.load(Ordering::Relaxed),
            "calls_failed": self.failed.load(Ordering::Relaxed),
            "page_hits": self.hits.load(Ordering::Relaxed),
            "page_misses": self.misses.load(Ordering::Relaxed),
            "unexpected_misses": self.unexpected_misses.load(Ordering::Relaxed),
            "wrong_bytes_pages": self.wrong.load(Ordering::Relaxed),
        })
    }
}

pub(crate) fn report(name: &str, v: serde_json::Value) {
    println!("FAULT-RESULT {}", json!({"scenario": name, "result": v}));
}

/// A TCP proxy that can partition: while partitioned it accepts and reads but forwards
/// nothing (the far side sees silence); healing closes the silenced connections.
pub(crate) struct Proxy {
    pub(crate) partitioned: Arc<AtomicBool>,
    pub(crate) epoch: Arc<AtomicU64>,
}

impl Proxy {
    pub(crate) fn start(listen: &str, target_ip: &str, ports: &[u16]) -> Proxy {
        let partitioned = Arc::new(AtomicBool::new(false));
        let epoch = Arc::new(AtomicU64::new(0));
        for &port in ports {
            let l = TcpListener::bind(format!("{listen}:{port}")).unwrap();
            let target: SocketAddr = format!("{target_ip}:{port}").parse().unwrap();
            let (p, e) = (partitioned.clone(), epoch.clone());
            std::thread::spawn(move || {
                for c in l.incoming() {
                    let Ok(c) = c else { continue };
                    let (p, e) = (p.clone(), e.clone());
                    std::thread::spawn(move || {
                        let my_epoch = e.load(Ordering::Acquire);
                        let Ok(up) = TcpStream::connect(target) else {
                            return;
                        };
                        let _ = c.set_nodelay(true);
                        let _ = up.set_nodelay(true);
                        let pump = |mut from: TcpStream, mut to: TcpStream| {
                            let (p, e) = (p.clone(), e.clone());
                            std::thread::spawn(move || {
                                let mut buf = vec![0u8; 64 << 10];
                                let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
                                loop {
                                    if e.load(Ordering::Acquire) != my_epoch {
                                        break;
                                    }
                                    match from.read(&mut buf) {
                                        Ok(0) => break,
                                        Ok(n) => {
                                            if !p.load(Ordering::Acquire)
                                                && to.write_all(&buf[..n]).is_err()
                                            {
                                                break;
                                            }
                                        }
                                        Err(e)
                                            if matches!(
                                                e.kind(),
                                                std::io::ErrorKind::WouldBlock
                                                    | std::io::ErrorKind::TimedOut
                                            ) => {}
                                        Err(_) => break,
                                    }
                                }
                                let _ = from.shutdown(std::net::Shutdown::Both);
                                let _ = to.shutdown(std::net::Shutdown::Both);
                            });
                        };
                        pump(c.try_clone().unwrap(), up.try_clone().unwrap());
                        pump(up, c);
                    });
                }
            });
        }
        Proxy { partitioned, epoch }
    }

    pub(crate) fn partition(&self) {
        self.partitioned.store(true, Ordering::Release);
    }

    pub(crate) fn heal(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.partitioned.store(false, Ordering::Release);
    }
}

pub(crate) fn disk_args(dir: &std::path::Path, id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("disk_enabled", "true".into()),
        ("disk_path", dir.join(id).display().to_string()),
        ("disk_size", "64mb".into()),
    ]
}

/// What a disturbed peer did to the client's load: measured from the disturbance until the
/// load had made 150 more calls, and until the peer's pages were back after healing.
pub(crate) struct Disturbed {
    pub(crate) load: Arc<Load>,
    pub(crate) max_during: Duration,
    pub(crate) suspect_marks: u64,
    pub(crate) timeouts: u64,
    pub(crate) unexpected_during: u64,
    pub(crate) healed_after: Duration,
}

impl Disturbed {
    /// The load's summary with the disturbance's figures (`during` names the disturbance in
    /// the keys); checks no page was wrong, the peer was marked suspect, and no call outlasted
    /// op_timeout (500 ms) by much.
    pub(crate) fn report(&self, name: &str, during: &str) {
        let mut summary = self.load.summary();
        summary["op_timeout_ms"] = json!(500);
        summary[format!("max_call_ms_during_{during}")] =
            json!(self.max_during.as_secs_f64() * 1e3);
        summary["suspect_marks"] = json!(self.suspect_marks);
        summary["transport_timeouts"] = json!(self.timeouts);
        summary[format!("unexpected_misses_during_{during}")] = json!(self.unexpected_during);
        summary["heal_to_hits_ms"] = json!(self.healed_after.as_millis());
        report(name, summary.clone());
        assert_eq!(self.load.wrong.load(Ordering::Relaxed), 0);
        assert!(self.suspect_marks >= 1, "{summary}");
        assert!(
            self.max_during <= Duration::from_millis(1200),
            "a call took {:?} with op_timeout 500 ms",
            self.max_during
        );
    }
}

/// Runs the client's load against `owners` through `c`, disturbs the last owner (`disturb`),
/// checks every other owner keeps serving (and, with `serves_nothing`, that the disturbed one
/// serves nothing meanwhile), heals it (`heal`) and waits until its pages are back.
pub(crate) fn disturb_the_last_owner(
    c: &Store,
    owners: &[String],
    disturb: impl FnOnce(),
    heal: impl FnOnce(),
    serves_nothing: bool,
) -> Disturbed {
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.to_vec());
    wait_until("load running", Duration::from_secs(5), || {
        load.calls.load(Ordering::Relaxed) > 20
    });
    let last = owners.len() - 1;
    let cut = owners[last].clone();
    load.expected_down.lock().push(cut.clone());
    let marks = |v: &serde_json::Value| v["transport"]["suspect_marks"].as_u64().unwrap_or(0);
    let suspect0 = marks(&c.cluster_view());
    let _ = load.reset_max();
    disturb();
    let calls0 = load.calls.load(Ordering::Relaxed);
    wait_until("load while disturbed", Duration::from_secs(20), || {
        load.calls.load(Ordering::Relaxed) > calls0 + 150
    });
    let max_during = load.reset_max();
    let view = c.cluster_view();
    // The rest keeps serving while the peer is still disturbed.
    for (o, hits, misses, wrong) in sweep(c, owners) {
        assert_eq!(wrong, 0);
        if o != cut {
            assert_eq!(misses, 0, "{o} while {cut} is disturbed");
        } else if serves_nothing {
            assert_eq!(hits, 0, "{cut} served while disturbed");
        }
    }
    let unexpected_during = load.unexpected_misses.load(Ordering::Relaxed);
    heal();
    let healed_after = wait_until("disturbed pages back", Duration::from_secs(15), || {
        sweep(c, &owners[last..])[0].1 == PRELOAD
    });
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    Disturbed {
        load,
        max_during,
        suspect_marks: marks(&view) - suspect0,
        timeouts: view["transport"]["timeouts"].as_u64().unwrap_or(0),
        unexpected_during,
        healed_after,
    }
}

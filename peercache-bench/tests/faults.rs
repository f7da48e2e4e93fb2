//! The fault suite: real `peercache-bench serve` node processes on loopback (each on its own
//! 127.0.0.N), a client node in this process running a steady exists/get/set load with every
//! byte checked, and faults injected from outside — `kill -9`, `SIGSTOP`, a partitioning proxy,
//! discovery masters killed one by one.
//!
//! These tests take tens of seconds each, so they are `#[ignore]`d in the plain test run and run
//! by the labelled `faults` stage of `.ci/run`:
//! `cargo test --release -p peercache-bench --test faults -- --ignored --test-threads 1`.
//! Each prints one `FAULT-RESULT {json}` line with its numbers (docs/reliability.md).

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

const PAGE: usize = 16 << 10;
const PRELOAD: usize = 48;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `peercache-bench serve` process.
struct Proc {
    child: Child,
    id: String,
    ip: String,
}

/// The cluster secret of this run's nodes (generated; every node and the client prove it).
fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| peercache_wire::auth::generate_secret().expect("the OS random source"))
}

impl Proc {
    fn spawn(ip: &str, seeds: &str, id: &str, preload: usize, extra: &[(&str, String)]) -> Proc {
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

    fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to a child process we own.
        let r = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.id);
    }

    fn kill9(&mut self) {
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
    fn signal_quiet(&self, sig: i32) {
        // SAFETY: as in `signal`; failure (already reaped) is fine here.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

fn client(ip: &str, seeds: &str, extra: serde_json::Value) -> Store {
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

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t0.elapsed()
}

/// Waits until the client's ring has every member and every owner's pages are found (the
/// nodes published before they all saw each other; hand-offs move the entries).
fn settle(c: &Store, members: usize, owners: &[String]) {
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

fn is_member(s: &Store, id: &str) -> bool {
    s.members().iter().any(|m| m.node.as_str() == id)
}

/// Reads every key once; returns (hits, misses, wrong bytes) per owner id.
fn sweep(s: &Store, owners: &[String]) -> Vec<(String, usize, usize, usize)> {
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
struct Load {
    calls: AtomicU64,
    failed: AtomicU64,
    max_us: AtomicU64,
    wrong: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    /// Misses of pages whose owner is not among `expected_down`.
    unexpected_misses: AtomicU64,
    expected_down: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Load {
    fn record(&self, t0: Instant, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.max_us
            .fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    fn reset_max(&self) -> Duration {
        Duration::from_micros(self.max_us.swap(0, Ordering::Relaxed))
    }

    fn run(self: Arc<Self>, s: Store, owners: Vec<String>) -> std::thread::JoinHandle<()> {
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

    fn summary(&self) -> serde_json::Value {
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

fn report(name: &str, v: serde_json::Value) {
    println!("FAULT-RESULT {}", json!({"scenario": name, "result": v}));
}

/// A TCP proxy that can partition: while partitioned it accepts and reads but forwards
/// nothing (the far side sees silence); healing closes the silenced connections.
struct Proxy {
    partitioned: Arc<AtomicBool>,
    epoch: Arc<AtomicU64>,
}

impl Proxy {
    fn start(listen: &str, target_ip: &str, ports: &[u16]) -> Proxy {
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

    fn partition(&self) {
        self.partitioned.store(true, Ordering::Release);
    }

    fn heal(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.partitioned.store(false, Ordering::Release);
    }
}

fn disk_args(dir: &std::path::Path, id: &str) -> Vec<(&'static str, String)> {
    vec![
        ("disk_enabled", "true".into()),
        ("disk_path", dir.join(id).display().to_string()),
        ("disk_size", "64mb".into()),
    ]
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn kill_nine_one_of_five_then_restart_it() {
    let port = free_port();
    let seeds = format!("127.0.0.71:{port},127.0.0.72:{port},127.0.0.73:{port}");
    let disk = tempfile::tempdir().unwrap();
    let fast = [
        ("heartbeat_interval", "0.2".to_string()),
        ("member_ttl", "0.6".into()),
    ];
    let mut procs: Vec<Proc> = (1..=5)
        .map(|n| {
            let id = format!("kill-node-{n}");
            let mut extra: Vec<(&str, String)> = fast.to_vec();
            extra.extend(disk_args(disk.path(), &id));
            Proc::spawn(&format!("127.0.0.7{n}"), &seeds, &id, PRELOAD, &extra)
        })
        .collect();
    let c = client("127.0.0.76", &seeds, json!({}));
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 6, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    wait_until("load running", Duration::from_secs(5), || {
        load.calls.load(Ordering::Relaxed) > 20
    });

    // kill -9 the fourth node (not a discovery master).
    let victim = procs[3].id.clone();
    load.expected_down.lock().push(victim.clone());
    let _ = load.reset_max();
    let killed_at = Instant::now();
    procs[3].kill9();
    let dropped_after = wait_until("victim dropped", Duration::from_secs(10), || {
        !is_member(&c, &victim)
    });
    // Let the load run through the ring change.
    let calls0 = load.calls.load(Ordering::Relaxed);
    wait_until("load after the drop", Duration::from_secs(20), || {
        load.calls.load(Ordering::Relaxed) > calls0 + 3000
    });
    let max_during_fault = load.reset_max();
    let sweep_after = sweep(&c, &owners);
    for (o, hits, misses, wrong) in &sweep_after {
        assert_eq!(*wrong, 0, "{o}");
        if *o == victim {
            assert_eq!(*hits, 0, "the victim's pages had no other copy");
        } else {
            assert_eq!(*misses, 0, "{o}'s pages must still hit");
        }
    }

    // Restart with the same node id and disk folder: its pages come back.
    let restarted_at = Instant::now();
    let mut extra: Vec<(&str, String)> = fast.to_vec();
    extra.extend(disk_args(disk.path(), &victim));
    procs[3] = Proc::spawn("127.0.0.74", &seeds, &victim, 0, &extra);
    let back_after = wait_until("victim's pages back", Duration::from_secs(20), || {
        sweep(&c, &owners[3..4])[0].1 == PRELOAD
    });
    load.expected_down.lock().clear();
    let restart_to_hits = restarted_at.elapsed();
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let max_after = load.reset_max();
    for (o, hits, _, wrong) in sweep(&c, &owners) {
        assert_eq!((hits, wrong), (PRELOAD, 0), "{o} after the restart");
    }
    let mut summary = load.summary();
    summary["membership_drop_ms"] = json!(dropped_after.as_millis());
    summary["ttl_plus_heartbeat_ms"] = json!(800);
    summary["max_call_ms_during_fault"] = json!(max_during_fault.as_secs_f64() * 1e3);
    summary["max_call_ms_after_restart"] = json!(max_after.as_secs_f64() * 1e3);
    summary["victim_pages_back_ms"] = json!(back_after.as_millis());
    summary["restart_to_hits_ms"] = json!(restart_to_hits.as_millis());
    summary["kill_to_end_s"] = json!(killed_at.elapsed().as_secs_f64());
    report(
        "kill -9 one of five, restart with the same node_id",
        summary.clone(),
    );
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert_eq!(load.failed.load(Ordering::Relaxed), 0, "{summary}");
    assert_eq!(
        load.unexpected_misses.load(Ordering::Relaxed),
        0,
        "{summary}"
    );
    assert!(
        dropped_after <= Duration::from_millis(1000),
        "membership drop took {dropped_after:?} (TTL 600 ms + heartbeat 200 ms)"
    );
    assert!(
        max_during_fault <= Duration::from_millis(600),
        "a call took {max_during_fault:?} during the fault"
    );
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn stalled_peer_is_suspect_then_heals() {
    let port = free_port();
    let seeds = format!("127.0.0.81:{port},127.0.0.82:{port},127.0.0.83:{port}");
    // A long TTL: the stalled node stays a member, so deadlines and suspicion are what keep
    // calls fast.
    let slow = [
        ("heartbeat_interval", "0.5".to_string()),
        ("member_ttl", "10".into()),
    ];
    let procs: Vec<Proc> = (1..=4)
        .map(|n| {
            let id = format!("stall-node-{n}");
            Proc::spawn(&format!("127.0.0.8{n}"), &seeds, &id, PRELOAD, &slow)
        })
        .collect();
    let c = client(
        "127.0.0.85",
        &seeds,
        json!({"heartbeat_interval": 0.5, "member_ttl": 10.0}),
    );
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 5, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    wait_until("load running", Duration::from_secs(5), || {
        load.calls.load(Ordering::Relaxed) > 20
    });
    let stalled = procs[3].id.clone();
    load.expected_down.lock().push(stalled.clone());
    let suspect0 = c.cluster_view()["transport"]["suspect_marks"]
        .as_u64()
        .unwrap_or(0);
    let _ = load.reset_max();
    procs[3].signal(libc::SIGSTOP);
    let calls0 = load.calls.load(Ordering::Relaxed);
    wait_until("load during the stall", Duration::from_secs(20), || {
        load.calls.load(Ordering::Relaxed) > calls0 + 150
    });
    let max_during = load.reset_max();
    let view = c.cluster_view();
    let suspect_marks = view["transport"]["suspect_marks"].as_u64().unwrap_or(0) - suspect0;
    let timeouts = view["transport"]["timeouts"].as_u64().unwrap_or(0);
    // The rest keeps serving while the peer is still stalled.
    for (o, hits, misses, wrong) in sweep(&c, &owners) {
        assert_eq!(wrong, 0);
        if o != stalled {
            assert_eq!(misses, 0, "{o} while {stalled} is stalled");
        } else {
            assert_eq!(hits, 0);
        }
    }
    let unexpected_during = load.unexpected_misses.load(Ordering::Relaxed);
    procs[3].signal(libc::SIGCONT);
    let healed_after = wait_until("stalled pages back", Duration::from_secs(15), || {
        sweep(&c, &owners[3..4])[0].1 == PRELOAD
    });
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let mut summary = load.summary();
    summary["op_timeout_ms"] = json!(500);
    summary["max_call_ms_during_stall"] = json!(max_during.as_secs_f64() * 1e3);
    summary["suspect_marks"] = json!(suspect_marks);
    summary["transport_timeouts"] = json!(timeouts);
    summary["unexpected_misses_during_stall"] = json!(unexpected_during);
    summary["heal_to_hits_ms"] = json!(healed_after.as_millis());
    report("stalled peer (SIGSTOP), then SIGCONT", summary.clone());
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert!(suspect_marks >= 1, "{summary}");
    assert!(
        max_during <= Duration::from_millis(1200),
        "a call took {max_during:?} with op_timeout 500 ms"
    );
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn partitioned_peer_behind_a_proxy_then_heals() {
    let port = free_port();
    let seeds = format!("127.0.0.91:{port},127.0.0.92:{port},127.0.0.93:{port}");
    let slow = [
        ("heartbeat_interval", "0.5".to_string()),
        ("member_ttl", "10".into()),
    ];
    let mut procs: Vec<Proc> = (1..=3)
        .map(|n| {
            let id = format!("part-node-{n}");
            Proc::spawn(&format!("127.0.0.9{n}"), &seeds, &id, PRELOAD, &slow)
        })
        .collect();
    // The fourth node binds 127.0.0.94 but advertises 127.0.0.95, where the proxy listens.
    let (data_port, control_port) = (free_port(), free_port());
    let proxy = Proxy::start("127.0.0.95", "127.0.0.94", &[data_port, control_port]);
    let mut extra: Vec<(&str, String)> = slow.to_vec();
    extra.extend([
        ("local_hostname", "127.0.0.95".to_string()),
        ("rdma_port", data_port.to_string()),
        ("control_port", control_port.to_string()),
    ]);
    procs.push(Proc::spawn(
        "127.0.0.94",
        &seeds,
        "part-node-4",
        PRELOAD,
        &extra,
    ));
    assert_eq!(procs[3].ip, "127.0.0.94");
    let c = client(
        "127.0.0.96",
        &seeds,
        json!({"heartbeat_interval": 0.5, "member_ttl": 10.0}),
    );
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 5, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    wait_until("load running", Duration::from_secs(5), || {
        load.calls.load(Ordering::Relaxed) > 20
    });
    let cut = procs[3].id.clone();
    load.expected_down.lock().push(cut.clone());
    let _ = load.reset_max();
    proxy.partition();
    let calls0 = load.calls.load(Ordering::Relaxed);
    wait_until("load during the partition", Duration::from_secs(20), || {
        load.calls.load(Ordering::Relaxed) > calls0 + 150
    });
    let max_during = load.reset_max();
    let suspect_marks = c.cluster_view()["transport"]["suspect_marks"]
        .as_u64()
        .unwrap_or(0);
    let sw = sweep(&c, &owners);
    for (o, _, misses, wrong) in sw {
        assert_eq!(wrong, 0);
        if o != cut {
            assert_eq!(misses, 0, "{o} while {cut} is partitioned");
        }
    }
    let unexpected_during = load.unexpected_misses.load(Ordering::Relaxed);
    proxy.heal();
    let healed_after = wait_until("partitioned pages back", Duration::from_secs(15), || {
        sweep(&c, &owners[3..4])[0].1 == PRELOAD
    });
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let mut summary = load.summary();
    summary["max_call_ms_during_partition"] = json!(max_during.as_secs_f64() * 1e3);
    summary["suspect_marks"] = json!(suspect_marks);
    summary["unexpected_misses_during_partition"] = json!(unexpected_during);
    summary["heal_to_hits_ms"] = json!(healed_after.as_millis());
    report(
        "partitioned peer (silent proxy), then heal",
        summary.clone(),
    );
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert!(suspect_marks >= 1, "{summary}");
    assert!(
        max_during <= Duration::from_millis(1200),
        "a call took {max_during:?} with op_timeout 500 ms"
    );
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn discovery_masters_killed_one_by_one() {
    let port = free_port();
    let seeds = format!("127.0.0.101:{port},127.0.0.102:{port},127.0.0.103:{port}");
    let fast = [
        ("heartbeat_interval", "0.2".to_string()),
        ("member_ttl", "0.6".into()),
    ];
    let mut procs: Vec<Proc> = (1..=5)
        .map(|n| {
            let id = format!("master-node-{n}");
            Proc::spawn(&format!("127.0.0.10{n}"), &seeds, &id, PRELOAD, &fast)
        })
        .collect();
    let c = client("127.0.0.106", &seeds, json!({}));
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 6, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    let mut steps = Vec::new();
    for m in 0..3 {
        let id = procs[m].id.clone();
        load.expected_down.lock().push(id.clone());
        procs[m].kill9();
        let members = 6 - (m + 1);
        let converged = wait_until("survivors converge", Duration::from_secs(15), || {
            !is_member(&c, &id) && c.members().len() == members
        });
        // The cluster keeps working: survivors' pages hit, new pages are stored and found.
        let sw = sweep(&c, &owners[m + 1..]);
        for (o, hits, _, wrong) in &sw {
            assert_eq!((*hits, *wrong), (PRELOAD, 0), "{o} after killing {id}");
        }
        let k = format!("after-master-{m}");
        let p = page_for(&k, PAGE);
        assert!(c.batch_set(&[&k], &[p.as_slice()]).unwrap()[0]);
        assert_eq!(c.batch_exists(&[&k]).unwrap(), 1);
        steps
            .push(json!({"killed": id, "members": members, "converged_ms": converged.as_millis()}));
    }
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let mut summary = load.summary();
    summary["steps"] = json!(steps);
    report(
        "discovery masters (the three seeds) killed one by one",
        summary.clone(),
    );
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert_eq!(load.failed.load(Ordering::Relaxed), 0, "{summary}");
    c.shutdown();
}

//! The log lines operators of PeerCache 0.8.4 grep for, from real node processes with a short
//! heartbeat: the transport selection at start, the meta's register / re-register /
//! deregister / prune lines with the member count, a member's "registration lost" line, and
//! its heartbeat summary — at once on a change, and about every 10 s when nothing changes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// A node process on 127.0.0.`n` whose stdout and stderr go to `log`.
fn spawn(n: u8, seed: u8, port: u16, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_peercache-node"))
        .args(["--discovery-addr", &format!("127.0.0.{seed}:{port}")])
        .args(["--host", &format!("127.0.0.{n}")])
        .args(["--set", &format!("node_id=node-{n}")])
        .args(["--set", "protocol=tcp", "--set", "host_local=false"])
        .args([
            "--set",
            "global_segment_size=16mb",
            "--set",
            "metrics_enabled=false",
        ])
        .args(["--set", "heartbeat_interval=0.2", "--set", "member_ttl=1.0"])
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .env("RUST_LOG", "info")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits (at most `within`) until a line of `log` holds every one of `parts`; returns it.
fn wait_line(log: &Path, parts: &[&str], within: Duration) -> String {
    let end = Instant::now() + within;
    loop {
        if let Some(l) = lines(log)
            .into_iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
        {
            return l;
        }
        assert!(
            Instant::now() < end,
            "no line with {parts:?} in {} within {within:?}:\n{}",
            log.display(),
            lines(log).join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(c: &Child, sig: libc::c_int) {
    // SAFETY: `kill` on the pid of a child this test spawned and has not reaped yet.
    assert_eq!(unsafe { libc::kill(c.id() as libc::pid_t, sig) }, 0);
}

struct Reap(Vec<Child>);
impl Drop for Reap {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn the_lines_operators_grep_for_are_logged() {
    let dir = tempfile::tempdir().unwrap();
    let log = |n: u8| -> PathBuf { dir.path().join(format!("node-{n}.log")) };
    let port = common::free_port();
    let mut nodes = Reap(vec![spawn(61, 61, port, &log(61))]);
    wait_line(
        &log(61),
        &["member registered", "node=node-61", "members=1"],
        Duration::from_secs(20),
    );
    nodes.0.push(spawn(62, 61, port, &log(62)));
    nodes.0.push(spawn(63, 61, port, &log(63)));
    let meta = log(61);
    let long = Duration::from_secs(20);
    wait_line(&meta, &["member registered", "node=node-63"], long);

    // At start: which transport, and why.
    for n in [61, 62, 63] {
        wait_line(
            &log(n),
            &["transport selected", "transport=protocol=tcp"],
            long,
        );
    }
    // A membership change: the joining member's summary comes at once, with the count.
    wait_line(&log(63), &["discovery heartbeat", "members=3"], long);

    // A member that misses its heartbeats is pruned; when it wakes up, the meta tells it its
    // registration is gone, it says so, and registers again in the same life.
    signal(&nodes.0[2], libc::SIGSTOP);
    wait_line(&meta, &["member pruned", "node=node-63", "members=2"], long);
    signal(&nodes.0[2], libc::SIGCONT);
    wait_line(&log(63), &["registration lost at a discovery server"], long);
    wait_line(
        &meta,
        &[
            "member re-registered after its registration lapsed",
            "node=node-63",
            "members=3",
        ],
        long,
    );

    // A clean stop deregisters.
    signal(&nodes.0[1], libc::SIGTERM);
    assert!(nodes.0[1].wait().unwrap().success());
    wait_line(
        &meta,
        &["member deregistered", "node=node-62", "members=2"],
        long,
    );
    wait_line(&meta, &["discovery heartbeat", "members=2"], long);

    // Nothing changes now: the summary still comes about every 10 s. A change-driven summary
    // or two may still trail the deregistration, so look for two consecutive summaries at
    // least 5 s apart; unthrottled, one would come every heartbeat (dozens in the window).
    let count = || {
        lines(&meta)
            .iter()
            .filter(|l| l.contains("discovery heartbeat"))
            .count()
    };
    let end = Instant::now() + Duration::from_secs(30);
    let (mut seen, mut last_rise, mut rises) = (count(), Instant::now(), 0usize);
    let mut gap = Duration::ZERO;
    while gap < Duration::from_secs(5) {
        assert!(
            Instant::now() < end,
            "no two summaries 5 s apart within 30 s"
        );
        let now = count();
        if now > seen {
            if rises > 0 {
                gap = last_rise.elapsed();
            }
            rises += now - seen;
            seen = now;
            last_rise = Instant::now();
        }
        assert!(
            rises <= 6,
            "{rises} summaries while nothing changed: not throttled"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

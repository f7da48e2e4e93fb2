//! Start-up of a node process with a large pool: it joins and answers `status` at once while
//! its pool warms in the background (and says so), it stops promptly on SIGTERM while still
//! warming, and a pool larger than the host is refused at start with one line of figures.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

fn node_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_peercache-node"));
    c.env("RUST_BACKTRACE", "full").env("RUST_LOG", "warn");
    c
}

/// Waits for `child` to exit, at most `limit`; kills it and fails past that.
fn wait_exit(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_with_a_large_pool_serves_at_once_says_it_is_warming_and_stops_on_sigterm() {
    let (port, metrics) = (common::free_port(), common::free_port());
    let seed = format!("127.0.0.29:{port}");
    let t0 = Instant::now();
    // 4 GiB faulted by one thread: seconds of warming, long after the node answers.
    let mut child = node_bin()
        .args(["--host", "127.0.0.29", "--discovery-addr", &seed])
        .args([
            "--set",
            "global_segment_size=4gb",
            "--set",
            "pool_fault_threads=1",
        ])
        .args(["--set", &format!("metrics_port={metrics}")])
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // `status` answers with this member and its pool still warming.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let out = node_bin()
            .args(["status", "--discovery-addr", &seed, "--timeout", "2"])
            .env("PEERCACHE_CLUSTER_SECRET", common::secret())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() && text.starts_with("1 member") && text.contains('%') {
            break text;
        }
        assert!(Instant::now() < deadline, "no status within 20 s: {text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let answered = t0.elapsed();
    assert!(
        text.contains("(warm "),
        "the pool says it is warming: {text}"
    );
    // Stopped while warming: out within its shutdown deadline, cleanly.
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let t1 = Instant::now();
    let st = wait_exit(&mut child, Duration::from_secs(15));
    assert!(st.success(), "{st:?}");
    eprintln!(
        "answered status after {answered:?}, stopped {:?} after SIGTERM",
        t1.elapsed()
    );
}

#[test]
fn a_pool_larger_than_the_host_is_refused_at_start_with_one_line_of_figures() {
    let port = common::free_port();
    let out = node_bin()
        .args(["--host", "127.0.0.30"])
        .args(["--discovery-addr", &format!("127.0.0.30:{port}")])
        .args([
            "--set",
            "global_segment_size=64tb",
            "--set",
            "metrics_enabled=false",
        ])
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    for needle in [
        "global_segment_size",
        "MemAvailable",
        "GiB",
        "pool_allow_overcommit",
    ] {
        assert!(lines[0].contains(needle), "{needle} in {}", lines[0]);
    }
}

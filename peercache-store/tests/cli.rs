//! The node binary as a newcomer meets it: one-line errors whatever `RUST_BACKTRACE` says, a
//! bad number of seconds refused with a reason, a mistyped setting answered with the nearest
//! known key, and a one-node cluster called "1 member".

use std::process::Command;
use std::time::Duration;

use serde_json::json;

mod common;

fn node_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_peercache-node"));
    c.env("RUST_BACKTRACE", "full").env("RUST_LOG", "warn");
    c
}

#[test]
fn errors_are_one_line_with_their_cause_even_with_rust_backtrace_set() {
    for args in [
        // A bad value: a config error before anything starts.
        vec![
            "--discovery-addr",
            "127.0.0.1:1",
            "--host",
            "127.0.0.25",
            "--set",
            "global_segment_size=lots",
        ],
        // Nobody at the seed: the tool's deadline, then its cause.
        vec![
            "status",
            "--discovery-addr",
            "127.0.0.25:1",
            "--timeout",
            "1",
        ],
    ] {
        let out = node_bin().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: one error line in {err}");
        assert!(
            !err.contains("backtrace") && !err.contains("Stack"),
            "{args:?}: no backtrace in {err}"
        );
        assert!(
            lines[0].contains(": "),
            "{args:?}: a cause chain: {}",
            lines[0]
        );
    }
}

#[test]
fn a_wait_or_deadline_that_is_negative_nan_or_zero_is_refused_with_a_reason() {
    // Each would panic turning into a `Duration` (negative, NaN, overflow) or make every call
    // fail at once (a zero deadline or TTL).
    let node = env!("CARGO_BIN_EXE_peercache-node");
    let tool = |name: &'static str, option: &'static str, rest: &'static [&'static str]| {
        let mut args = vec![name, "--discovery-addr", "127.0.0.1:1", option];
        args.extend_from_slice(rest);
        args
    };
    let cases = [
        (node, tool("locate", "--timeout=-1", &["k"]), "not negative"),
        (node, tool("status", "--timeout=nan", &[]), "finite"),
        (node, tool("status", "--timeout=0", &[]), "more than zero"),
        (
            node,
            tool("drive", "--wait=1e300", &["--write-on", "x"]),
            "a year",
        ),
        (
            env!("CARGO_BIN_EXE_peercache-meta"),
            vec!["--member-ttl=inf"],
            "finite",
        ),
    ];
    for (exe, args, why) in cases {
        let out = Command::new(exe)
            .args(&args)
            .env("RUST_BACKTRACE", "full")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(lines[0].contains(why), "{args:?}: {}", lines[0]);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn a_mistyped_setting_is_answered_with_the_nearest_key() {
    // The warning comes first; then the start is refused (a documentation address, no
    // secret), so no node runs.
    let out = node_bin()
        .args([
            "--discovery-addr",
            "192.0.2.1:31998",
            "--host",
            "192.0.2.1",
            "--set",
            "directory_replica=2",
        ])
        .env_remove("PEERCACHE_CLUSTER_SECRET")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("directory_replica") && err.contains("did you mean `directory_replicas`?"),
        "{err}"
    );
}

#[test]
fn status_of_a_one_node_cluster_says_one_member() {
    let port = common::free_port();
    let node = common::node(27, 27, port, json!({}));
    assert!(node.wait_members(1, Duration::from_secs(10)));
    let out = node_bin()
        .args([
            "status",
            "--discovery-addr",
            &format!("127.0.0.27:{port}"),
            "--timeout",
            "5",
        ])
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("1 member, masters"), "{text}");
    node.shutdown();
}

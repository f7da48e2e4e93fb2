//! The command line of PeerCache 0.8.4's `peercache-bench`, as launch scripts use it: the
//! global `--log-level` / `--log-file`, its option names where they make sense, the `mooncake`
//! subcommand, and one clear line for what this build cannot do.

use std::process::{Command, Output};

fn bench(args: &[&str], dir: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peercache-bench"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

#[test]
fn the_global_log_flags_and_the_old_option_names_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bench.log");
    let json = dir.path().join("out.json");
    let out = bench(
        &[
            "--log-level",
            "info",
            "--log-file",
            log.to_str().unwrap(),
            "latency",
            "--page-size",
            "4096",
            "--working-set",
            "64",
            "--batch-size",
            "1,4",
            "--rounds",
            "1",
            "--duration",
            "0.05",
            "--json",
            json.to_str().unwrap(),
        ],
        dir.path(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["config"]["page_bytes"], 4096, "{}", v["config"]);
    assert_eq!(v["config"]["batch_sizes"], serde_json::json!([1, 4]));
    // At info, the embedded nodes' start-up lines go to the file, not to standard error.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("peercache node started"), "{logged}");
    assert!(!err.contains("peercache node started"), "{err}");
    // A debug build says so once, before anything else.
    let warned = err.contains("built without optimizations");
    assert_eq!(warned, cfg!(debug_assertions), "{err}");
}

#[test]
fn a_level_outside_the_old_set_is_refused_by_the_parser() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(&["--log-level", "loud", "latency"], dir.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--log-level") && err.contains("warning"),
        "{err}"
    );
}

#[test]
fn what_this_build_cannot_do_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = vec![
        (vec!["drive", "--gpu"], "GPUDirect"),
        (vec!["drive", "--gpu", "--op", "exists"], "moves no pages"),
        (
            vec![
                "drive",
                "--gpu",
                "--protocol",
                "rdma",
                "--set",
                "rdma_backend=soft",
            ],
            "rdma_backend=verbs",
        ),
        (
            vec!["mooncake", "--mooncake-venv", "/nonexistent/venv"],
            "has no bin/mooncake_master",
        ),
    ];
    // Without the RDMA feature this build says so; with it, a host without CUDA names the
    // libraries it tried (on a GPU host the run would go ahead; tests/device_read.rs covers the
    // read path on every host).
    let gpu = vec!["drive", "--gpu", "--protocol", "rdma"];
    if !cfg!(feature = "rdma") {
        cases.push((gpu, "built without RDMA support"));
    } else if peercache_bench::cmd::drive::cuda::Cuda::load().is_err() {
        cases.push((gpu, "no CUDA runtime"));
    }
    for (args, says) in cases {
        let out = bench(&args, dir.path());
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(errors[0].contains(says), "{args:?}: {}", errors[0]);
    }
}

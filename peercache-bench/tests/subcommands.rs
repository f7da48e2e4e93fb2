//! The newer subcommands run briefly and write a valid report in the result contract.

use std::process::Command;

fn run(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_peercache-bench"))
        .args(args)
        .arg("--json")
        .arg(&json)
        .current_dir(dir.path())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // Every run also leaves JSON and Markdown in ./peercache-bench-results/.
    let bench = v["bench"].as_str().unwrap().to_string();
    let results = dir.path().join("peercache-bench-results");
    let md = std::fs::read_to_string(results.join(format!("{bench}.md"))).unwrap();
    assert!(md.starts_with(&format!("# peercache-bench {bench}")) && md.contains("| row |"));
    assert!(results.join(format!("{bench}.json")).exists());
    assert!(v["host"].is_object() && v["config"].is_object() && v["summary"].is_object());
    // Every report says which build measured it (a debug build's figures compare with nothing).
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    assert_eq!(v["host"]["profile"], profile, "{}", v["host"]);
    assert!(md.contains(&format!("{profile} build")), "{md}");
    assert!(!v["results"].as_array().unwrap().is_empty());
    v
}

/// The names of a report's rows, in order.
fn row_names(v: &serde_json::Value) -> Vec<&str> {
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect()
}

/// [`run`] briefly: one round of 50 ms per row.
fn brief(args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--rounds", "1", "--secs", "0.05"]);
    run(&all)
}

/// [`brief`] on `pages` pages at `concurrency` callers, drawing its charts into a fresh folder:
/// the report, and the chart `svg` read back.
fn brief_charted(
    args: &[&str],
    concurrency: &str,
    svg: &[&str],
) -> (serde_json::Value, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("charts");
    let mut all = args.to_vec();
    all.extend(["--concurrency", concurrency, "--pages", "64", "--out-dir"]);
    all.push(out.to_str().unwrap());
    let v = brief(&all);
    let charts = svg
        .iter()
        .map(|f| std::fs::read_to_string(out.join(f)).unwrap())
        .collect();
    (v, charts)
}

#[test]
fn modes_reports_every_mode() {
    let v = brief(&["modes", "--concurrency", "1", "--pool-mib", "64"]);
    for mode in ["p2p", "centralized", "hybrid", "slotmap"] {
        let got = v["summary"][format!("{mode}_get_pages_per_s_median")]
            .as_f64()
            .unwrap();
        assert!(got > 0.0, "{mode}: {v}");
    }
}

#[test]
fn compare_runs_without_mooncake_and_draws_its_chart() {
    let (v, charts) = brief_charted(
        &[
            "compare",
            "--mooncake-venv",
            "/nonexistent-mooncake-venv",
            "--modes",
            "p2p,centralized",
        ],
        "1",
        &["compare.svg"],
    );
    assert_eq!(v["summary"]["mooncake_available"], false);
    assert!(v["summary"]["c1/peercache-get/raw-tcp"].as_f64().unwrap() > 0.0);
    // The other mode's row, read from a storage server.
    assert!(
        v["summary"]["peercache-centralized-get/peercache-get"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let rows = v["results"].as_array().unwrap();
    let central = rows
        .iter()
        .find(|r| r["name"] == "peercache-centralized-get")
        .unwrap();
    assert_eq!(central["hit_pct"], 100.0, "{v}");
    assert!(charts[0].starts_with("<svg") && charts[0].contains("peercache-centralized-get"));
}

#[test]
fn replicas_reports_the_hot_key_and_disk_only_rows() {
    let v = brief(&["replicas", "--hot-pages", "32"]);
    assert!(v["summary"]["hot_get_pages_per_s_on"].as_f64().unwrap() > 0.0);
    assert!(v["summary"]["disk_only_pages_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn saturation_marks_its_peak_and_draws_the_curves() {
    let (v, charts) = brief_charted(
        &["saturation"],
        "1,2",
        &["saturation.svg", "saturation-p99.svg"],
    );
    let peak = v["summary"]["peak_concurrency"].as_u64().unwrap();
    assert!(peak == 1 || peak == 2);
    assert!(charts.iter().all(|svg| svg.starts_with("<svg")));
}

#[test]
fn latency_reports_every_operation_and_batch_size() {
    let v = brief(&["latency", "--batch-sizes", "1,4", "--pages", "64"]);
    for op in ["exists", "get", "set"] {
        for b in [1, 4] {
            assert!(
                v["summary"][format!("{op}/batch{b}")]["p50_us"]
                    .as_f64()
                    .unwrap()
                    > 0.0
            );
        }
    }
}

#[test]
fn suite_runs_each_bench_in_its_own_process() {
    let v = run(&["suite", "--quick", "--only", "latency,saturation"]);
    assert!(v["summary"]["latency"].is_object() && v["summary"]["saturation"].is_object());
    let names = row_names(&v);
    assert!(names.iter().any(|n| n.starts_with("latency:")));
    assert!(names.iter().any(|n| n.starts_with("saturation:")));
}

#[test]
fn throughput_runs_the_sglang_shaped_prefetch_and_backup() {
    for (layout, host) in [("mha", "layer-first"), ("mla", "page-first")] {
        let v = run(&[
            "throughput",
            "--layout",
            layout,
            "--host-layout",
            host,
            "--tokens-per-page",
            "4",
            "--layers",
            "4",
            "--working-set",
            "128",
            "--batch-size",
            "8",
            "--concurrencies",
            "1,2",
            "--rounds",
            "1",
            "--duration",
            "0.1",
            "--warmup",
            "0",
            "--reader-pool-mib",
            "64",
            "--ops",
            "prefetch,get,exists,backup",
            "--set",
            "directory_read_cache_ttl=1",
        ]);
        let s = &v["summary"];
        assert_eq!(s["wrong_pages"], 0, "{v}");
        assert_eq!(
            s["staged_reads"], 0,
            "registered host pools: no staging copy: {v}"
        );
        assert_eq!(s["read_hit_pct_median"], 100.0, "{v}");
        assert!(s["prefetch_tokens_per_s/c2"].as_f64().unwrap() > 0.0);
        assert!(s["backup_tokens_per_s/c1"].as_f64().unwrap() > 0.0);
        assert!(s["get_tokens_per_s/c1"].as_f64().unwrap() > 0.0);
        assert!(s["exists_tokens_per_s/c1"].as_f64().unwrap() > 0.0);
        let segs = if layout == "mha" { 8 } else { 1 };
        assert_eq!(v["config"]["segments_per_page"], segs);
        let rows = v["results"].as_array().unwrap();
        assert!(
            rows.iter()
                .all(|r| r["tokens_per_s"].as_f64().unwrap() > 0.0 && r["errors"] == 0),
            "{v}"
        );
    }
}

/// `drive` for one short round at one thread per reader, small pages, then `extra`.
fn quick_drive(extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "drive",
        "--concurrencies",
        "1",
        "--rounds",
        "1",
        "--duration",
        "0.2",
        "--warmup",
        "0",
        "--batch-size",
        "8",
        "--layers",
        "4",
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn drive_merges_reader_processes() {
    let v = quick_drive(&[
        "--processes",
        "2",
        "--working-set",
        "64",
        // 0.8.4's flags, passed on to the reader processes too.
        "--dir-cache-ttl",
        "5",
        "--max-channels",
        "8",
        "--connect-timeout",
        "20",
        "--local-host",
        "127.0.0.1",
    ]);
    assert_eq!(
        v["config"]["cluster"]["dir_cache_ttl"], 5.0,
        "{}",
        v["config"]
    );
    assert_eq!(v["config"]["cluster"]["max_channels"], 8);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    // Two processes × one thread each, merged into one row.
    assert_eq!(rows[0]["concurrency"], 2);
    assert!(rows[0]["pages_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[0]["hit_pct"], 100.0, "{v}");
    assert_eq!(v["summary"]["wrong_pages"], 0);
    assert_eq!(v["config"]["processes"], 2);
}

#[test]
fn drive_get_measures_both_stream_floors() {
    let v = quick_drive(&["--op", "get", "--processes", "1", "--working-set", "32"]);
    let rows = v["results"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["drive-get", "raw-tcp/stream-x1", "raw-tcp/stream-ws-x1"],
        "{v}"
    );
    for r in rows {
        assert!(r["gb_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    // Each ratio is the get's GB/s over that stream's.
    let get = rows[0]["gb_per_s"].as_f64().unwrap();
    for (key, row) in [("get_over_stream/c1", 1), ("get_over_ws_stream/c1", 2)] {
        let want = get / rows[row]["gb_per_s"].as_f64().unwrap();
        let got = v["summary"][key].as_f64().unwrap();
        assert!((got - want).abs() < 0.002, "{key}: {got} vs {want}");
    }
    assert_eq!(v["summary"]["wrong_pages"], 0);
    assert_eq!(v["config"]["destination"], "host");
}

#[test]
fn micro_store_path_adds_store_rows() {
    let v = run(&[
        "micro",
        "--path",
        "store",
        "--page-sizes",
        "4096",
        "--concurrency",
        "1",
        "--rounds",
        "1",
        "--secs",
        "0.1",
        "--region-mib",
        "16",
    ]);
    let names = row_names(&v);
    assert_eq!(names, ["store-get", "store-set"]);
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows[0]["hit_pct"], 100.0, "{v}");
    assert!(v["summary"]["store-get_pages_per_s@4096"].as_f64().unwrap() > 0.0);
}

#[test]
fn the_main_job_and_the_component_benches_run_briefly() {
    let v = brief(&[
        "--read-pages",
        "64",
        "--writer-pool-mib",
        "64",
        "--concurrency",
        "1",
    ]);
    assert_eq!(v["bench"], "main");
    let names = row_names(&v);
    for row in [
        "raw-tcp",
        "set",
        "set-evicting",
        "exists",
        "get",
        "exists+get",
    ] {
        assert!(names.contains(&row), "main job lacks {row}: {names:?}");
    }
    assert_eq!(v["summary"]["stale_directory_entries"], 0);
    let v = brief(&["pool", "--source-mib", "16", "--pool-mib", "32"]);
    assert_eq!(v["bench"], "pool");
    let v = brief(&["directory", "--entries", "2000"]);
    assert_eq!(v["bench"], "directory");
    for row in v["results"].as_array().unwrap() {
        assert_eq!(row["errors"], 0, "{row}");
    }
    // The prefix query: every answer checked against a scan, none wrong.
    let v = brief(&["prefix", "--keys", "3000"]);
    assert_eq!(v["bench"], "prefix");
    assert_eq!(v["summary"]["wrong_answers"], 0, "{v}");
    let names = row_names(&v);
    assert_eq!(
        names,
        [
            "raw-tcp-rr",
            "prefix-64",
            "prefix-64-client",
            "prefix-64-http"
        ]
    );
    assert!(
        v["results"][1]["pages_per_s"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    let v = run(&["disk", "--pages", "64", "--rounds", "1"]);
    assert_eq!(v["bench"], "disk");
    let v = brief(&[
        "micro",
        "--page-sizes",
        "4096",
        "--concurrency",
        "1",
        "--region-mib",
        "16",
    ]);
    let names = row_names(&v);
    assert_eq!(names, ["raw-tcp", "tcp-read", "tcp-write"]);
}

#[test]
fn startup_times_the_first_read_and_with_rdma_the_first_one_sided_read_and_the_registration() {
    let v = run(&["startup", "--pool-gib", "1", "--rounds", "1"]);
    assert_eq!(
        row_names(&v),
        [
            "startup/first-read/1g",
            "startup/pool-ready/1g",
            "startup/memset/1g"
        ]
    );
    assert!(v["summary"]["rdma"].is_null(), "{v}");
    // The software fabric in 64 MiB chunks: the read goes one-sided once its chunk is in, and
    // the whole gibibyte ends up registered.
    let v = run(&[
        "startup",
        "--pool-gib",
        "1",
        "--rounds",
        "1",
        "--set",
        "protocol=rdma",
        "--set",
        "rdma_backend=soft",
        "--set",
        "rdma_register_chunk=64mb",
    ]);
    let names = row_names(&v);
    assert!(
        names.contains(&"startup/first-rdma-read/1g")
            && names.contains(&"startup/rdma-registered/1g"),
        "{names:?}"
    );
    let s = &v["summary"];
    let (first, one_sided, registered) = (
        s["first_read_s"].as_f64().unwrap(),
        s["rdma"]["first_one_sided_read_s"].as_f64().unwrap(),
        s["rdma"]["pool_registered_s"].as_f64().unwrap(),
    );
    assert!(
        0.0 < first && first <= one_sided && one_sided <= registered + 0.01,
        "{s}"
    );
    assert_eq!(v["config"]["set"][0], "protocol=rdma");
}

//! `peercache-bench suite`: every benchmark in one go, each as its own process (so one's memory
//! and threads do not disturb the next), results collected into one report and, per bench, into
//! `--out-dir` as JSON and Markdown.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::report::{Host, Report, Row};

/// Options of `suite`.
#[derive(Debug, Clone, clap::Args)]
pub struct SuiteArgs {
    /// One round and short rows everywhere (a smoke run of a few minutes).
    #[arg(long)]
    pub quick: bool,
    /// Benches to run (default: all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "main,throughput,drive,latency,saturation,modes,replicas,compare,micro,pool,directory,prefix,disk"
    )]
    pub only: Vec<String>,
    /// Where each bench's results go.
    #[arg(long, default_value = "peercache-bench-results")]
    pub out_dir: PathBuf,
    /// Write the combined report here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The command-line flags of one bench in the suite.
fn flags(bench: &str, quick: bool) -> Vec<&'static str> {
    let mut f: Vec<&'static str> = match bench {
        "main" => vec![],
        other => vec![match other {
            "latency" => "latency",
            "saturation" => "saturation",
            "modes" => "modes",
            "replicas" => "replicas",
            "compare" => "compare",
            "pool" => "pool",
            "directory" => "directory",
            "prefix" => "prefix",
            "disk" => "disk",
            "throughput" => "throughput",
            "drive" => "drive",
            "micro" => "micro",
            _ => "",
        }],
    };
    if quick
        && matches!(
            bench,
            "main" | "latency" | "saturation" | "modes" | "replicas" | "compare" | "prefix"
        )
    {
        f.extend(["--rounds", "1", "--secs", "0.2"]);
    }
    if bench == "micro" {
        f.extend(["--path", "both"]);
    }
    if quick && matches!(bench, "throughput" | "drive" | "micro") {
        f.extend(["--rounds", "1", "--duration", "0.2"]);
    }
    f
}

/// Runs the suite.
pub fn run(args: &SuiteArgs) -> Result<Report> {
    let exe = std::env::current_exe().context("locating peercache-bench")?;
    std::fs::create_dir_all(&args.out_dir)?;
    let mut progress = crate::load::progress::Progress::new("suite", args.only.len());
    let mut summary = serde_json::Map::new();
    let mut rows: Vec<Row> = Vec::new();
    for bench in &args.only {
        let f = flags(bench, args.quick);
        if f.first() == Some(&"") {
            bail!("unknown bench {bench:?} in --only");
        }
        let json_path = args.out_dir.join(format!("suite-{bench}.json"));
        let status = Command::new(&exe)
            .args(&f)
            .arg("--json")
            .arg(&json_path)
            .status()
            .with_context(|| format!("running {bench}"))?;
        if !status.success() {
            summary.insert(bench.clone(), json!({"failed": status.code()}));
            progress.step(&format!("{bench} FAILED"));
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json_path)?)?;
        summary.insert(bench.clone(), v["summary"].clone());
        if let Ok(r) = serde_json::from_value::<Vec<serde_json::Value>>(v["results"].clone()) {
            for row in r {
                if let Ok(mut row) = serde_json::from_value::<Row>(row) {
                    row.name = format!("{bench}:{}", row.name);
                    rows.push(row);
                }
            }
        }
        progress.step(bench);
    }
    Ok(Report {
        bench: "suite".into(),
        host: Host::detect(),
        config: json!({"benches": args.only, "quick": args.quick}),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

//! `peercache-bench saturation`: `get` throughput and tail latency as the number of caller
//! threads grows, on the main job's two-node cluster; marks the peak row and draws both curves
//! (`saturation.svg` and `saturation-p99.svg` in `--out-dir`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;

use crate::load::rawtcp;
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report};

/// Options of `saturation`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("concurrency", |a| a.default_value("1,2,4,8,16")))]
pub struct SaturationArgs {
    /// Page size in bytes.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages in the read set.
    #[arg(long, default_value_t = 1024)]
    pub pages: u64,
    /// Where the chart goes.
    #[arg(long, default_value = "peercache-bench-results")]
    pub out_dir: std::path::PathBuf,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

/// Runs the sweep.
pub fn run(args: &SaturationArgs) -> Result<Report> {
    let (page, batch) = (args.page_bytes as usize, args.load.batch as usize);
    let seed = crate::load::node::loopback_seed()?;
    let pool = crate::load::node::pool_for(args.pages, args.page_bytes);
    let a = crate::cmd::main_job::start_node("127.0.0.1", &seed, &pool)?;
    let b = crate::cmd::main_job::start_node("127.0.0.2", &seed, "64mb")?;
    if !(a.wait_members(2, Duration::from_secs(20)) && b.wait_members(2, Duration::from_secs(20))) {
        bail!("the two nodes did not see each other");
    }
    b.sync_membership();
    let keys: Arc<Vec<String>> = Arc::new((0..args.pages).map(|i| format!("sat/{i}")).collect());
    crate::load::workload::publish(&a, &keys, &rawtcp::prefaulted(page * batch, 9), page, batch)?;
    let sweep = Sweep::new("saturation", &args.run, &args.load, args.page_bytes)?;
    let mut rows = Vec::new();
    sweep.run(&mut rows, |cell| {
        cell.row("get", |t| {
            crate::load::workload::get_caller(b.clone(), keys.clone(), page, batch, t as u64 * 613)
        });
        Ok(())
    })?;
    a.shutdown();
    b.shutdown();
    let per_c = |f: fn(&report::Row) -> f64| -> Vec<f64> {
        args.load
            .threads
            .concurrency
            .iter()
            .map(|&c| report::median(rows.iter().filter(|r| r.concurrency == c).map(f).collect()))
            .collect()
    };
    let pps = per_c(|r| r.pages_per_s);
    let p99 = per_c(|r| r.p99_us);
    let peak = (0..pps.len())
        .max_by(|&i, &j| pps[i].total_cmp(&pps[j]))
        .unwrap_or(0);
    std::fs::create_dir_all(&args.out_dir)?;
    let x: Vec<f64> = args
        .load
        .threads
        .concurrency
        .iter()
        .map(|&c| c as f64)
        .collect();
    // One line chart of `series` by caller threads into `file` (`peak` circled when given).
    let chart = |file: &str, title: &str, y: &str, series: (&str, Vec<f64>), peak| {
        let svg =
            crate::report::charts::line_chart(title, "caller threads", y, &x, &[series], peak);
        std::fs::write(args.out_dir.join(file), svg)
    };
    chart(
        "saturation.svg",
        "get: pages/s by caller threads (peak circled)",
        "pages/s",
        ("get pages/s", pps.clone()),
        Some(peak),
    )?;
    chart(
        "saturation-p99.svg",
        "get: p99 µs per call",
        "p99 µs",
        ("get p99", p99.clone()),
        None,
    )?;
    Ok(Report {
        bench: "saturation".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.load.batch, "concurrency": args.load.threads.concurrency,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages,
        }),
        summary: json!({
            "peak_concurrency": args.load.threads.concurrency[peak],
            "peak_pages_per_s": pps[peak].round(),
            "pages_per_s_by_concurrency": pps.iter().map(|v| v.round()).collect::<Vec<_>>(),
            "p99_us_by_concurrency": p99.iter().map(|v| v.round()).collect::<Vec<_>>(),
        }),
        results: rows,
    })
}

//! `peercache-bench saturation`: `get` throughput and tail latency as the number of caller
//! threads grows, on the main job's two-node cluster; marks the peak row and draws both curves
//! (`saturation.svg` and `saturation-p99.svg` in `--out-dir`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;

use crate::rawtcp;
use crate::report::{self, Host, Report};
use crate::runner::{Timing, run_row};

/// Options of `saturation`.
#[derive(Debug, Clone, clap::Args)]
pub struct SaturationArgs {
    /// Page size in bytes.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages per batch call.
    #[arg(long, visible_alias = "batch-size", default_value_t = 32)]
    pub batch: u64,
    /// Caller threads, one row each.
    #[arg(
        long,
        visible_alias = "concurrencies",
        value_delimiter = ',',
        default_value = "1,2,4,8,16"
    )]
    pub concurrency: Vec<u64>,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 2)]
    pub rounds: u64,
    /// Seconds per row.
    #[arg(long, visible_alias = "duration", default_value_t = 0.5)]
    pub secs: f64,
    /// Pages in the read set.
    #[arg(long, default_value_t = 1024)]
    pub pages: u64,
    /// Where the chart goes.
    #[arg(long, default_value = "peercache-bench-results")]
    pub out_dir: std::path::PathBuf,
    /// Write the report here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// Runs the sweep.
pub fn run(args: &SaturationArgs) -> Result<Report> {
    let (page, batch) = (args.page_bytes as usize, args.batch as usize);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.1:{port}");
    let pool = format!(
        "{}mb",
        (args.pages * args.page_bytes * 2 / (1 << 20)).max(64)
    );
    let a = crate::mainjob::start_node("127.0.0.1", &seed, &pool)?;
    let b = crate::mainjob::start_node("127.0.0.2", &seed, "64mb")?;
    if !(a.wait_members(2, Duration::from_secs(20)) && b.wait_members(2, Duration::from_secs(20))) {
        bail!("the two nodes did not see each other");
    }
    b.sync_membership();
    let keys: Arc<Vec<String>> = Arc::new((0..args.pages).map(|i| format!("sat/{i}")).collect());
    crate::workload::publish(&a, &keys, &rawtcp::prefaulted(page * batch, 9), page, batch)?;
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.secs),
    };
    let mut progress =
        crate::progress::Progress::new("saturation", args.rounds as usize * args.concurrency.len());
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        for &c in &args.concurrency {
            rows.push(run_row(
                "get",
                args.page_bytes,
                args.batch,
                c,
                round,
                &timing,
                |t| {
                    crate::workload::get_caller(
                        b.clone(),
                        keys.clone(),
                        page,
                        batch,
                        t as u64 * 613,
                    )
                },
            ));
            progress.step(&format!("round {round}, {c} thread(s)"));
        }
    }
    a.shutdown();
    b.shutdown();
    let per_c = |f: fn(&report::Row) -> f64| -> Vec<f64> {
        args.concurrency
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
    let x: Vec<f64> = args.concurrency.iter().map(|&c| c as f64).collect();
    std::fs::write(
        args.out_dir.join("saturation.svg"),
        crate::charts::line_chart(
            "get: pages/s by caller threads (peak circled)",
            "caller threads",
            "pages/s",
            &x,
            &[("get pages/s", pps.clone())],
            Some(peak),
        ),
    )?;
    std::fs::write(
        args.out_dir.join("saturation-p99.svg"),
        crate::charts::line_chart(
            "get: p99 µs per call",
            "caller threads",
            "p99 µs",
            &x,
            &[("get p99", p99.clone())],
            None,
        ),
    )?;
    Ok(Report {
        bench: "saturation".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.batch, "concurrency": args.concurrency,
            "rounds": args.rounds, "secs": args.secs, "pages": args.pages,
        }),
        summary: json!({
            "peak_concurrency": args.concurrency[peak],
            "peak_pages_per_s": pps[peak].round(),
            "pages_per_s_by_concurrency": pps.iter().map(|v| v.round()).collect::<Vec<_>>(),
            "p99_us_by_concurrency": p99.iter().map(|v| v.round()).collect::<Vec<_>>(),
        }),
        results: rows,
    })
}

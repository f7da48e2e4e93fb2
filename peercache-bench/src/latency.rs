//! `peercache-bench latency`: one caller, each operation alone, at several batch sizes — the
//! per-call latency distribution (p50, p99, p99.9, max) of `exists`, `get` and `set` on the main
//! job's two-node cluster (B reads what A published; B writes into its own pool).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;

use crate::rawtcp;
use crate::report::{self, Host, Report};
use crate::runner::{Timing, run_row};

/// Options of `latency`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
pub struct LatencyArgs {
    /// Page size in bytes.
    #[arg(long, visible_alias = "page-size", default_value_t = 131072)]
    pub page_bytes: u64,
    /// Batch sizes, one row per operation each.
    #[arg(
        long,
        visible_alias = "batch-size",
        value_delimiter = ',',
        default_value = "1,8,32"
    )]
    pub batch_sizes: Vec<u64>,
    /// Pages in the read set.
    #[arg(long, visible_alias = "working-set", default_value_t = 1024)]
    pub pages: u64,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::rows::RunArgs,
}

/// Runs the latency rows.
pub fn run(args: &LatencyArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let max_batch = *args.batch_sizes.iter().max().unwrap_or(&32) as usize;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.1:{port}");
    let pool = format!(
        "{}mb",
        (args.pages * args.page_bytes * 2 / (1 << 20)).max(64)
    );
    let a = crate::mainjob::start_node("127.0.0.1", &seed, &pool)?;
    let b = crate::mainjob::start_node("127.0.0.2", &seed, "1024mb")?;
    if !(a.wait_members(2, Duration::from_secs(20)) && b.wait_members(2, Duration::from_secs(20))) {
        bail!("the two nodes did not see each other");
    }
    b.sync_membership();
    let keys: Arc<Vec<String>> = Arc::new((0..args.pages).map(|i| format!("lat/{i}")).collect());
    let src = Arc::new(rawtcp::prefaulted(page * max_batch, 13));
    crate::workload::publish(&a, &keys, &src, page, max_batch)?;
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.run.secs),
    };
    let mut progress = crate::progress::Progress::new(
        "latency",
        args.run.rounds as usize * args.batch_sizes.len(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let mut rows = Vec::new();
    for round in 0..args.run.rounds {
        for &bs in &args.batch_sizes {
            let batch = bs as usize;
            rows.push(run_row(
                "exists",
                args.page_bytes,
                bs,
                1,
                round,
                &timing,
                |t| crate::workload::exists_caller(b.clone(), keys.clone(), batch, t as u64 * 17),
            ));
            if let Some(r) = rows.last_mut() {
                r.gb_per_s = 0.0;
            }
            rows.push(run_row(
                "get",
                args.page_bytes,
                bs,
                1,
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
            rows.push(run_row(
                "set",
                args.page_bytes,
                bs,
                1,
                round,
                &timing,
                |t| {
                    crate::workload::set_caller(
                        b.clone(),
                        src.clone(),
                        "lat-set".into(),
                        next.clone(),
                        page,
                        batch,
                        t,
                    )
                },
            ));
            progress.step(&format!("round {round}, batch {bs}"));
        }
    }
    a.shutdown();
    b.shutdown();
    let mut summary = serde_json::Map::new();
    for op in ["exists", "get", "set"] {
        for &bs in &args.batch_sizes {
            let sel: Vec<&report::Row> = rows
                .iter()
                .filter(|r| r.name == op && r.batch == bs)
                .collect();
            let med =
                |f: fn(&report::Row) -> f64| report::median(sel.iter().map(|r| f(r)).collect());
            summary.insert(
                format!("{op}/batch{bs}"),
                json!({"p50_us": med(|r| r.p50_us), "p99_us": med(|r| r.p99_us),
                       "p999_us": med(|r| r.p999_us)}),
            );
        }
    }
    Ok(Report {
        bench: "latency".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch_sizes": args.batch_sizes, "threads": 1,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages,
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

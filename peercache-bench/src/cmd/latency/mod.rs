//! `peercache-bench latency`: one caller, each operation alone, at several batch sizes — the
//! per-call latency distribution (p50, p99, p99.9, max) of `exists`, `get` and `set` on the main
//! job's two-node cluster (B reads what A published; B writes into its own pool), beside the
//! bare request/response floor of the same layout (`raw-tcp/rr-<page>`: a 16-byte request, one
//! page back; `raw-tcp/rr-64B`: a 64-byte reply). Rows `own/exists` and `own/get`: node A
//! asking about and reading its own pages (an engine reading back what it offloaded). With
//! `--owner-process`, node A (and the bare server) run in a child process, as a deployment is
//! laid out, and the `own/*` rows are left out.

pub mod breakdown;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::load::rawtcp;
use crate::load::runner::{Timing, run_row};
use crate::report::{self, Host, Report};

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
    /// Run the owner node A and the bare baseline server in their own process (`serve`),
    /// as a deployment is laid out; without it both nodes share this process.
    #[arg(long)]
    pub owner_process: bool,
    /// Also time each stage of a `get` (locate, local, prepare, transport, verify, other,
    /// total) at every batch size: rows `get/<stage>`, summary `breakdown`.
    #[arg(long)]
    pub breakdown: bool,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

/// Pages the bare baseline server holds.
const RAW_PAGES: u64 = 64;

/// `128k` for 131072, `64B` for 64: row-name form of a size.
fn size_label(bytes: u64) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{}k", bytes / 1024)
    } else {
        format!("{bytes}B")
    }
}

/// Node A: in this process, or a `serve` child. The keys it published and the baseline server.
enum Owner {
    Here(peercache_store::Store),
    /// Held for its `Drop`: closing its input stops the owner process.
    Child {
        _process: crate::load::child::ChildProc,
    },
}

fn start_owner(
    args: &LatencyArgs,
    seed: &str,
    pool: &str,
    src: &[u8],
    max_batch: usize,
) -> Result<(Owner, Vec<String>, std::net::SocketAddr)> {
    let page = args.page_bytes as usize;
    if !args.owner_process {
        let a = crate::cmd::main_job::start_node("127.0.0.1", seed, pool)?;
        let keys: Vec<String> = (0..args.pages).map(|i| format!("lat/{i}")).collect();
        crate::load::workload::publish(&a, &keys, src, page, max_batch)?;
        let raw = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = raw.local_addr()?;
        let buf = Arc::new(rawtcp::prefaulted(RAW_PAGES as usize * page.max(64), 7));
        std::thread::spawn(move || rawtcp::serve(raw, buf));
        return Ok((Owner::Here(a), keys, addr));
    }
    let mut flags: Vec<String> = ["serve", "--discovery-addr", seed, "--host", "127.0.0.1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    flags.extend(["--preload".into(), args.pages.to_string()]);
    flags.extend(["--page-bytes".into(), args.page_bytes.to_string()]);
    flags.extend(["--stop-on-stdin-eof".into(), "--raw-tcp".into()]);
    // The settings `main_job::start_node` gives an in-process node.
    for kv in [
        "protocol=tcp".to_string(),
        format!("global_segment_size={pool}"),
        "heartbeat_interval=0.5".into(),
        "member_ttl=1.5".into(),
        "metrics_enabled=false".into(),
        "directory_read_cache_ttl=0".into(),
        "host_local=false".into(),
    ] {
        flags.extend(["--set".into(), kv]);
    }
    let child = crate::load::child::ChildProc::spawn("the owner process".into(), &flags)?;
    let raw_line = child.line(Duration::from_secs(120))?;
    let addr = raw_line
        .strip_prefix("RAW ")
        .with_context(|| format!("the owner process printed {raw_line:?}, not RAW <address>"))?
        .parse()?;
    let ready = child.line(Duration::from_secs(120))?;
    let mut words = ready.split_whitespace();
    let (Some("READY"), Some(id), Some(n)) = (words.next(), words.next(), words.next()) else {
        bail!("the owner process printed {ready:?}, not READY <node> <pages>");
    };
    if n.parse::<u64>().ok() != Some(args.pages) {
        bail!("the owner process published {n} of {} pages", args.pages);
    }
    let keys = (0..args.pages as usize)
        .map(|i| crate::cmd::serve::key_for(id, i))
        .collect();
    Ok((Owner::Child { _process: child }, keys, addr))
}

/// One reader's `<prefix>exists` (no payload counted) and `<prefix>get` rows at batch size
/// `bs`; `spread` sets where each caller starts in `keys`.
#[allow(clippy::too_many_arguments)]
fn read_rows(
    reader: &peercache_store::Store,
    prefix: &str,
    keys: &Arc<Vec<String>>,
    page: usize,
    bs: u64,
    round: u64,
    timing: &Timing,
    spread: u64,
) -> [report::Row; 2] {
    let batch = bs as usize;
    let mut exists = run_row(
        &format!("{prefix}exists"),
        page as u64,
        bs,
        1,
        round,
        timing,
        |t| {
            crate::load::workload::exists_caller(
                reader.clone(),
                keys.clone(),
                batch,
                t as u64 * 17 * spread,
            )
        },
    );
    exists.gb_per_s = 0.0;
    let get = run_row(
        &format!("{prefix}get"),
        page as u64,
        bs,
        1,
        round,
        timing,
        |t| {
            crate::load::workload::get_caller(
                reader.clone(),
                keys.clone(),
                page,
                batch,
                t as u64 * 613 * spread,
            )
        },
    );
    [exists, get]
}

/// Runs the latency rows.
pub fn run(args: &LatencyArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let max_batch = *args.batch_sizes.iter().max().unwrap_or(&32) as usize;
    let seed = crate::load::node::loopback_seed()?;
    let pool = crate::load::node::pool_for(args.pages, args.page_bytes);
    let src = Arc::new(rawtcp::prefaulted(page * max_batch, 13));
    let (a, keys, raw_addr) = start_owner(args, &seed, &pool, &src, max_batch)?;
    let b = crate::cmd::main_job::start_node("127.0.0.2", &seed, "1024mb")?;
    if !b.wait_members(2, Duration::from_secs(20)) {
        bail!("the two nodes did not see each other");
    }
    b.sync_membership();
    let keys = Arc::new(keys);
    // Every page visible from B before anything is timed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while b.batch_exists(&keys)? < keys.len() {
        if std::time::Instant::now() > deadline {
            bail!("B did not find A's {} pages within 30 s", keys.len());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.run.secs),
    };
    let mut progress = crate::load::progress::Progress::new(
        "latency",
        args.run.rounds as usize * args.batch_sizes.len(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let mut rows = Vec::new();
    for round in 0..args.run.rounds {
        for &bs in &args.batch_sizes {
            let batch = bs as usize;
            rows.extend(read_rows(&b, "", &keys, page, bs, round, &timing, 1));
            rows.push(run_row(
                "set",
                args.page_bytes,
                bs,
                1,
                round,
                &timing,
                |t| {
                    crate::load::workload::set_caller(
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
            // The owner reading its own pages (an engine reading back what it offloaded):
            // only when it runs in this process.
            if let Owner::Here(a) = &a {
                rows.extend(read_rows(a, "own/", &keys, page, bs, round, &timing, 2));
            }
            if args.breakdown {
                rows.extend(crate::cmd::latency::breakdown::get_stages(
                    &b,
                    &keys,
                    page,
                    batch,
                    round * 7919 + 1,
                    timing.measure,
                    round,
                ));
            }
            progress.step(&format!("round {round}, batch {bs}"));
        }
        // The bare request/response floor of the same layout: one page, and 64 bytes.
        for bytes in [args.page_bytes, 64] {
            rows.push(run_row(
                &format!("raw-tcp/rr-{}", size_label(bytes)),
                bytes,
                1,
                1,
                round,
                &timing,
                |t| {
                    crate::load::workload::raw_caller(
                        raw_addr,
                        bytes as usize,
                        1,
                        RAW_PAGES,
                        t as u64,
                    )
                },
            ));
        }
    }
    if let Owner::Here(a) = &a {
        a.shutdown();
    }
    b.shutdown();
    drop(a);
    let mut summary = serde_json::Map::new();
    for op in ["exists", "get", "set", "own/exists", "own/get"] {
        for &bs in &args.batch_sizes {
            let sel: Vec<&report::Row> = rows
                .iter()
                .filter(|r| r.name == op && r.batch == bs)
                .collect();
            if sel.is_empty() {
                continue;
            }
            let med =
                |f: fn(&report::Row) -> f64| report::median(sel.iter().map(|r| f(r)).collect());
            summary.insert(
                format!("{op}/batch{bs}"),
                json!({"p50_us": med(|r| r.p50_us), "p99_us": med(|r| r.p99_us),
                       "p999_us": med(|r| r.p999_us)}),
            );
        }
    }
    let p50 = |name: &str, batch: u64| {
        report::median(
            rows.iter()
                .filter(|r| r.name == name && r.batch == batch)
                .map(|r| r.p50_us)
                .collect(),
        )
    };
    if args.breakdown {
        let mut by_batch = serde_json::Map::new();
        for &bs in &args.batch_sizes {
            let mut stages = serde_json::Map::new();
            for (stage, _) in crate::cmd::latency::breakdown::STAGES {
                let name = format!("get/{stage}");
                let med = |f: fn(&report::Row) -> f64| {
                    report::median(
                        rows.iter()
                            .filter(|r| r.name == name && r.batch == bs)
                            .map(f)
                            .collect(),
                    )
                };
                stages.insert(
                    stage.into(),
                    json!({"p50_us": med(|r| r.p50_us), "p99_us": med(|r| r.p99_us)}),
                );
            }
            by_batch.insert(format!("batch{bs}"), serde_json::Value::Object(stages));
        }
        summary.insert("breakdown".into(), serde_json::Value::Object(by_batch));
    }
    let rr_page = p50(&format!("raw-tcp/rr-{}", size_label(args.page_bytes)), 1);
    let rr_64 = p50("raw-tcp/rr-64B", 1);
    summary.insert(
        "raw_tcp_rr".into(),
        json!({"page_p50_us": rr_page, "b64_p50_us": rr_64}),
    );
    // The latency issue's figures: a one-page get within 3 × the bare page round trip, a
    // 32-key exists within 2 × the bare 64-byte one.
    if rr_page > 0.0 {
        summary.insert("get1_over_rr_page".into(), json!(p50("get", 1) / rr_page));
        if args.breakdown {
            summary.insert(
                "get1_transport_over_rr_page".into(),
                json!(p50("get/transport", 1) / rr_page),
            );
        }
    }
    if rr_64 > 0.0 && args.batch_sizes.contains(&32) {
        summary.insert(
            "exists32_over_rr_64".into(),
            json!(p50("exists", 32) / rr_64),
        );
    }
    Ok(Report {
        bench: "latency".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch_sizes": args.batch_sizes, "threads": 1,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages,
            "owner": if args.owner_process { "child process" } else { "this process" },
            "breakdown": args.breakdown,
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

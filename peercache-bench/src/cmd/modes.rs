//! `peercache-bench modes`: the same write and read load in each deployment mode, side by side
//! in one run — `p2p` (the writer's own pool), `centralized` (into a storage server: prepare,
//! one-sided write, commit), `hybrid` with `write_policy = both` (storage plus a local copy) and
//! `slotmap` (no directory; owner-side writes, header-block + payload reads).
//!
//! Per mode an embedded cluster on its own loopback addresses: a writer W, a reader R and, for
//! the storage modes, a storage server S. Rows `set/<mode>` (W writes fresh pages) and
//! `get/<mode>` (R reads pages W wrote: from W's pool in p2p, from S otherwise).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::Store;
use serde_json::json;

use crate::load::rawtcp;
use crate::load::runner::CallOutcome;
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report};

/// Options of `modes`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("concurrency", |a| a.default_value("1,2")))]
pub struct ModesArgs {
    /// Modes to run, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "p2p,centralized,hybrid,slotmap"
    )]
    pub mode: Vec<String>,
    /// Page size in bytes.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pool of the writer / storage server in MiB.
    #[arg(long, default_value_t = 1024)]
    pub pool_mib: u64,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

/// A bench node on `ip` seeded by `seed`, with a `pool_mib` pool, warmed; `extra` overrides any
/// key.
pub(crate) fn start(
    ip: &str,
    seed: &str,
    pool_mib: u64,
    extra: serde_json::Value,
) -> Result<Store> {
    let cfg = json!({
        "discovery_addr": seed, "protocol": "tcp", "node_id": format!("bench-{ip}"),
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": format!("{pool_mib}mb"),
        "heartbeat_interval": 0.5, "member_ttl": 1.5, "metrics_enabled": false,
        // Bench nodes stand in for separate hosts: reads take the network path.
        "host_local": false,
        "cluster_secret": crate::load::secret::generated(),
    });
    crate::load::node::start_warm(cfg, extra.as_object().context("extra config")?)
}

/// One mode's cluster on 127.0.(20 + `n`).x: (writer, reader, nodes to stop).
pub(crate) fn cluster(
    mode: &str,
    n: usize,
    pool_mib: u64,
    page_bytes: u64,
) -> Result<(Store, Store, Vec<Store>)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let ip = |i: usize| format!("127.0.{}.{}", 20 + n, i);
    // The writer starts first and hosts the discovery server.
    let seed = format!("{}:{port}", ip(2));
    let (inference, storage) = match mode {
        "p2p" => (json!({}), None),
        "centralized" => (
            json!({"mode": "centralized"}),
            Some(json!({"mode": "centralized", "role": "storage"})),
        ),
        "hybrid" => (
            json!({"mode": "hybrid", "write_policy": "both"}),
            Some(json!({"mode": "hybrid", "role": "storage"})),
        ),
        "slotmap" => (
            json!({"mode": "slotmap", "slot_max_page_bytes": page_bytes}),
            None,
        ),
        other => bail!("unknown mode {other:?} (p2p, centralized, hybrid, slotmap)"),
    };
    let w = start(&ip(2), &seed, pool_mib, inference.clone())?;
    let mut all = vec![w.clone()];
    if let Some(s) = storage {
        all.push(start(&ip(1), &seed, pool_mib, s)?);
    }
    // In slotmap mode the reader owns part of the keyspace too: same region size.
    let reader_pool = if mode == "slotmap" { pool_mib } else { 64 };
    let r = start(&ip(3), &seed, reader_pool, inference)?;
    all.push(r.clone());
    let n_nodes = all.len();
    for s in &all {
        if !s.wait_members(n_nodes, Duration::from_secs(20)) {
            bail!("{mode}: the nodes did not see each other");
        }
        s.sync_membership();
    }
    Ok((w, r, all))
}

/// Runs every mode.
pub fn run(args: &ModesArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.load.batch as usize;
    let sweep = Sweep::new("modes", &args.run, &args.load, args.page_bytes)?;
    let src = Arc::new(rawtcp::prefaulted(page * batch * sweep.max_threads(), 29));
    let mut rows = Vec::new();
    let mut summary = serde_json::Map::new();
    // The pool must hold what the set rows write (no eviction in the read set).
    let read_pages = 1024u64.min((args.pool_mib << 20) / (args.page_bytes + 64) / 4);
    for (n, mode) in args.mode.iter().enumerate() {
        let (w, r, all) = cluster(mode, n, args.pool_mib, args.page_bytes)?;
        // The read set, written by W in this mode. The set rows fill the pools and evict it, so
        // it is stored again (untimed) before every get row.
        let read_keys: Arc<Vec<String>> = Arc::new(
            (0..read_pages)
                .map(|i| format!("{mode}/read/{i}"))
                .collect(),
        );
        let publish_read_set = || crate::load::workload::publish(&w, &read_keys, &src, page, batch);
        let next = Arc::new(AtomicU64::new(0));
        sweep.run(&mut rows, |cell| {
            cell.row(&format!("set/{mode}"), |t| {
                let (w, src, next, mode) = (w.clone(), src.clone(), next.clone(), mode.clone());
                move || {
                    let base = next.fetch_add(batch as u64, Ordering::Relaxed);
                    let keys: Vec<String> = (base..base + batch as u64)
                        .map(|i| format!("{mode}/write/{i}"))
                        .collect();
                    let off = t * batch * page;
                    let pages: Vec<&[u8]> = (0..batch)
                        .map(|j| &src[off + j * page..off + (j + 1) * page])
                        .collect();
                    match w.batch_set(&keys, &pages) {
                        Ok(v) => {
                            let ok = v.iter().filter(|&&x| x).count() as u64;
                            CallOutcome::done(ok, 0, ok != batch as u64)
                        }
                        Err(_) => CallOutcome::done(0, 0, true),
                    }
                }
            });
            publish_read_set()?;
            cell.row(&format!("get/{mode}"), |t| {
                crate::load::workload::get_caller(
                    r.clone(),
                    read_keys.clone(),
                    page,
                    batch,
                    t as u64 * 611,
                )
            });
            let row = cell.row(&format!("exists/{mode}"), |t| {
                crate::load::workload::exists_caller(
                    r.clone(),
                    read_keys.clone(),
                    batch,
                    t as u64 * 613,
                )
            });
            // exists moves no payload.
            row.gb_per_s = 0.0;
            Ok(())
        })?;
        let med = |name: &str| {
            report::median(
                rows.iter()
                    .filter(|row| row.name == name)
                    .map(|row| row.pages_per_s)
                    .collect(),
            )
        };
        summary.insert(
            format!("{mode}_set_pages_per_s_median"),
            json!(med(&format!("set/{mode}")).round()),
        );
        summary.insert(
            format!("{mode}_get_pages_per_s_median"),
            json!(med(&format!("get/{mode}")).round()),
        );
        summary.insert(
            format!("{mode}_exists_pages_per_s_median"),
            json!(med(&format!("exists/{mode}")).round()),
        );
        for s in all {
            s.shutdown();
        }
    }
    Ok(Report {
        bench: "modes".into(),
        host: Host::detect(),
        config: json!({
            "modes": args.mode, "protocol": "tcp", "page_bytes": args.page_bytes,
            "batch": args.load.batch, "concurrency": args.load.threads.concurrency, "rounds": args.run.rounds,
            "secs": args.run.secs, "pool_mib": args.pool_mib,
            "hybrid_write_policy": "both",
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

//! `throughput`: SGLang-shaped prefetch and backup throughput on an embedded loopback cluster.
//!
//! Owner nodes (127.0.0.1 … 127.0.0.{N-1}) back up a working set of requests from their own
//! simulated host pools; the reader node (127.0.0.N) runs HiCache's prefetch path — exists,
//! then get of the leading run straight into registered host slots — at each concurrency, and
//! a `backup` row of fresh requests. Rows carry tokens/s, hit %, HDR latency percentiles and a
//! stamp check of every page read.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::Store;
use serde_json::json;

use crate::load::runner::{CallOutcome, Timing, run_row};
use crate::load::sglang::{self, Checks, HostPool, ShapeArgs};
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report, Row};

/// Deployment mode of the measured cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchMode {
    /// Directory-backed peer-to-peer (the default).
    P2p,
    /// Directory-free slotmap placement.
    Slotmap,
}

/// Cluster options shared by `throughput` and `drive`.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct ClusterArgs {
    /// Deployment mode: p2p or slotmap (centralized and hybrid: see `modes`).
    #[arg(long, value_enum, default_value_t = BenchMode::P2p)]
    pub mode: BenchMode,
    /// Data-plane protocol: tcp, or rdma (falls back to tcp, with one log line, without a NIC).
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    /// RDMA devices, comma-separated (one rail each).
    #[arg(long, default_value = "")]
    pub devices: String,
    /// Any other node setting: `--set key=value`, repeatable (e.g. `directory_read_cache_ttl=5`,
    /// `max_channels_per_peer=32`, `disk_path=/nvme/pc`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Seconds a reader keeps directory answers (`directory_read_cache_ttl`; 0.8.4's flag).
    #[arg(long)]
    pub dir_cache_ttl: Option<f64>,
    /// Pooled connections per peer (`max_channels_per_peer`; 0.8.4's flag).
    #[arg(long)]
    pub max_channels: Option<u64>,
}

impl ClusterArgs {
    /// The node settings these options stand for, for pages of `page_bytes`.
    pub fn settings(&self, page_bytes: u64) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        m.insert("protocol".into(), json!(self.protocol));
        if !self.devices.is_empty() {
            m.insert("device_names".into(), json!(self.devices));
        }
        if self.mode == BenchMode::Slotmap {
            m.insert("mode".into(), json!("slotmap"));
            m.insert(
                "slot_max_page_bytes".into(),
                json!(page_bytes.next_power_of_two()),
            );
        }
        if let Some(ttl) = self.dir_cache_ttl {
            m.insert("directory_read_cache_ttl".into(), json!(ttl));
        }
        if let Some(n) = self.max_channels {
            m.insert("max_channels_per_peer".into(), json!(n));
        }
        // `--set` last: it names the key itself, so it wins.
        for kv in &self.set {
            if let Some((k, v)) = kv.split_once('=') {
                m.insert(k.trim().to_string(), json!(v.trim()));
            }
        }
        m
    }

    /// Checks the `--set` items are `key=value`.
    pub fn validate(&self) -> Result<()> {
        if let Some(bad) = self.set.iter().find(|kv| !kv.contains('=')) {
            bail!("--set {bad:?}: expected key=value");
        }
        Ok(())
    }
}

/// One kind of row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// HiCache's prefetch: exists, then get of the leading run.
    Prefetch,
    /// get of the whole request, without the exists before it.
    Get,
    /// exists alone (no payload).
    Exists,
    /// HiCache's backup: set of fresh pages.
    Backup,
}

impl Op {
    /// The row name.
    pub fn name(self) -> &'static str {
        match self {
            Op::Prefetch => "prefetch",
            Op::Get => "get",
            Op::Exists => "exists",
            Op::Backup => "backup",
        }
    }
}

/// Options of `throughput`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("secs", |a| a.default_value("1")))]
pub struct ThroughputArgs {
    /// Model and host-pool shape.
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// Cluster options.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Nodes in the cluster (all but the last own the working set; the last reads).
    #[arg(long, default_value_t = 2)]
    pub nodes: u8,
    /// Rows to run: prefetch (exists → get), get (get alone), exists, backup (set).
    #[arg(long, value_delimiter = ',', default_value = "prefetch,backup")]
    pub ops: Vec<Op>,
    /// Pages per request (one prefetch or backup call) and the reader's caller threads, one
    /// row each (the shared row flags).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
    /// Seconds of warm-up per row.
    #[arg(long, default_value_t = 0.2, value_parser = peercache_store::tools::secs::seconds)]
    pub warmup: f64,
    /// Pages in the working set (rounded up to whole requests).
    #[arg(long, default_value_t = 1024)]
    pub working_set: u64,
    /// The reader node's pool in MiB (the backup rows fill it).
    #[arg(long, default_value_t = 512)]
    pub reader_pool_mib: u64,
    /// Interleaved rounds, seconds measured per row and the JSON output (the shared run flags).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

impl ThroughputArgs {
    /// Pages per request.
    pub fn batch_size(&self) -> usize {
        self.load.batch as usize
    }
}

/// Starts one embedded node on `ip` with `settings` and waits until it joined.
pub fn start_node(
    ip: &str,
    seed: &str,
    pool_bytes: u64,
    settings: &serde_json::Map<String, serde_json::Value>,
) -> Result<Store> {
    let cfg = json!({
        "discovery_addr": seed,
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": pool_bytes.max(64 << 20),
        "heartbeat_interval": 0.5, "member_ttl": 1.5,
        "metrics_enabled": false,
        // Authenticated like a production cluster (the handshake is part of connection setup).
        "cluster_secret": crate::load::secret::generated(),
        // Bench nodes stand in for separate hosts: reads take the network path.
        "host_local": false,
    });
    crate::load::node::start_warm(cfg, settings)
}

/// Pool bytes an owner needs for `pages` pages of `page_bytes` (headers and slack included).
pub fn owner_pool_bytes(pages: u64, page_bytes: u64) -> u64 {
    pages * (page_bytes + 4096) * 3 / 2
}

/// One `backup` row: every caller writes fresh requests from its own host pool to `reader`.
fn backup_row(
    reader: &Store,
    shape: &ShapeArgs,
    args: &ThroughputArgs,
    c: u64,
    round: u64,
    timing: &Timing,
    next_backup: &Arc<AtomicU64>,
) -> Row {
    let mut row = run_row(
        "backup",
        shape.page_bytes(),
        args.load.batch,
        c,
        round,
        timing,
        |_| {
            let mut pool = HostPool::new(shape, args.batch_size());
            let (reader, next, shape) = (reader.clone(), next_backup.clone(), shape.clone());
            let per = shape.segments_per_page() as usize;
            let counts = vec![per; args.batch_size()];
            let batch = args.batch_size();
            let mut segs = Vec::new();
            move || {
                let r = next.fetch_add(1, Ordering::Relaxed);
                let keys = shape.request_keys(r, batch);
                segs.clear();
                for (slot, k) in keys.iter().enumerate() {
                    pool.stamp(slot, k);
                    pool.segments(slot, &mut segs);
                }
                // SAFETY: the segments point into this caller's own pool.
                match unsafe { reader.batch_set_raw(&keys, &segs, &counts) } {
                    Ok(v) => {
                        let ok = v.iter().filter(|&&x| x).count() as u64;
                        CallOutcome::done(ok, 0, ok != batch as u64)
                    }
                    Err(_) => CallOutcome::done(0, 0, true),
                }
            }
        },
    );
    row.tokens_per_s = row.pages_per_s * shape.tokens_per_page as f64;
    row
}

/// Runs `throughput`.
pub fn run(args: &ThroughputArgs) -> Result<Report> {
    args.shape.validate()?;
    args.cluster.validate()?;
    if args.ops.is_empty() {
        bail!("--ops must name at least one row");
    }
    if args.nodes < 2 {
        bail!("--nodes must be at least 2 (owners plus one reader)");
    }
    if args.batch_size() == 0 || args.load.threads.concurrency.is_empty() {
        bail!("--batch and --concurrency must be positive and non-empty");
    }
    let shape = &args.shape;
    let page_bytes = shape.page_bytes();
    let owners_n = (args.nodes - 1) as u64;
    let requests = args.working_set.div_ceil(args.load.batch).max(1);
    let set = sglang::working_set(shape, requests, args.batch_size());
    let settings = args.cluster.settings(page_bytes);
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.1:{port}");
    let share = requests.div_ceil(owners_n) * args.load.batch;
    let mut owners = Vec::new();
    let mut owner_pools = Vec::new();
    for i in 0..owners_n {
        let ip = format!("127.0.0.{}", i + 1);
        let s = start_node(&ip, &seed, owner_pool_bytes(share, page_bytes), &settings)
            .with_context(|| format!("starting owner {ip}"))?;
        let pool = HostPool::new(shape, args.batch_size());
        // SAFETY: every pool outlives its node: nodes are shut down before the pools drop.
        unsafe { pool.register(&s) }?;
        owners.push(s);
        owner_pools.push(pool);
    }
    let reader_ip = format!("127.0.0.{}", args.nodes);
    let reader = start_node(&reader_ip, &seed, args.reader_pool_mib << 20, &settings)
        .context("starting the reader")?;
    let all = args.nodes as usize;
    for s in owners.iter().chain([&reader]) {
        if !s.wait_members(all, Duration::from_secs(20)) {
            bail!("the {all} nodes did not see each other");
        }
    }
    // The working set, backed up by its owners (request r on owner r mod N).
    let back_up_working_set = |owner_pools: &mut Vec<HostPool>| -> Result<()> {
        for (o, (store, pool)) in owners.iter().zip(owner_pools.iter_mut()).enumerate() {
            let mine: Vec<Vec<String>> = set
                .iter()
                .enumerate()
                .filter(|(r, _)| *r as u64 % owners_n == o as u64)
                .map(|(_, k)| k.clone())
                .collect();
            sglang::backup_all(store, pool, &mine)?;
        }
        Ok(())
    };
    back_up_working_set(&mut owner_pools)?;

    let mut sweep = Sweep::new("throughput", &args.run, &args.load, page_bytes)?;
    sweep.timing.warmup = Duration::from_secs_f64(args.warmup);
    let tokens = shape.tokens_per_page as f64;
    let checks = Arc::new(Checks::default());
    let next_backup = Arc::new(AtomicU64::new(1 << 40));
    let mut rows: Vec<Row> = Vec::new();
    // One registered host pool per caller thread, registered once, dropped after shutdown.
    let mut reader_pools: Vec<Arc<HostPool>> = Vec::with_capacity(sweep.max_threads());
    for _ in 0..sweep.max_threads() {
        let pool = Arc::new(HostPool::new(shape, args.batch_size()));
        // SAFETY: the reader is shut down before `reader_pools` is dropped.
        unsafe { pool.register(&reader) }?;
        reader_pools.push(pool);
    }
    let staged0 = reader.stats().staged_reads;
    sweep.run(&mut rows, |cell| {
        let round = cell.round;
        for &op in &args.ops {
            let kind = match op {
                Op::Prefetch => sglang::ReadKind::Prefetch,
                Op::Get => sglang::ReadKind::Get,
                Op::Exists => sglang::ReadKind::Exists,
                Op::Backup => {
                    let row = backup_row(
                        &reader,
                        shape,
                        args,
                        cell.threads,
                        round,
                        cell.timing(),
                        &next_backup,
                    );
                    cell.push(row);
                    continue;
                }
            };
            let row = cell.row(op.name(), |t| {
                // SAFETY: pool `t` is registered with the reader and used by this caller
                // only; it outlives the reader (dropped after shutdown).
                unsafe {
                    sglang::read_caller(
                        kind,
                        reader.clone(),
                        reader_pools[t].clone(),
                        set.clone(),
                        t as u64 * 7919 + round * 31,
                        checks.clone(),
                    )
                }
            });
            row.tokens_per_s = row.pages_per_s * tokens;
            if op == Op::Exists {
                row.gb_per_s = 0.0; // no payload moves
            }
        }
        if args.cluster.mode == BenchMode::Slotmap && args.ops.contains(&Op::Backup) {
            // Slotmap overwrites the oldest way of a full bucket: the backup row's fresh pages
            // displaced part of the working set. Restore it (not measured).
            back_up_working_set(&mut owner_pools)?;
        }
        Ok(())
    })?;
    let staged = reader.stats().staged_reads - staged0;
    let wrong = checks.wrong.load(Ordering::Relaxed);
    reader.shutdown();
    for o in &owners {
        o.shutdown();
    }
    drop(owner_pools);
    drop(reader_pools);
    let mut summary = serde_json::Map::new();
    for &c in &args.load.threads.concurrency {
        for name in args.ops.iter().map(|o| o.name()) {
            let med = report::median(
                rows.iter()
                    .filter(|r| r.name == name && r.concurrency == c)
                    .map(|r| r.tokens_per_s)
                    .collect(),
            );
            summary.insert(format!("{name}_tokens_per_s/c{c}"), json!(med.round()));
        }
    }
    let hit = report::median(
        rows.iter()
            .filter(|r| r.name != "backup")
            .map(|r| r.hit_pct)
            .collect(),
    );
    summary.insert("read_hit_pct_median".into(), json!(hit));
    summary.insert("wrong_pages".into(), json!(wrong));
    summary.insert("staged_reads".into(), json!(staged));
    if wrong > 0 {
        bail!("{wrong} pages read back with another page's stamp");
    }
    Ok(Report {
        bench: "throughput".into(),
        host: Host::detect(),
        config: json!({
            "shape": shape, "cluster": args.cluster, "nodes": args.nodes,
            "page_bytes": page_bytes, "segments_per_page": shape.segments_per_page(),
            "batch_size": args.batch_size(), "concurrencies": args.load.threads.concurrency, "ops": args.ops,
            "duration": args.run.secs, "warmup": args.warmup, "rounds": args.run.rounds,
            "working_set_pages": requests * args.load.batch,
            "reader_pool_mib": args.reader_pool_mib,
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

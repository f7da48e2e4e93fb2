//! The main job (`peercache-bench` with no subcommand): an embedded two-node cluster on
//! loopback (TCP, 128 KiB pages, batch 32, MLA-shaped keys, read cache off).
//!
//! Node A (127.0.0.1) holds the read set; node B (127.0.0.2) writes and reads. Rows:
//! `raw-tcp`, `set` (B's pool empty), `set-evicting` (B's pool full; eviction notices flushed
//! and counted), `exists` (B), `get` (B, `batch_get` alone, no priming: directory lookup plus
//! transport read from A) and `exists+get`, at each concurrency, in interleaved rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use peercache_store::{PeerCacheConfig, Store};
use serde_json::json;

use crate::load::rawtcp;
use crate::load::runner::{CallOutcome, Timing};
use crate::load::sweep::{Cell, Sweep};
use crate::report::{self, Host, Report};

/// Options of the main job.
#[derive(Debug, Clone, clap::Args)]
pub struct MainArgs {
    /// Page size in bytes.
    #[arg(long, visible_alias = "page-size", default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages in the read set on node A.
    #[arg(long, visible_alias = "working-set", default_value_t = 2048)]
    pub read_pages: u64,
    /// Node B's pool in MiB (the set rows fill it).
    #[arg(long, default_value_t = 2048)]
    pub writer_pool_mib: u64,
    /// Any node setting for both nodes: `--set key=value`, repeatable (e.g.
    /// `lazy_registration=false` to measure reads through staging).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

impl Default for MainArgs {
    /// The flags' defaults (one source: the `#[arg]` attributes).
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            args: MainArgs,
        }
        <Defaults as clap::Parser>::parse_from(["peercache-bench"]).args
    }
}

/// An MLA-shaped key: a 64-hex prefix hash, the pp rank and the component.
fn mla_key(space: &str, i: u64) -> String {
    let h = peercache_wire::PageKey::from_key(&format!("{space}/{i}"));
    format!("{:032x}{:032x}_0_k", h.0, h.0.rotate_left(64))
}

/// Starts one embedded node on `ip` (TCP, metrics off, read cache off) and waits until it joined.
pub fn start_node(ip: &str, seed: &str, pool: &str) -> Result<Store> {
    start_node_with(ip, seed, pool, &[])
}

/// [`start_node`] with `key=value` overrides of any setting; returns once the node joined and
/// its pool is warm (the benches measure the steady state).
pub fn start_node_with(ip: &str, seed: &str, pool: &str, sets: &[String]) -> Result<Store> {
    let s = start_node_cold(ip, seed, pool, sets)?;
    // Measure the steady state: the pool warmed whole, no faulting threads beside the run.
    s.wait_pool_ready(Duration::from_secs(300));
    Ok(s)
}

/// [`start_node_with`] that returns as soon as the node joined, its pool perhaps still warming.
pub fn start_node_cold(ip: &str, seed: &str, pool: &str, sets: &[String]) -> Result<Store> {
    let mut cfg = json!({
        "discovery_addr": seed,
        "protocol": "tcp",
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": pool,
        "heartbeat_interval": 0.5, "member_ttl": 1.5,
        "metrics_enabled": false,
        "directory_read_cache_ttl": 0,
        "cluster_secret": crate::load::secret::generated(),
        // Bench nodes stand in for separate hosts: reads take the network path (`--set
        // host_local=true` measures shared memory between processes of one host instead).
        "host_local": false,
    });
    for kv in sets {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set {kv:?}: expected key=value"))?;
        cfg[k.trim()] = json!(v.trim());
    }
    let (cfg, _) = PeerCacheConfig::from_map(cfg.as_object().context("config object")?)?;
    let s = Store::start(cfg)?;
    s.wait_ready(Some(Duration::from_secs(20)))?;
    Ok(s)
}

/// Runs the main job.
pub fn run(args: &MainArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.load.batch as usize;
    let seed = crate::load::node::loopback_seed()?;
    let read_pool = crate::load::node::pool_for(args.read_pages, args.page_bytes);
    let a =
        start_node_with("127.0.0.1", &seed, &read_pool, &args.set).context("starting node A")?;
    let b = start_node_with(
        "127.0.0.2",
        &seed,
        &format!("{}mb", args.writer_pool_mib),
        &args.set,
    )
    .context("starting node B")?;
    if !(a.wait_members(2, Duration::from_secs(20)) && b.wait_members(2, Duration::from_secs(20))) {
        bail!("the two nodes did not see each other");
    }
    // The read set, published on A.
    let read_keys: Arc<Vec<String>> =
        Arc::new((0..args.read_pages).map(|i| mla_key("read", i)).collect());
    let src = rawtcp::prefaulted(page * batch, 17);
    for chunk in read_keys.chunks(batch) {
        let pages: Vec<&[u8]> = (0..chunk.len())
            .map(|j| &src[j * page..(j + 1) * page])
            .collect();
        let ok = a.batch_set(chunk, &pages)?;
        if !ok.iter().all(|&x| x) {
            bail!("node A could not publish the read set");
        }
    }
    // Raw-TCP baseline server, in-process like the nodes.
    let raw_buf = Arc::new(rawtcp::prefaulted((args.read_pages as usize) * page, 5));
    let raw = std::net::TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw.local_addr()?;
    std::thread::spawn(move || rawtcp::serve(raw, raw_buf));

    let sweep = Sweep::new("main", &args.run, &args.load, args.page_bytes)?;
    let max_c = sweep.max_threads();
    let mut rows = Vec::new();
    let mut extra = serde_json::Map::new();
    let next_write = Arc::new(AtomicU64::new(0));
    let n_read = args.read_pages;
    sweep.run(&mut rows, |cell| {
        let tag = cell.tag();
        cell.row("raw-tcp", |t| {
            crate::load::workload::raw_caller(raw_addr, page, batch, n_read, t as u64 * 997)
        });

        // set (empty pool) and set-evicting (full pool) on B.
        b.clear();
        let writer_pages = (args.writer_pool_mib << 20) / (args.page_bytes + 64);
        let budget = Arc::new(AtomicI64::new((writer_pages * 9 / 10) as i64));
        let src = Arc::new(rawtcp::prefaulted(page * batch * max_c, 23));
        let written: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
        // The empty-pool row has no warm-up: warming up would fill the pool.
        let cold = Timing {
            warmup: Duration::ZERO,
            measure: cell.timing().measure,
        };
        let set_row = |cell: &Cell<'_>, name: &str, limit: Option<Arc<AtomicI64>>| {
            let t = if limit.is_some() { &cold } else { cell.timing() };
            cell.measure(name, t, |t| {
                let (b, src, next, limit, written) = (
                    b.clone(),
                    src.clone(),
                    next_write.clone(),
                    limit.clone(),
                    written.clone(),
                );
                move || {
                    if let Some(l) = &limit
                        && l.fetch_sub(batch as i64, Ordering::Relaxed) < batch as i64
                    {
                        // The empty-pool budget is spent: stop rather than measure eviction.
                        return CallOutcome::stop();
                    }
                    let base = next.fetch_add(batch as u64, Ordering::Relaxed);
                    let keys: Vec<String> = (base..base + batch as u64)
                        .map(|i| mla_key("write", i))
                        .collect();
                    let off = t * batch * page;
                    let pages: Vec<&[u8]> = (0..batch)
                        .map(|j| &src[off + j * page..off + (j + 1) * page])
                        .collect();
                    match b.batch_set(&keys, &pages) {
                        Ok(r) => {
                            let ok = r.iter().filter(|&&x| x).count() as u64;
                            written.lock().extend(keys);
                            CallOutcome::done(ok, 0, ok != batch as u64)
                        }
                        Err(_) => CallOutcome::done(0, 0, true),
                    }
                }
            })
        };
        let row = set_row(cell, "set", Some(budget));
        cell.push(row);
        let ev0 = b.stats().pool_evictions;
        let row = set_row(cell, "set-evicting", None);
        cell.push(row);
        let flushed = b.flush_evictions(Duration::from_secs(10));
        let st = b.stats();
        let keys = written.lock().clone();
        let (named, stale) = b.audit(&keys)?;
        extra.insert(
            format!("set-evicting/{tag}"),
            json!({"evicted": st.pool_evictions - ev0, "notices_flushed": flushed,
                   "notices_delivered_total": st.evictions_notified, "entries_naming_b": named, "stale_entries": stale}),
        );

        // exists, get, exists+get on B over A's read set.
        let counters = [
            ("exists", true, false),
            ("get", false, true),
            ("exists+get", true, true),
        ];
        for (name, do_exists, do_get) in counters {
            let rpc0 = b.stats().directory_rpcs;
            let bytes0 = b.stats().transport_read_bytes;
            let calls = Arc::new(AtomicU64::new(0));
            let row = cell.row(name, |t| {
                let (b, keys, calls) = (b.clone(), read_keys.clone(), calls.clone());
                let mut bufs = rawtcp::prefaulted(batch * page, 3);
                let mut k = t as u64 * 613;
                move || {
                    let ks: Vec<&str> = (0..batch)
                        .map(|_| {
                            k = (k + 1) % n_read;
                            keys[k as usize].as_str()
                        })
                        .collect();
                    calls.fetch_add(1, Ordering::Relaxed);
                    let mut found = batch as u64;
                    if do_exists {
                        found = b.batch_exists(&ks).unwrap_or(0) as u64;
                    }
                    if do_get {
                        let mut dst: Vec<&mut [u8]> = bufs.chunks_mut(page).collect();
                        found = b
                            .batch_get(&ks, &mut dst)
                            .map(|r| r.iter().filter(|&&x| x).count() as u64)
                            .unwrap_or(0);
                    }
                    CallOutcome::done(found, batch as u64 - found, found != batch as u64)
                }
            });
            if !do_get {
                // exists moves no payload.
                row.gb_per_s = 0.0;
            }
            let n = calls.load(Ordering::Relaxed).max(1);
            let st = b.stats();
            extra.insert(
                format!("{name}/{tag}"),
                json!({"directory_rpcs_per_call": ((st.directory_rpcs - rpc0) as f64 / n as f64 * 100.0).round() / 100.0,
                       "transport_bytes": st.transport_read_bytes - bytes0}),
            );
        }
        Ok(())
    })?;
    let med = |name: &str| report::median_of(&rows, name, |r| r.pages_per_s);
    let get_ratio = report::ratio_of_medians(&rows, "get", "raw-tcp", args.page_bytes);
    let eg_ratio = report::ratio_of_medians(&rows, "exists+get", "raw-tcp", args.page_bytes);
    let set_evict_ratio = med("set-evicting") / med("set");
    let total_stale: u64 = extra
        .values()
        .filter_map(|v| v.get("stale_entries").and_then(|s| s.as_u64()))
        .sum();
    let t0 = Instant::now();
    a.shutdown();
    b.shutdown();
    let shutdown_ms = t0.elapsed().as_millis();
    Ok(Report {
        bench: "main".into(),
        host: Host::detect(),
        config: json!({
            "nodes": 2, "protocol": "tcp", "page_bytes": args.page_bytes, "batch": args.load.batch,
            "concurrency": args.load.threads.concurrency, "rounds": args.run.rounds, "secs": args.run.secs,
            "read_pages": args.read_pages, "writer_pool_mib": args.writer_pool_mib,
            "keys": "MLA-shaped", "directory_read_cache_ttl": 0,
        }),
        summary: json!({
            "get/raw-tcp": (get_ratio * 1000.0).round() / 1000.0,
            "exists+get/raw-tcp": (eg_ratio * 1000.0).round() / 1000.0,
            "exists_pages_per_s_median": med("exists"),
            "set_pages_per_s_median": med("set"),
            "set_evicting_pages_per_s_median": med("set-evicting"),
            "set-evicting/set": (set_evict_ratio * 1000.0).round() / 1000.0,
            "stale_directory_entries": total_stale,
            "shutdown_ms": shutdown_ms,
            "per_row": serde_json::Value::Object(extra),
        }),
        results: rows,
    })
}

impl MainArgs {
    /// Rows compared with raw-tcp use the same page size and batch.
    pub fn describe(&self) -> String {
        format!(
            "{} KiB pages, batch {}, concurrency {:?}, {} rounds",
            self.page_bytes >> 10,
            self.load.batch,
            self.load.threads.concurrency,
            self.run.rounds
        )
    }
}

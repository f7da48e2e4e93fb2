//! `micro`: the transport between two processes on loopback, beside the raw-tcp baseline.
//!
//! Rows `raw-tcp`, `tcp-read`, `tcp-write` at each page size and concurrency, in interleaved
//! rounds. The serving side is a child process (`micro-server`) so the numbers include a real
//! process boundary. With `--protocol rdma` and a verbs device in `--set device_names=…`, the
//! transport rows are `rdma-read` and `rdma-write`: the same batches one-sided over that
//! device (what `ib_read_bw` / `ib_write_bw` measure on it).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_transport::{Access, Batch, RegionHandle, RegionKey, RemoteRange, Segment};
use serde::{Deserialize, Serialize};

use crate::load::rawtcp::{self, RawClient};
use crate::load::runner::{CallOutcome, Timing, run_row};
use crate::load::verbs_transport::{self, VerbsDevice};
use crate::load::workload::CallerBuffers;
use crate::report::{self, Host, Report};

/// Options of the `micro` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct MicroArgs {
    /// Page sizes in bytes.
    #[arg(
        long,
        visible_aliases = ["page-size", "block-size", "block-sizes"],
        value_delimiter = ',',
        default_value = "4096,131072,1048576"
    )]
    pub page_sizes: Vec<u64>,
    /// Size of the serving region in MiB.
    #[arg(long, default_value_t = 256)]
    pub region_mib: u64,
    /// Which layer to measure: the bare transport (`raw-tcp`, `tcp-read`, `tcp-write`), the
    /// store (`store-get`, `store-set`: directory, pool and verification included, against a
    /// `serve` child process), or both.
    #[arg(long, value_enum, default_value_t = MicroPath::Transport)]
    pub path: MicroPath,
    /// Protocol of the store nodes (`--path store`/`both`): `tcp`, or `rdma` (with the RDMA
    /// settings in `--set`, e.g. `rdma_backend=verbs device_names=rxe0 gid_index=1`). Unset:
    /// the node default. With `rdma` and a `device_names` device, the transport rows run
    /// over that device too (`rdma-read`, `rdma-write`).
    #[arg(long, value_parser = ["tcp", "rdma"])]
    pub protocol: Option<String>,
    /// Extra node settings for the store nodes, `KEY=VALUE` (repeatable), as `peercache-node
    /// --set` takes them.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

/// The layer `micro` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MicroPath {
    /// The transport alone.
    Transport,
    /// The store on top of it.
    Store,
    /// Both, interleaved.
    Both,
}

/// What the server child announces on its first stdout line.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServerInfo {
    transport: SocketAddr,
    raw: SocketAddr,
    region_key: u64,
    base: u64,
    len: u64,
}

/// The child: serves a region over the transport and the baseline until stdin closes.
pub fn serve(region_mib: u64, device: Option<&VerbsDevice>) -> Result<()> {
    let len = (region_mib as usize) << 20;
    let t = verbs_transport::start(device, "micro-server")?;
    let mut region = rawtcp::prefaulted(len, 3);
    // SAFETY: `region` outlives the handle (both live until this function returns, and the
    // handle is dropped first).
    let h = unsafe { t.register(region.as_mut_ptr(), len, Access::RemoteReadWrite) }?;
    let raw_buf = Arc::new(rawtcp::prefaulted(len, 5));
    let raw = std::net::TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw.local_addr()?;
    std::thread::spawn(move || rawtcp::serve(raw, raw_buf));
    let info = ServerInfo {
        transport: t.local_endpoint(),
        raw: raw_addr,
        region_key: h.key().0,
        base: h.base(),
        len: h.len(),
    };
    println!("{}", serde_json::to_string(&info)?);
    // Wait for the parent to close our stdin (it exits or drops the child).
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink)? > 0 {
        sink.clear();
    }
    drop(h);
    t.shutdown();
    drop(region);
    Ok(())
}

struct ServerChild {
    child: Child,
    info: ServerInfo,
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

fn spawn_server(region_mib: u64, device: Option<&VerbsDevice>) -> Result<ServerChild> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["micro-server", "--region-mib", &region_mib.to_string()])
        .args(device.map(VerbsDevice::args).unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning the micro-server child")?;
    let out = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if line.is_empty() {
        bail!("micro-server exited before announcing its endpoints");
    }
    let info: ServerInfo =
        serde_json::from_str(line.trim()).context("parsing micro-server announcement")?;
    Ok(ServerChild { child, info })
}

/// A `peercache-bench serve` child that published `pages` pages of `page` bytes, and an
/// in-process node joined to it.
struct StorePair {
    child: Child,
    owner: String,
    reader: peercache_store::Store,
    page: u64,
    pages: usize,
}

impl Drop for StorePair {
    fn drop(&mut self) {
        self.reader.shutdown();
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The store nodes' extra settings: `--protocol` and every `--set`, as `--set` arguments and as
/// a settings map.
fn node_settings(
    args: &MicroArgs,
) -> Result<(Vec<String>, serde_json::Map<String, serde_json::Value>)> {
    let mut items = args.set.clone();
    if let Some(p) = &args.protocol {
        items.push(format!("protocol={p}"));
    }
    let map = peercache_store::config::parse_overrides(&items)?;
    Ok((items, map))
}

fn spawn_store_pair(page: u64, pages: usize, args: &MicroArgs) -> Result<StorePair> {
    let (items, settings) = node_settings(args)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.1:{port}");
    let owner = format!("micro-owner-{page}");
    let pool = (pages as u64 * (page + 4096) * 3 / 2).max(64 << 20);
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "--stop-on-stdin-eof", "--discovery-addr", &seed])
        .args(["--host", "127.0.0.1", "--preload", &pages.to_string()])
        .args(["--page-bytes", &page.to_string()])
        .args(["--set", &format!("node_id={owner}")])
        .args(["--set", &format!("global_segment_size={pool}")])
        .args(["--set", "metrics_enabled=false"])
        .args(items.iter().flat_map(|kv| ["--set", kv.as_str()]))
        .env(crate::load::secret::ENV, crate::load::secret::generated())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning the serve child")?;
    let out = child.stdout.take().context("child stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    if !line.starts_with(&format!("READY {owner} {pages}")) {
        bail!("serve child: unexpected first line {line:?}");
    }
    let reader = crate::cmd::throughput::start_node(
        "127.0.0.2",
        &seed,
        (pages as u64 * (page + 4096) * 4).max(256 << 20),
        &settings,
    )?;
    if !reader.wait_members(2, Duration::from_secs(20)) {
        bail!("the reader did not see the serve child");
    }
    Ok(StorePair {
        child,
        owner,
        reader,
        page,
        pages,
    })
}

/// The `store-get` and `store-set` rows at one page size and concurrency.
fn store_rows(
    pair: &StorePair,
    local: &Arc<CallerBuffers>,
    args: &MicroArgs,
    conc: u64,
    round: u64,
    timing: &Timing,
) -> Vec<crate::report::Row> {
    let (page, pages) = (pair.page, pair.pages);
    let batch = args.load.batch as usize;
    let keys: Arc<Vec<String>> = Arc::new(
        (0..pages)
            .map(|i| crate::cmd::serve::key_for(&pair.owner, i))
            .collect(),
    );
    let get = run_row(
        "store-get",
        page,
        args.load.batch,
        conc,
        round,
        timing,
        |t| {
            crate::load::workload::registered_get_caller(
                pair.reader.clone(),
                keys.clone(),
                local.clone(),
                page as usize,
                batch,
                t,
                t as u64 * 1000,
            )
        },
    );
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let src = Arc::new(rawtcp::prefaulted(
        batch * page as usize * conc as usize,
        29,
    ));
    let set = run_row(
        "store-set",
        page,
        args.load.batch,
        conc,
        round,
        timing,
        |t| {
            crate::load::workload::set_caller(
                pair.reader.clone(),
                src.clone(),
                format!("micro-set/{page}/r{round}"),
                next.clone(),
                page as usize,
                batch,
                t,
            )
        },
    );
    vec![get, set]
}

/// Runs the `micro` subcommand.
pub fn run(args: &MicroArgs) -> Result<Report> {
    // The transport rows go over RDMA when asked for with a verbs device.
    let device = match args.protocol.as_deref() {
        Some("rdma") => VerbsDevice::from_settings(&args.set)?,
        _ => None,
    };
    let (read_row, write_row) = if device.is_some() {
        ("rdma-read", "rdma-write")
    } else {
        ("tcp-read", "tcp-write")
    };
    let server = spawn_server(args.region_mib, device.as_ref())?;
    let info = &server.info;
    let max_page = *args.page_sizes.iter().max().context("no page sizes")? as usize;
    let max_conc = *args
        .load
        .threads
        .concurrency
        .iter()
        .max()
        .context("no concurrency")? as usize;
    let batch = args.load.batch as usize;
    let slot = batch * max_page;
    let client = Arc::new(verbs_transport::start(device.as_ref(), "micro-client")?);
    let mut local = rawtcp::prefaulted(slot * max_conc, 9);
    let local_ptr = local.as_mut_ptr() as u64;
    // SAFETY: `local` is dropped after `handle` at the end of this function.
    let handle: Arc<RegionHandle> =
        Arc::new(unsafe { client.register(local.as_mut_ptr(), local.len(), Access::LocalOnly) }?);
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.run.secs),
    };
    let mut rows = Vec::new();
    let mut allocs = serde_json::Map::new();
    let transport = args.path != MicroPath::Store;
    // Store rows: one serve child per page size (its pages have that size), kept for all rounds.
    let mut pairs = Vec::new();
    let store_bufs = Arc::new(CallerBuffers::new(max_conc, slot));
    if args.path != MicroPath::Transport {
        for &page in &args.page_sizes {
            let pages = ((args.region_mib << 20) / page).clamp(args.load.batch, 4096) as usize;
            let pair = spawn_store_pair(page, pages, args)?;
            // SAFETY: `store_bufs` outlives every pair (the pairs, which shut their reader
            // down, are dropped first, below).
            unsafe { store_bufs.register(&pair.reader) }?;
            pairs.push(pair);
        }
    }
    for round in 0..args.run.rounds {
        for &page in &args.page_sizes {
            let pages_in_region = (info.len / page).max(1);
            for &conc in &args.load.threads.concurrency {
                if let Some(pair) = pairs.iter().find(|p| p.page == page) {
                    rows.extend(store_rows(pair, &store_bufs, args, conc, round, &timing));
                }
                if !transport {
                    continue;
                }
                // raw-tcp
                let raw_addr = info.raw;
                let row = run_row(
                    "raw-tcp",
                    page,
                    args.load.batch,
                    conc,
                    round,
                    &timing,
                    |t| {
                        let mut c = RawClient::connect(raw_addr).expect("connect raw-tcp");
                        let mut dst = rawtcp::prefaulted(batch * page as usize, 1);
                        let mut offsets = vec![0u64; batch];
                        let mut k = (t as u64) * 1000;
                        move || {
                            for o in offsets.iter_mut() {
                                *o = (k % pages_in_region) * page;
                                k += 1;
                            }
                            let error = c.batch(&offsets, page as usize, &mut dst).is_err();
                            CallOutcome::done(if error { 0 } else { batch as u64 }, 0, error)
                        }
                    },
                );
                rows.push(row);
                for (name, write) in [(read_row, false), (write_row, true)] {
                    let a0 = crate::load::alloc::count();
                    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let row = run_row(name, page, args.load.batch, conc, round, &timing, |t| {
                        let client = client.clone();
                        let handle = handle.clone();
                        let calls = calls.clone();
                        let peer = info.transport;
                        let (rkey, rbase) = (RegionKey(info.region_key), info.base);
                        let dst_base = local_ptr + (t * slot) as u64;
                        let mut b = Batch::with_capacity(batch, batch);
                        let mut k = (t as u64) * 1000;
                        move || {
                            b.clear();
                            for i in 0..batch as u64 {
                                b.push(
                                    RemoteRange {
                                        region: rkey,
                                        addr: rbase + (k % pages_in_region) * page,
                                        len: page as u32,
                                    },
                                    &[Segment {
                                        region: handle.key(),
                                        addr: dst_base + i * page,
                                        len: page as u32,
                                    }],
                                );
                                k += 1;
                            }
                            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let res = if write {
                                client.write_batch(peer, &b)
                            } else {
                                client.read_batch(peer, &b)
                            };
                            match res {
                                Ok(r) => {
                                    let ok = r.iter().filter(|x| x.is_ok()).count() as u64;
                                    CallOutcome::done(ok, 0, ok != batch as u64)
                                }
                                Err(_) => CallOutcome::done(0, 0, true),
                            }
                        }
                    });
                    let n = calls.load(std::sync::atomic::Ordering::Relaxed).max(1);
                    let per_batch = (crate::load::alloc::count() - a0) as f64 / n as f64;
                    allocs.insert(
                        format!("{name}/{page}/c{conc}/r{round}"),
                        serde_json::json!((per_batch * 100.0).round() / 100.0),
                    );
                    rows.push(row);
                }
                eprintln!(
                    "micro: round {round} page {page} conc {conc} done (load {:.2})",
                    report::load_1m()
                );
            }
        }
    }
    drop(pairs);
    drop(store_bufs);
    drop(handle);
    drop(local);
    let mut summary = serde_json::Map::new();
    let mut names = Vec::new();
    if transport {
        names.extend([read_row, write_row]);
    }
    if args.path != MicroPath::Transport {
        names.extend(["store-get", "store-set"]);
    }
    for &page in &args.page_sizes {
        if !transport {
            for name in &names {
                let med = report::median(
                    rows.iter()
                        .filter(|r| r.name == *name && r.page_bytes == page)
                        .map(|r| r.pages_per_s)
                        .collect(),
                );
                summary.insert(
                    format!("{name}_pages_per_s@{page}"),
                    serde_json::json!(med.round()),
                );
            }
            continue;
        }
        for name in &names {
            summary.insert(
                format!("{name}/raw-tcp@{page}"),
                serde_json::json!(
                    (report::ratio_of_medians(&rows, name, "raw-tcp", page) * 1000.0).round()
                        / 1000.0
                ),
            );
        }
    }
    summary.insert("allocs_per_batch".into(), serde_json::Value::Object(allocs));
    Ok(Report {
        bench: "micro".into(),
        host: Host::detect(),
        config: serde_json::json!({
            "page_sizes": args.page_sizes, "concurrency": args.load.threads.concurrency, "batch": args.load.batch,
            "rounds": args.run.rounds, "secs": args.run.secs, "region_mib": args.region_mib,
            "processes": 2, "transport": "tcp", "path": format!("{:?}", args.path).to_lowercase(),
        }),
        results: rows,
        summary: serde_json::Value::Object(summary),
    })
}

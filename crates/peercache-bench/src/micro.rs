//! `micro`: the transport between two processes on loopback, beside the raw-tcp baseline.
//!
//! Rows `raw-tcp`, `tcp-read`, `tcp-write` at each page size and concurrency, in interleaved
//! rounds. The serving side is a child process (`micro-server`) so the numbers include a real
//! process boundary.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_transport::{
    Access, Batch, RegionHandle, RegionKey, RemoteRange, Segment, TcpTransport, TransportConfig,
};
use serde::{Deserialize, Serialize};

use crate::rawtcp::{self, RawClient};
use crate::report::{self, Host, Report};
use crate::runner::{CallOutcome, Timing, run_row};

/// Options of the `micro` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct MicroArgs {
    /// Page sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "4096,131072,1048576")]
    pub page_sizes: Vec<u64>,
    /// Caller threads.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub concurrency: Vec<u64>,
    /// Pages per batch.
    #[arg(long, default_value_t = 32)]
    pub batch: u64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: u64,
    /// Seconds measured per row.
    #[arg(long, default_value_t = 0.5)]
    pub secs: f64,
    /// Size of the serving region in MiB.
    #[arg(long, default_value_t = 256)]
    pub region_mib: u64,
    /// Write the report here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
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
pub fn serve(region_mib: u64) -> Result<()> {
    let len = (region_mib as usize) << 20;
    let t = TcpTransport::start(TransportConfig::default(), None)?;
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

fn spawn_server(region_mib: u64) -> Result<ServerChild> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["micro-server", "--region-mib", &region_mib.to_string()])
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

/// Runs the `micro` subcommand.
pub fn run(args: &MicroArgs) -> Result<Report> {
    let server = spawn_server(args.region_mib)?;
    let info = &server.info;
    let max_page = *args.page_sizes.iter().max().context("no page sizes")? as usize;
    let max_conc = *args.concurrency.iter().max().context("no concurrency")? as usize;
    let batch = args.batch as usize;
    let slot = batch * max_page;
    let client = Arc::new(TcpTransport::start(TransportConfig::default(), None)?);
    let mut local = rawtcp::prefaulted(slot * max_conc, 9);
    let local_ptr = local.as_mut_ptr() as u64;
    // SAFETY: `local` is dropped after `handle` at the end of this function.
    let handle: Arc<RegionHandle> =
        Arc::new(unsafe { client.register(local.as_mut_ptr(), local.len(), Access::LocalOnly) }?);
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.secs),
    };
    let mut rows = Vec::new();
    let mut allocs = serde_json::Map::new();
    for round in 0..args.rounds {
        for &page in &args.page_sizes {
            let pages_in_region = (info.len / page).max(1);
            for &conc in &args.concurrency {
                // raw-tcp
                let raw_addr = info.raw;
                let row = run_row("raw-tcp", page, args.batch, conc, round, &timing, |t| {
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
                });
                rows.push(row);
                for (name, write) in [("tcp-read", false), ("tcp-write", true)] {
                    let a0 = crate::alloc::count();
                    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let row = run_row(name, page, args.batch, conc, round, &timing, |t| {
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
                    let per_batch = (crate::alloc::count() - a0) as f64 / n as f64;
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
    drop(handle);
    drop(local);
    let mut summary = serde_json::Map::new();
    for &page in &args.page_sizes {
        for name in ["tcp-read", "tcp-write"] {
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
            "page_sizes": args.page_sizes, "concurrency": args.concurrency, "batch": args.batch,
            "rounds": args.rounds, "secs": args.secs, "region_mib": args.region_mib,
            "processes": 2, "transport": "tcp",
        }),
        results: rows,
        summary: serde_json::Value::Object(summary),
    })
}

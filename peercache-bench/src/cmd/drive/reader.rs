//! `drive-reader`: the reader child process `drive` starts on each reader host: it joins the
//! cluster, waits for the working set, then measures one step per line on stdin.

use super::devpool::{self, DevicePool};
use crate::cmd::throughput::{Op, start_node};
use crate::load::runner::{Timing, run_row_counts};
use crate::load::sglang::{self, Checks, HostPool};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{DriveCommon, requests};

/// Options of the hidden reader child.
#[derive(Debug, Clone, clap::Args)]
pub struct ReaderArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: DriveCommon,
    /// Seed list.
    #[arg(long)]
    pub seed: String,
    /// This reader's address.
    #[arg(long)]
    pub host: String,
    /// Seconds of warm-up per step.
    #[arg(long, value_parser = peercache_store::tools::secs::seconds)]
    pub warmup: f64,
    /// Seconds measured per step.
    #[arg(long, value_parser = peercache_store::tools::secs::positive_seconds)]
    pub duration: f64,
    /// This reader's index among the reader processes (picks its GPU with `--gpu`).
    #[arg(long, default_value_t = 0)]
    pub index: usize,
}

/// What a reader prints after each step.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StepResult {
    pub(super) pages: u64,
    pub(super) misses: u64,
    pub(super) errors: u64,
    pub(super) secs: f64,
    pub(super) wrong: u64,
    pub(super) staged: u64,
    /// Payload bytes this reader's node read over RDMA during the step.
    #[serde(default)]
    pub(super) rdma_bytes: u64,
    /// Directory requests this reader's node sent over the network during the step (0 when
    /// its own shard answered every lookup).
    #[serde(default)]
    pub(super) directory_rpcs: u64,
    /// (µs, count) of every recorded latency bucket.
    pub(super) hist: Vec<(u64, u64)>,
}

/// What a reader prints after a `STREAM` step.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StreamResult {
    pub(super) bytes: u64,
    pub(super) secs: f64,
}

/// The reader child: joins, waits for the working set, then runs one step per `GO <threads>`
/// line on stdin and answers each with a `StepResult` line.
pub fn reader(args: &ReaderArgs) -> Result<()> {
    let c = &args.common;
    c.shape.validate()?;
    let kind = match c.op {
        Op::Prefetch => sglang::ReadKind::Prefetch,
        Op::Get => sglang::ReadKind::Get,
        Op::Exists => sglang::ReadKind::Exists,
        Op::Backup => bail!("drive measures reads: --op prefetch, get or exists"),
    };
    let page = c.shape.page_bytes();
    let store = start_node(&args.host, &args.seed, 64 << 20, &c.cluster.settings(page))
        .context("starting a reader")?;
    let set = sglang::working_set(&c.shape, requests(c), c.batch_size);
    // Ready when the last request is fully visible (it was backed up last).
    let last = set.last().context("empty working set")?;
    let deadline = std::time::Instant::now() + Duration::from_secs_f64(c.connect_timeout.max(0.0));
    while store.batch_exists(last)? < last.len() {
        if std::time::Instant::now() > deadline {
            bail!(
                "the working set did not appear within --connect-timeout {} s",
                c.connect_timeout
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "JOINED {}", store.node_id())?;
    out.flush()?;
    let timing = Timing {
        warmup: Duration::from_secs_f64(args.warmup),
        measure: Duration::from_secs_f64(args.duration),
    };
    let mut pools: Vec<Arc<HostPool>> = Vec::new();
    let mut dev_pools: Vec<Arc<DevicePool>> = Vec::new();
    let gpu = if c.gpu {
        let cuda = crate::cmd::drive::cuda::Cuda::load().context("--gpu")?;
        let count = cuda.device_count().context("--gpu")?;
        if count == 0 {
            bail!("--gpu: the CUDA runtime sees no GPU");
        }
        Some((cuda, (c.gpu_device + args.index) % count))
    } else {
        None
    };
    let checks = Arc::new(Checks::default());
    let stdin = std::io::stdin();
    let mut line = String::new();
    let mut step = 0u64;
    while stdin.lock().read_line(&mut line)? > 0 {
        if let Some(rest) = line.trim().strip_prefix("STREAM ") {
            // The one-way stream floor: `STREAM <connections> <address> <ring bytes>`.
            let mut w = rest.split_whitespace();
            let n: usize = w.next().context("STREAM <connections>")?.parse()?;
            let addr: std::net::SocketAddr = w.next().context("STREAM … <address>")?.parse()?;
            let ring: usize = w.next().context("STREAM … <ring bytes>")?.parse()?;
            line.clear();
            let (bytes, secs) =
                crate::load::rawtcp::stream_read(addr, n, ring, timing.warmup, timing.measure)
                    .context("the raw-tcp stream")?;
            writeln!(
                out,
                "{}",
                serde_json::to_string(&StreamResult { bytes, secs })?
            )?;
            out.flush()?;
            continue;
        }
        let threads: usize = match line.trim().strip_prefix("GO ") {
            Some(t) => t.parse().context("GO <threads>")?,
            None => break,
        };
        line.clear();
        match &gpu {
            None => {
                while pools.len() < threads {
                    let p = Arc::new(HostPool::new(&c.shape, c.batch_size));
                    // SAFETY: the pools are dropped after the node is shut down, below.
                    unsafe { p.register(&store) }?;
                    pools.push(p);
                }
            }
            Some((cuda, device)) => {
                while dev_pools.len() < threads {
                    let len = c.batch_size * c.shape.page_bytes() as usize;
                    let arena = crate::cmd::drive::cuda::CudaArena::new(
                        cuda.clone(),
                        *device,
                        len,
                        c.gpu_register,
                    )
                    .with_context(|| format!("--gpu: allocating {len} bytes on GPU {device}"))?;
                    let p = Arc::new(DevicePool::new(Box::new(arena), &c.shape, c.batch_size)?);
                    // SAFETY: the pools are dropped after the node is shut down, below.
                    unsafe { p.register(&store) }?;
                    dev_pools.push(p);
                }
            }
        }
        let wrong0 = checks.wrong.load(Ordering::Relaxed);
        let (staged0, rdma0, rpcs0) = {
            let s = store.stats();
            (s.staged_reads, s.rdma_read_bytes, s.directory_rpcs)
        };
        let (_, counts) = run_row_counts(
            "prefetch",
            page,
            c.batch_size as u64,
            threads as u64,
            0,
            &timing,
            |t| -> Box<dyn FnMut() -> crate::load::runner::CallOutcome + Send> {
                let start = t as u64 * 7919 + step * 31 + u64::from(std::process::id());
                // SAFETY: pool `t` is registered, used by this caller only and outlives the node.
                unsafe {
                    if gpu.is_some() {
                        Box::new(devpool::device_read_caller(
                            kind,
                            store.clone(),
                            dev_pools[t].clone(),
                            set.clone(),
                            start,
                            checks.clone(),
                        ))
                    } else {
                        Box::new(sglang::read_caller(
                            kind,
                            store.clone(),
                            pools[t].clone(),
                            set.clone(),
                            start,
                            checks.clone(),
                        ))
                    }
                }
            },
        );
        step += 1;
        let r = StepResult {
            pages: counts.pages,
            misses: counts.misses,
            errors: counts.errors,
            secs: counts.elapsed.as_secs_f64(),
            wrong: checks.wrong.load(Ordering::Relaxed) - wrong0,
            staged: store.stats().staged_reads - staged0,
            rdma_bytes: store.stats().rdma_read_bytes - rdma0,
            directory_rpcs: store.stats().directory_rpcs - rpcs0,
            hist: counts
                .hist
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        };
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
        out.flush()?;
    }
    store.shutdown();
    drop(pools);
    drop(dev_pools);
    Ok(())
}

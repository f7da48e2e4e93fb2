//! `drive`: the SGLang-shaped prefetch workload across processes (or hosts).
//!
//! One owner process backs up the working set; `--processes N` reader processes, each its own
//! node on its own loopback address, run the prefetch path (exists → get into registered host
//! slots) in lock-step steps — the parent sends `GO`, every reader measures for `--duration`
//! and answers with its counts and its raw latency histogram — and the parent merges them into
//! one row per step. Across hosts: start `drive --owner-only --host <ip>` on one host and
//! `drive --discovery-addr <ip>:<port>` with the same shape options on another.

pub mod cuda;
pub mod devpool;
pub mod reader;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::cmd::throughput::{ClusterArgs, Op, owner_pool_bytes, start_node};
use crate::load::child::ChildProc;
use crate::load::runner::{RowCounts, fold_row};
use crate::load::sglang::{self, HostPool, ShapeArgs};
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report};
pub use reader::{ReaderArgs, reader};
use reader::{StepResult, StreamResult};

/// Options every drive process shares (they must agree for the keys to match).
#[derive(Debug, Clone, clap::Args)]
pub struct DriveCommon {
    /// Model and host-pool shape.
    #[command(flatten)]
    pub shape: ShapeArgs,
    /// Cluster options.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// What readers do per request: prefetch (exists → get), get, or exists.
    #[arg(long, value_enum, default_value_t = Op::Prefetch)]
    pub op: Op,
    /// Pages per request (one prefetch call).
    #[arg(long, default_value_t = 32)]
    pub batch_size: usize,
    /// Pages in the working set (rounded up to whole requests).
    #[arg(long, default_value_t = 1024)]
    pub working_set: u64,
    /// Seconds a reader waits for the working set to appear (the owner to join and publish).
    #[arg(long, default_value_t = 30.0, value_parser = peercache_store::tools::secs::seconds)]
    pub connect_timeout: f64,
    /// Readers read into GPU memory (GPUDirect RDMA: one-sided READ straight into the device,
    /// every page's stamp checked by one strided copy back). Needs `--protocol rdma`, a bench
    /// built with `--features rdma` and a CUDA runtime (`PEERCACHE_CUDART` names its path).
    #[arg(long)]
    pub gpu: bool,
    /// With `--gpu`: the first GPU; reader process i uses GPU (first + i) mod the GPU count.
    #[arg(long, default_value_t = 0)]
    pub gpu_device: usize,
    /// With `--gpu`: how the NIC reaches GPU memory — auto (a dma-buf if the driver exports
    /// one, else the device address), dmabuf, or peermem (the nvidia-peermem module).
    #[arg(long, value_enum, default_value_t = crate::cmd::drive::cuda::GpuRegister::Auto)]
    pub gpu_register: crate::cmd::drive::cuda::GpuRegister,
}

/// Options of `drive`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("secs", |a| a.default_value("1")))]
#[command(mut_arg("concurrency", |a| a.default_value("1,2")))]
pub struct DriveArgs {
    /// Shared options.
    #[command(flatten)]
    pub common: DriveCommon,
    /// Reader processes.
    #[arg(long, default_value_t = 2)]
    pub processes: usize,
    /// Caller threads per reader process, one step each (the shared flag).
    #[command(flatten)]
    pub threads: crate::load::rows::Threads,
    /// Seconds of warm-up per step.
    #[arg(long, default_value_t = 0.2, value_parser = peercache_store::tools::secs::seconds)]
    pub warmup: f64,
    /// Interleaved rounds, seconds measured per step and the JSON output (the shared run
    /// flags).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Join this cluster (whose owner runs `drive --owner-only`) instead of starting an owner.
    #[arg(long)]
    pub discovery_addr: Option<String>,
    /// Run only the owner: join or seed at `--host`, back up the working set, serve until
    /// standard input closes or a signal arrives.
    #[arg(long)]
    pub owner_only: bool,
    /// This process's address (owner: the seed address; readers against a spawned owner:
    /// 127.0.0.N+1…, one each; readers against `--discovery-addr`: this address, shared).
    #[arg(long, visible_alias = "local-host", default_value = "127.0.0.1")]
    pub host: String,
    /// The owner's discovery port (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

fn requests(c: &DriveCommon) -> u64 {
    c.working_set.div_ceil(c.batch_size as u64).max(1)
}

/// Starts the owner node at `host:port` (its own seed unless `seed` is given) and backs up the
/// working set. Returns the node, its host pool (which must outlive it) and the seed address.
fn start_owner(
    c: &DriveCommon,
    host: &str,
    port: u16,
    seed: Option<&str>,
) -> Result<(peercache_store::Store, HostPool, String)> {
    c.shape.validate()?;
    let port = if port == 0 {
        std::net::TcpListener::bind((host, 0))?.local_addr()?.port()
    } else {
        port
    };
    let seed = seed.map_or_else(|| format!("{host}:{port}"), str::to_string);
    let page = c.shape.page_bytes();
    let n = requests(c);
    let store = start_node(
        host,
        &seed,
        owner_pool_bytes(n * c.batch_size as u64, page),
        &c.cluster.settings(page),
    )
    .context("starting the owner")?;
    let mut pool = HostPool::new(&c.shape, c.batch_size);
    // SAFETY: the caller keeps the pool until after the node is shut down.
    unsafe { pool.register(&store) }?;
    let set = sglang::working_set(&c.shape, n, c.batch_size);
    sglang::backup_all(&store, &mut pool, &set)?;
    Ok((store, pool, seed))
}

/// The flags that rebuild `c` in a child.
fn common_flags(c: &DriveCommon) -> Vec<String> {
    let s = &c.shape;
    let layout = match s.layout {
        sglang::Layout::Mla => "mla",
        sglang::Layout::Mha => "mha",
    };
    let host_layout = match s.host_layout {
        sglang::HostLayout::PageFirst => "page-first",
        sglang::HostLayout::LayerFirst => "layer-first",
    };
    let mode = match c.cluster.mode {
        crate::cmd::throughput::BenchMode::P2p => "p2p",
        crate::cmd::throughput::BenchMode::Slotmap => "slotmap",
    };
    let mut v: Vec<String> = [
        ("--layout", layout.to_string()),
        ("--host-layout", host_layout.to_string()),
        ("--tokens-per-page", s.tokens_per_page.to_string()),
        ("--layers", s.layers.to_string()),
        ("--kv-heads", s.kv_heads.to_string()),
        ("--head-dim", s.head_dim.to_string()),
        ("--mla-dim", s.mla_dim.to_string()),
        ("--dtype-bytes", s.dtype_bytes.to_string()),
        ("--model", s.model.clone()),
        ("--mode", mode.to_string()),
        ("--protocol", c.cluster.protocol.clone()),
        ("--batch-size", c.batch_size.to_string()),
        ("--working-set", c.working_set.to_string()),
        ("--connect-timeout", c.connect_timeout.to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect();
    if !c.cluster.devices.is_empty() {
        v.extend(["--devices".to_string(), c.cluster.devices.clone()]);
    }
    v.extend(["--op".to_string(), c.op.name().to_string()]);
    if let Some(ttl) = c.cluster.dir_cache_ttl {
        v.extend(["--dir-cache-ttl".to_string(), ttl.to_string()]);
    }
    if let Some(n) = c.cluster.max_channels {
        v.extend(["--max-channels".to_string(), n.to_string()]);
    }
    for kv in &c.cluster.set {
        v.extend(["--set".to_string(), kv.clone()]);
    }
    if c.gpu {
        let register = match c.gpu_register {
            crate::cmd::drive::cuda::GpuRegister::Auto => "auto",
            crate::cmd::drive::cuda::GpuRegister::Dmabuf => "dmabuf",
            crate::cmd::drive::cuda::GpuRegister::Peermem => "peermem",
        };
        v.push("--gpu".to_string());
        v.extend(["--gpu-device".to_string(), c.gpu_device.to_string()]);
        v.extend(["--gpu-register".to_string(), register.to_string()]);
    }
    v
}

/// What `--gpu` needs, checked before any process starts: a read that moves pages, the RDMA
/// protocol on verbs, a build with RDMA, and a CUDA runtime that sees a GPU.
fn check_gpu(c: &DriveCommon) -> Result<()> {
    if c.op == Op::Exists {
        bail!("--gpu: --op exists moves no pages; use --op get or prefetch");
    }
    let settings = c.cluster.settings(c.shape.page_bytes());
    let text = |k: &str, default: &'static str| {
        settings
            .get(k)
            .and_then(|v| v.as_str())
            .unwrap_or(default)
            .to_string()
    };
    let protocol = text("protocol", "tcp");
    if protocol != "rdma" {
        bail!(
            "--gpu reads into GPU memory over RDMA only (GPUDirect); this run's protocol is \
             {protocol}: add --protocol rdma"
        );
    }
    if text("rdma_backend", "verbs") != "verbs" {
        bail!("--gpu needs rdma_backend=verbs (the software fabric joins nodes of one process)");
    }
    if !cfg!(feature = "rdma") {
        bail!("--gpu: this bench was built without RDMA support; rebuild with --features rdma");
    }
    let cuda = crate::cmd::drive::cuda::Cuda::load().context("--gpu")?;
    if cuda.device_count().context("--gpu")? == 0 {
        bail!("--gpu: the CUDA runtime sees no GPU");
    }
    Ok(())
}

fn next_host(host: &str, i: usize) -> Result<String> {
    let ip: std::net::Ipv4Addr = host.parse().context("--host must be an IPv4 address")?;
    let o = ip.octets();
    let last = u16::from(o[3]) + i as u16;
    if last > 254 {
        bail!("too many processes for addresses after {host}");
    }
    Ok(format!("{}.{}.{}.{last}", o[0], o[1], o[2]))
}

/// Runs `drive` (or, with `--owner-only`, its owner).
pub fn run(args: &DriveArgs) -> Result<Option<Report>> {
    let c = &args.common;
    c.shape.validate()?;
    c.cluster.validate()?;
    if c.op == Op::Backup {
        bail!("drive measures reads: --op prefetch, get or exists");
    }
    if c.gpu && !args.owner_only {
        check_gpu(c)?;
    }
    if args.owner_only {
        peercache_store::tools::cli::block_signals();
        let (store, pool, seed) =
            start_owner(c, &args.host, args.port, args.discovery_addr.as_deref())?;
        // The one-way streams of `--op get` runs: from a 1 MiB buffer (`raw-tcp/stream-xN`,
        // hot in cache) and from one the size of the working set (`raw-tcp/stream-ws-xN`: as
        // much distinct memory as the owner's pages).
        let mut addrs = Vec::new();
        let ws_bytes = (requests(c) * c.batch_size as u64 * c.shape.page_bytes()) as usize;
        for len in [1 << 20, if c.op == Op::Get { ws_bytes } else { 1 << 20 }] {
            let stream = std::net::TcpListener::bind((args.host.as_str(), 0))?;
            addrs.push(stream.local_addr()?);
            let buf = Arc::new(crate::load::rawtcp::prefaulted_huge(len, 11));
            std::thread::spawn(move || crate::load::rawtcp::serve_stream(stream, buf));
        }
        println!("OWNER {} {seed} {} {}", store.node_id(), addrs[0], addrs[1]);
        std::io::stdout().flush()?;
        std::thread::spawn(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {
                sink.clear();
            }
            // SAFETY: sending SIGTERM to our own process (process-directed, so the thread that
            // waits for signals receives it).
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        });
        peercache_store::tools::cli::wait_for_signal();
        store.shutdown();
        drop(pool);
        return Ok(None);
    }
    if args.processes == 0 || args.threads.concurrency.is_empty() {
        bail!("--processes and --concurrency must be positive");
    }
    // The owner: a child process, unless we join a cluster that has one.
    let mut owner = None;
    // The hot stream's address and the working-set stream's.
    let mut stream_addr: Option<(String, String)> = None;
    let seed = match &args.discovery_addr {
        Some(s) => s.clone(),
        None => {
            let mut flags = vec!["drive".to_string(), "--owner-only".into()];
            flags.extend(["--host".into(), args.host.clone()]);
            flags.extend(common_flags(c));
            let p = ChildProc::spawn("the owner".into(), &flags)?;
            let l = p.line(Duration::from_secs(120))?;
            let seed = l
                .split_whitespace()
                .nth(2)
                .filter(|_| l.starts_with("OWNER "))
                .with_context(|| format!("unexpected owner line {l:?}"))?
                .to_string();
            let mut w = l.split_whitespace().skip(3);
            stream_addr = w
                .next()
                .zip(w.next())
                .map(|(a, b)| (a.to_string(), b.to_string()));
            owner = Some(p);
            seed
        }
    };
    let first_reader = if args.discovery_addr.is_some() { 0 } else { 1 };
    let mut readers = Vec::new();
    for i in 0..args.processes {
        // Loopback runs give every reader its own 127.0.0.N; against another host's owner all
        // readers share this host's address (their ports are picked freely).
        let host = if args.discovery_addr.is_some() {
            args.host.clone()
        } else {
            next_host(&args.host, first_reader + i)?
        };
        let mut flags = vec!["drive-reader".to_string(), "--index".into(), i.to_string()];
        flags.extend(["--seed".into(), seed.clone(), "--host".into(), host.clone()]);
        flags.extend(["--warmup".into(), args.warmup.to_string()]);
        flags.extend(["--duration".into(), args.run.secs.to_string()]);
        flags.extend(common_flags(c));
        readers.push(ChildProc::spawn(format!("reader {host}"), &flags)?);
    }
    for r in &readers {
        let l = r.line(Duration::from_secs(60))?;
        if !l.starts_with("JOINED ") {
            bail!("{}: unexpected line {l:?}", r.name);
        }
    }
    let page = c.shape.page_bytes();
    let tokens = c.shape.tokens_per_page as f64;
    let step_wait = Duration::from_secs_f64(args.warmup + args.run.secs + 60.0);
    let mut rows = Vec::new();
    let (mut wrong, mut staged, mut rdma_bytes) = (0u64, 0u64, 0u64);
    // Per step: directory requests the readers sent over the network, per call.
    let mut rpcs_per_call: Vec<(u64, f64)> = Vec::new();
    // One step per (round, threads per reader): every reader process measures with that many
    // threads, and the step's row is their merged counts.
    let sweep = Sweep::of(
        "drive",
        args.run.rounds,
        &args.threads.concurrency,
        page,
        c.batch_size as u64,
        args.run.secs,
    )?;
    sweep.run(&mut rows, |cell| {
        let (round, threads) = (cell.round, cell.threads);
        for r in readers.iter_mut() {
            r.send(&format!("GO {threads}"))?;
        }
        let mut merged = RowCounts {
            hist: crate::report::hist::new(),
            pages: 0,
            misses: 0,
            errors: 0,
            elapsed: Duration::ZERO,
        };
        let mut step_rpcs = 0u64;
        for r in &readers {
            let l = r.line(step_wait)?;
            let s: StepResult = serde_json::from_str(&l)
                .with_context(|| format!("{}: bad step line {l:?}", r.name))?;
            step_rpcs += s.directory_rpcs;
            for (v, n) in s.hist {
                merged.hist.record_n(v.clamp(1, 60_000_000), n)?;
            }
            merged.pages += s.pages;
            merged.misses += s.misses;
            merged.errors += s.errors;
            merged.elapsed = merged.elapsed.max(Duration::from_secs_f64(s.secs));
            wrong += s.wrong;
            staged += s.staged;
            rdma_bytes += s.rdma_bytes;
        }
        let mut row = fold_row(
            &format!("drive-{}", c.op.name()),
            page,
            c.batch_size as u64,
            threads * args.processes as u64,
            round,
            &merged,
        );
        row.tokens_per_s = row.pages_per_s * tokens;
        let calls = (merged.pages + merged.misses).div_ceil(c.batch_size.max(1) as u64);
        rpcs_per_call.push((
            threads * args.processes as u64,
            step_rpcs as f64 / calls.max(1) as f64,
        ));
        if c.op == Op::Exists {
            row.gb_per_s = 0.0; // no payload moves
        }
        cell.push(row);
        // `--op get`: the one-way streams over as many connections, right after: hot (a
        // 1 MiB buffer each side), then the working set (the owner's pages' worth of memory
        // sent, each connection received into a ring the size of a caller's host pool).
        if let (Op::Get, Some((hot, ws))) = (c.op, &stream_addr) {
            let pool_bytes = c.batch_size * page as usize;
            for (prefix, addr, ring) in [
                ("raw-tcp/stream", hot, 1usize << 20),
                ("raw-tcp/stream-ws", ws, pool_bytes),
            ] {
                for r in readers.iter_mut() {
                    r.send(&format!("STREAM {threads} {addr} {ring}"))?;
                }
                let (mut bytes, mut secs) = (0u64, 0f64);
                for r in &readers {
                    let l = r.line(step_wait)?;
                    let s: StreamResult = serde_json::from_str(&l)
                        .with_context(|| format!("{}: bad stream line {l:?}", r.name))?;
                    bytes += s.bytes;
                    secs = secs.max(s.secs);
                }
                let c_all = threads * args.processes as u64;
                let mut row = crate::report::Row::empty(&format!("{prefix}-x{c_all}"));
                row.page_bytes = page;
                row.concurrency = c_all;
                row.round = round;
                row.pages_per_s = bytes as f64 / page as f64 / secs.max(1e-9);
                row.gb_per_s = bytes as f64 / secs.max(1e-9) / 1e9;
                cell.push(row);
            }
        }
        Ok(())
    })?;
    drop(readers);
    drop(owner);
    if wrong > 0 {
        bail!("{wrong} pages read back with another page's stamp");
    }
    let mut summary = serde_json::Map::new();
    for &t in &args.threads.concurrency {
        let c_all = t * args.processes as u64;
        let med = report::median(
            rows.iter()
                .filter(|r| r.concurrency == c_all)
                .map(|r| r.tokens_per_s)
                .collect(),
        );
        summary.insert(format!("tokens_per_s/c{c_all}"), json!(med.round()));
    }
    if c.op == Op::Get && stream_addr.is_some() {
        // The two-process get against a one-way stream over as many connections.
        for &t in &args.threads.concurrency {
            let c_all = t * args.processes as u64;
            let gb = |name: &str| {
                report::median(
                    rows.iter()
                        .filter(|r| r.name == name && r.concurrency == c_all)
                        .map(|r| r.gb_per_s)
                        .collect(),
                )
            };
            for (key, row) in [
                ("get_over_stream", format!("raw-tcp/stream-x{c_all}")),
                ("get_over_ws_stream", format!("raw-tcp/stream-ws-x{c_all}")),
            ] {
                let stream = gb(&row);
                if stream > 0.0 {
                    summary.insert(
                        format!("{key}/c{c_all}"),
                        json!((gb("drive-get") / stream * 1000.0).round() / 1000.0),
                    );
                }
            }
        }
    }
    // Whether the readers' lookups were answered by their own shards (0) or crossed the
    // network: what tells a reader's two speeds apart.
    for &t in &args.threads.concurrency {
        let c_all = t * args.processes as u64;
        let per = report::median(
            rpcs_per_call
                .iter()
                .filter(|(c, _)| *c == c_all)
                .map(|(_, r)| *r)
                .collect(),
        );
        summary.insert(
            format!("directory_rpcs_per_call/c{c_all}"),
            json!((per * 1000.0).round() / 1000.0),
        );
    }
    summary.insert("wrong_pages".into(), json!(wrong));
    summary.insert("staged_reads".into(), json!(staged));
    summary.insert("rdma_read_bytes".into(), json!(rdma_bytes));
    Ok(Some(Report {
        bench: "drive".into(),
        host: Host::detect(),
        config: json!({
            "shape": c.shape, "cluster": c.cluster, "op": c.op, "processes": args.processes,
            "owner": if args.discovery_addr.is_some() { "external" } else { "child process" },
            "page_bytes": page, "segments_per_page": c.shape.segments_per_page(),
            "batch_size": c.batch_size, "threads_per_process": args.threads.concurrency,
            "duration": args.run.secs, "warmup": args.warmup, "rounds": args.run.rounds,
            "working_set_pages": requests(c) * c.batch_size as u64,
            "destination": if c.gpu { "gpu" } else { "host" },
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    }))
}

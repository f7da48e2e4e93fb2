//! `peercache-bench compare`: PeerCache beside the raw TCP baseline and Mooncake Store, in one
//! run, interleaved round by round on the same machine.
//!
//! Same operation on every side: batches of `--batch` pages of `--page-bytes` read by 1–N
//! caller threads into memory the caller owns, from another process's (or node's) memory over
//! loopback TCP:
//! * `raw-tcp` — the shared baseline (a request/response loop over one socket per thread);
//! * `peercache-get` — `batch_get` on node B of pages node A published (directory lookup, one
//!   transport batch, verification), B with the host-local path off so the bytes cross TCP as
//!   between two hosts;
//! * `peercache-get-local` — the same read between a second pair of nodes with the host-local
//!   path on (the default for peers on one host): C copies the pages out of A2's shared pool,
//!   no socket;
//! * `mooncake-get` — Mooncake Store's `batch_get_into` into a registered buffer, from a
//!   storage process, by a pure client (no segment of its own), when the Mooncake Python
//!   package is available (`--mooncake-venv`, default `$PEERCACHE_MOONCAKE_VENV` or the cached
//!   `~/.cache/peercache-ci/mooncake-venv-*`); its master and storage process are started on
//!   free loopback ports and stopped afterwards.
//!
//! Writes `compare.svg` (median pages/s per system and concurrency) into `--out-dir`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::Store;
use serde_json::json;

use crate::rawtcp;
use crate::report::{self, Host, Report, Row};
use crate::runner::{Timing, run_row};

/// Options of `compare`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("concurrency", |a| a.default_value("1,2")))]
pub struct CompareArgs {
    /// Page size in bytes.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages in the read set.
    #[arg(long, default_value_t = 2048)]
    pub pages: u64,
    /// PeerCache deployment modes to compare (`p2p` is the `peercache-get` row; others add
    /// `peercache-<mode>-get`: centralized, hybrid, slotmap).
    #[arg(long, value_delimiter = ',', default_value = "p2p")]
    pub modes: Vec<String>,
    /// A venv with `mooncake-transfer-engine-non-cuda` (its `bin/mooncake_master` and Python).
    #[arg(long)]
    pub mooncake_venv: Option<PathBuf>,
    /// Where the chart goes.
    #[arg(long, default_value = "peercache-bench-results")]
    pub out_dir: PathBuf,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::rows::LoadArgs,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn find_venv(arg: &Option<PathBuf>) -> Option<PathBuf> {
    if let Some(p) = arg {
        return Some(p.clone());
    }
    if let Some(p) = std::env::var_os("PEERCACHE_MOONCAKE_VENV") {
        return Some(PathBuf::from(p));
    }
    let cache = PathBuf::from(std::env::var_os("HOME")?).join(".cache/peercache-ci");
    std::fs::read_dir(cache)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("mooncake-venv"))
        })
}

/// Mooncake's master and one storage process on loopback — or, for the same-host row, one
/// real client (`mooncake_client`, holding the pages in its own segment) whose dummy clients
/// read through shared memory; stopped on drop.
struct Mooncake {
    python: PathBuf,
    script: PathBuf,
    master_addr: String,
    metadata: String,
    /// `host:port` of the real client the clients attach to as dummies (same-host row).
    real_client: Option<String>,
    procs: Vec<Child>,
}

fn wait_listening(port: u16, what: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if std::time::Instant::now() > deadline {
            bail!("{what} did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Drop for Mooncake {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Mooncake {
    /// `same_host`: a real client instead of a storage process, and dummy clients.
    fn start(venv: &Path, same_host: bool) -> Result<Mooncake> {
        let python = venv.join("bin/python");
        let master = venv.join("bin/mooncake_master");
        if !python.exists() || !master.exists() {
            bail!(
                "{} has no bin/python or bin/mooncake_master",
                venv.display()
            );
        }
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/mooncake_peer.py");
        let (rpc, http, metrics) = (free_port()?, free_port()?, free_port()?);
        let m = Command::new(&master)
            .args([
                &format!("--rpc_port={rpc}"),
                "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=true",
                "--http_metadata_server_host=127.0.0.1",
                &format!("--http_metadata_server_port={http}"),
                "--metrics_host=127.0.0.1",
                &format!("--metrics_port={metrics}"),
                "--rpc_thread_num=4",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting mooncake_master")?;
        let mut mc = Mooncake {
            python,
            script,
            master_addr: format!("127.0.0.1:{rpc}"),
            metadata: format!("http://127.0.0.1:{http}/metadata"),
            real_client: None,
            procs: vec![m],
        };
        // The master takes a moment to listen.
        wait_listening(rpc, "mooncake_master")?;
        if same_host {
            let port = free_port()?;
            let rc = Command::new(venv.join("bin/mooncake_client"))
                .args([
                    &format!("--master_server_address={}", mc.master_addr),
                    &format!("--metadata_server={}", mc.metadata),
                    "--host=127.0.0.1",
                    &format!("--port={port}"),
                    "--global_segment_size=1 GB",
                    "--local_buffer_size=64MB",
                    "--protocol=tcp",
                    "--threads=2",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting mooncake_client")?;
            mc.procs.push(rc);
            wait_listening(port, "mooncake_client")?;
            mc.real_client = Some(format!("127.0.0.1:{port}"));
            return Ok(mc);
        }
        let mut server = Command::new(&mc.python)
            .arg(&mc.script)
            .args([
                "server",
                "--master",
                &mc.master_addr,
                "--metadata",
                &mc.metadata,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the mooncake storage process")?;
        let out = server.stdout.take().context("server stdout")?;
        mc.procs.push(server);
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line)?;
        if !line.starts_with("READY") {
            bail!("mooncake storage process did not start: {line:?}");
        }
        Ok(mc)
    }

    /// Runs the client once; returns its JSON line.
    fn client(&self, args: &[String]) -> Result<serde_json::Value> {
        let out = Command::new(&self.python)
            .arg(&self.script)
            .args([
                "client",
                "--master",
                &self.master_addr,
                "--metadata",
                &self.metadata,
            ])
            .args(
                self.real_client
                    .iter()
                    .flat_map(|r| ["--real-client", r.as_str()]),
            )
            .args(args)
            .stderr(Stdio::null())
            .output()
            .context("running the mooncake client")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().last().unwrap_or_default();
        serde_json::from_str(line).with_context(|| format!("mooncake client said {text:?}"))
    }
}

/// Runs the comparison.
pub fn run(args: &CompareArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.load.batch as usize;
    let n = args.pages;
    let timing = Timing {
        warmup: Duration::from_millis(100),
        measure: Duration::from_secs_f64(args.run.secs),
    };
    // PeerCache: node A holds the pages, node B reads them over loopback TCP (the host-local
    // path off, so the bytes move the way they do between two hosts). A second pair, A2 and
    // C, shares the host the way co-located ranks do: C copies A2's pages out of its shared
    // pool. Each pair is its own two-node cluster, so both rows do the same directory work.
    let pool = format!(
        "{}mb",
        (args.pages * args.page_bytes * 2 / (1 << 20)).max(64)
    );
    let pair = |ips: [&str; 2], host_local: bool| -> Result<(Store, Store)> {
        let seed = format!("{}:{}", ips[0], free_port()?);
        let set = [format!("host_local={host_local}")];
        let w = crate::mainjob::start_node_with(ips[0], &seed, &pool, &set)?;
        let r = crate::mainjob::start_node_with(ips[1], &seed, "64mb", &set)?;
        if !(w.wait_members(2, Duration::from_secs(20))
            && r.wait_members(2, Duration::from_secs(20)))
        {
            bail!(
                "the nodes on {} and {} did not see each other",
                ips[0],
                ips[1]
            );
        }
        r.sync_membership();
        Ok((w, r))
    };
    let (a, b) = pair(["127.0.0.1", "127.0.0.2"], false)?;
    let (a2, lc) = pair(["127.0.0.3", "127.0.0.4"], true)?;
    // The reader's destination: registered memory, as Mooncake's batch_get_into uses.
    let max_c = *args
        .load
        .concurrency
        .iter()
        .max()
        .context("no concurrency")? as usize;
    let dst = Arc::new(crate::workload::CallerBuffers::new(max_c, page * batch));
    // SAFETY: `b` is shut down before `dst` is dropped (end of this function).
    unsafe { dst.register(&b) }?;
    let dst_local = Arc::new(crate::workload::CallerBuffers::new(max_c, page * batch));
    // SAFETY: `lc` is shut down before `dst_local` is dropped (end of this function).
    unsafe { dst_local.register(&lc) }?;
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("cmp/{i}")).collect());
    let src = rawtcp::prefaulted(page * batch, 17);
    crate::workload::publish(&a, &keys, &src, page, batch)?;
    crate::workload::publish(&a2, &keys, &src, page, batch)?;
    // Other modes: their own small cluster each, the same keys written by its writer, read by
    // its reader into memory registered with that reader.
    let mut others = Vec::new();
    for (i, mode) in args.modes.iter().filter(|m| *m != "p2p").enumerate() {
        let pool_mib = ((args.pages * (args.page_bytes + 4096) * 2) >> 20).max(64);
        let (w, r, all) = crate::modesbench::cluster(mode, 10 + i, pool_mib, args.page_bytes)?;
        crate::workload::publish(&w, &keys, &src, page, batch)?;
        let bufs = Arc::new(crate::workload::CallerBuffers::new(max_c, page * batch));
        // SAFETY: every node of `all` is shut down before `bufs` is dropped (below).
        unsafe { bufs.register(&r) }?;
        others.push((format!("peercache-{mode}-get"), r, all, bufs));
    }
    // Every PeerCache row: its name, the reading node, the registered memory it reads into.
    let mut readers = vec![
        ("peercache-get".to_string(), b.clone(), dst.clone()),
        (
            "peercache-get-local".to_string(),
            lc.clone(),
            dst_local.clone(),
        ),
    ];
    readers.extend(
        others
            .iter()
            .map(|(name, r, _, bufs)| (name.clone(), r.clone(), bufs.clone())),
    );
    let raw_buf = Arc::new(rawtcp::prefaulted(n as usize * page, 5));
    let raw = std::net::TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw.local_addr()?;
    std::thread::spawn(move || rawtcp::serve(raw, raw_buf));

    let venv = find_venv(&args.mooncake_venv);
    if venv.is_none() {
        eprintln!(
            "compare: Mooncake rows skipped: no venv with mooncake-transfer-engine-non-cuda \
             (--mooncake-venv or PEERCACHE_MOONCAKE_VENV)"
        );
    }
    // The operation shape every Mooncake client run shares.
    let shape = |extra: &[String]| -> Vec<String> {
        let mut a = vec![
            "--pages".to_string(),
            n.to_string(),
            "--page-bytes".into(),
            page.to_string(),
            "--batch".into(),
            batch.to_string(),
        ];
        a.extend_from_slice(extra);
        a
    };
    let fill = |m: &Mooncake| {
        m.client(&shape(&[
            "--fill".into(),
            "--seconds".into(),
            "0.05".into(),
        ]))
    };
    let start_mc = |same_host: bool| -> Option<Mooncake> {
        let what = if same_host { "same-host " } else { "" };
        match Mooncake::start(venv.as_ref()?, same_host).and_then(|m| fill(&m).map(|_| m)) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("compare: Mooncake {what}rows skipped: {e:#}");
                None
            }
        }
    };
    let mooncake = start_mc(false);
    let mooncake_local = start_mc(true);

    let mut rows = Vec::new();
    let mut progress = crate::progress::Progress::new(
        "compare",
        args.run.rounds as usize * args.load.concurrency.len(),
    );
    for round in 0..args.run.rounds {
        for &c in &args.load.concurrency {
            rows.push(run_row(
                "raw-tcp",
                args.page_bytes,
                args.load.batch,
                c,
                round,
                &timing,
                |t| crate::workload::raw_caller(raw_addr, page, batch, n, t as u64 * 997),
            ));
            for (name, r, bufs) in &readers {
                rows.push(run_row(
                    name,
                    args.page_bytes,
                    args.load.batch,
                    c,
                    round,
                    &timing,
                    |t| {
                        crate::workload::registered_get_caller(
                            r.clone(),
                            keys.clone(),
                            bufs.clone(),
                            page,
                            batch,
                            t,
                            t as u64 * 613,
                        )
                    },
                ));
            }
            for (name, mc) in [
                ("mooncake-get", &mooncake),
                ("mooncake-get-local", &mooncake_local),
            ] {
                let Some(mc) = mc else { continue };
                let v = mc.client(&shape(&[
                    "--threads".into(),
                    c.to_string(),
                    "--seconds".into(),
                    args.run.secs.to_string(),
                ]))?;
                let pps = v["pages_per_s"].as_f64().unwrap_or(0.0);
                rows.push(Row {
                    name: name.into(),
                    page_bytes: args.page_bytes,
                    batch: args.load.batch,
                    concurrency: c,
                    pages_per_s: pps,
                    gb_per_s: pps * page as f64 / 1e9,
                    p50_us: v["p50_us"].as_f64().unwrap_or(0.0),
                    p99_us: v["p99_us"].as_f64().unwrap_or(0.0),
                    max_us: v["max_us"].as_f64().unwrap_or(0.0),
                    hit_pct: 100.0,
                    errors: v["errors"].as_u64().unwrap_or(0),
                    round,
                    ..Row::default()
                });
            }
            progress.step(&format!("round {round}, {c} thread(s)"));
        }
    }
    let local_bytes = lc.stats().transport_local_read_bytes;
    drop(readers);
    a.shutdown();
    b.shutdown();
    lc.shutdown();
    a2.shutdown();
    let other_names: Vec<String> = others.iter().map(|o| o.0.clone()).collect();
    for (_, _, all, bufs) in others {
        for s in &all {
            s.shutdown();
        }
        drop(bufs);
    }
    drop(mooncake);
    drop(mooncake_local);

    let med = |name: &str, c: Option<u64>| {
        report::median(
            rows.iter()
                .filter(|r| r.name == name && c.is_none_or(|c| r.concurrency == c))
                .map(|r| r.pages_per_s)
                .collect(),
        )
    };
    let mut summary = serde_json::Map::new();
    let mc_ok = rows.iter().any(|r| r.name == "mooncake-get");
    summary.insert("mooncake_available".into(), json!(mc_ok));
    let mcl_ok = rows.iter().any(|r| r.name == "mooncake-get-local");
    summary.insert("mooncake_same_host_available".into(), json!(mcl_ok));
    if mcl_ok {
        // Same-host against same-host: PeerCache's shared-memory read beside Mooncake's dummy
        // client reading through its real client.
        for &c in &args.load.concurrency {
            summary.insert(
                format!("c{c}/peercache-get-local/mooncake-get-local"),
                json!(round3(
                    med("peercache-get-local", Some(c)) / med("mooncake-get-local", Some(c))
                )),
            );
        }
        summary.insert(
            "peercache-get-local/mooncake-get-local".into(),
            json!(round3(
                med("peercache-get-local", None) / med("mooncake-get-local", None)
            )),
        );
    }
    summary.insert("host_local_read_bytes".into(), json!(local_bytes));
    for &c in &args.load.concurrency {
        let (raw, mc) = (med("raw-tcp", Some(c)), med("mooncake-get", Some(c)));
        for pc_name in ["peercache-get", "peercache-get-local"] {
            let pc = med(pc_name, Some(c));
            summary.insert(format!("c{c}/{pc_name}/raw-tcp"), json!(round3(pc / raw)));
            if mc_ok {
                summary.insert(
                    format!("c{c}/{pc_name}/mooncake-get"),
                    json!(round3(pc / mc)),
                );
            }
        }
    }
    let (pc, mc) = (med("peercache-get", None), med("mooncake-get", None));
    if mc_ok {
        summary.insert("peercache-get/mooncake-get".into(), json!(round3(pc / mc)));
        summary.insert(
            "peercache-get-local/mooncake-get".into(),
            json!(round3(med("peercache-get-local", None) / mc)),
        );
    }
    for name in &other_names {
        summary.insert(
            format!("{name}/peercache-get"),
            json!(round3(med(name, None) / pc)),
        );
        if mc_ok {
            summary.insert(
                format!("{name}/mooncake-get"),
                json!(round3(med(name, None) / mc)),
            );
        }
    }
    std::fs::create_dir_all(&args.out_dir)?;
    let svg = args.out_dir.join("compare.svg");
    let mut systems: Vec<&str> = vec!["raw-tcp", "peercache-get", "peercache-get-local"];
    systems.extend(other_names.iter().map(|s| s.as_str()));
    if mcl_ok {
        systems.push("mooncake-get-local");
    }
    if mc_ok {
        systems.push("mooncake-get");
    }
    let bars: Vec<(String, Vec<f64>)> = args
        .load
        .concurrency
        .iter()
        .map(|&c| {
            (
                format!("{c} thread(s)"),
                systems.iter().map(|s| med(s, Some(c))).collect(),
            )
        })
        .collect();
    std::fs::File::create(&svg)?.write_all(crate::charts::bar_chart(&systems, &bars).as_bytes())?;
    eprintln!("compare: chart in {}", svg.display());
    Ok(Report {
        bench: "compare".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.load.batch, "concurrency": args.load.concurrency,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages, "modes": args.modes,
            "transport": "loopback tcp (peercache-get-local: host-local shared memory)", "mooncake": "batch_get_into, pure client, one storage process",
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

//! `peercache-bench mooncake`: Mooncake Store alone beside the raw TCP baseline (0.8.4's
//! `mooncake` subcommand), and the Mooncake processes `compare` runs its rows against.
//!
//! Same operation as `compare`: batches of `--batch` pages of `--page-bytes` read by 1–N
//! caller threads with `batch_get_into` into a registered buffer — `mooncake-get` from a
//! storage process over loopback TCP, `mooncake-get-local` through a real client on the same
//! host — next to `raw-tcp`, interleaved round by round. Needs a venv with
//! `mooncake-transfer-engine-non-cuda` (`--mooncake-venv`, `$PEERCACHE_MOONCAKE_VENV`, or a
//! cached `~/.cache/peercache-ci/mooncake-venv-*`); without one it stops with that message.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::json;

use crate::load::rawtcp;
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report, Row};

/// The read set every Mooncake client run shares.
pub(crate) struct Shape {
    /// Pages in the read set.
    pub(crate) pages: u64,
    /// Bytes per page.
    pub(crate) page_bytes: u64,
    /// Pages per call.
    pub(crate) batch: u64,
}

impl Shape {
    fn args(&self, extra: &[String]) -> Vec<String> {
        let mut a = vec![
            "--pages".to_string(),
            self.pages.to_string(),
            "--page-bytes".into(),
            self.page_bytes.to_string(),
            "--batch".into(),
            self.batch.to_string(),
        ];
        a.extend_from_slice(extra);
        a
    }
}

/// A free TCP port on loopback.
pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The Mooncake venv: `arg`, else `$PEERCACHE_MOONCAKE_VENV`, else a cached
/// `~/.cache/peercache-ci/mooncake-venv-*`.
pub(crate) fn find_venv(arg: &Option<PathBuf>) -> Option<PathBuf> {
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
pub(crate) struct Mooncake {
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
    pub(crate) fn start(venv: &Path, same_host: bool) -> Result<Mooncake> {
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
    pub(crate) fn client(&self, args: &[String]) -> Result<serde_json::Value> {
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

impl Mooncake {
    /// Started as [`Mooncake::start`], with the read set written into it.
    pub(crate) fn start_filled(venv: &Path, same_host: bool, shape: &Shape) -> Result<Mooncake> {
        let m = Mooncake::start(venv, same_host)?;
        m.client(&shape.args(&["--fill".into(), "--seconds".into(), "0.05".into()]))?;
        Ok(m)
    }

    /// One measured row: `threads` callers for `secs` seconds.
    pub(crate) fn row(
        &self,
        name: &str,
        shape: &Shape,
        threads: u64,
        secs: f64,
        round: u64,
    ) -> Result<Row> {
        let v = self.client(&shape.args(&[
            "--threads".into(),
            threads.to_string(),
            "--seconds".into(),
            secs.to_string(),
        ]))?;
        let pps = v["pages_per_s"].as_f64().unwrap_or(0.0);
        Ok(Row {
            name: name.into(),
            page_bytes: shape.page_bytes,
            batch: shape.batch,
            concurrency: threads,
            pages_per_s: pps,
            gb_per_s: pps * shape.page_bytes as f64 / 1e9,
            p50_us: v["p50_us"].as_f64().unwrap_or(0.0),
            p99_us: v["p99_us"].as_f64().unwrap_or(0.0),
            max_us: v["max_us"].as_f64().unwrap_or(0.0),
            hit_pct: 100.0,
            errors: v["errors"].as_u64().unwrap_or(0),
            round,
            ..Row::default()
        })
    }
}

/// Options of `mooncake`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("concurrency", |a| a.default_value("1,2")))]
pub struct MooncakeArgs {
    /// Page size in bytes.
    #[arg(long, visible_alias = "page-size", default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages in the read set.
    #[arg(long, visible_alias = "working-set", default_value_t = 2048)]
    pub pages: u64,
    /// A venv with `mooncake-transfer-engine-non-cuda` (its `bin/mooncake_master` and Python).
    #[arg(long)]
    pub mooncake_venv: Option<PathBuf>,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

/// Runs Mooncake's rows beside `raw-tcp` (no PeerCache node is started).
pub fn run(args: &MooncakeArgs) -> Result<Report> {
    let Some(venv) = find_venv(&args.mooncake_venv) else {
        bail!(
            "mooncake: no venv with mooncake-transfer-engine-non-cuda: pass --mooncake-venv DIR \
             or set PEERCACHE_MOONCAKE_VENV (python3 -m venv DIR && DIR/bin/pip install \
             mooncake-transfer-engine-non-cuda)"
        );
    };
    if !venv.join("bin/mooncake_master").exists() {
        bail!(
            "mooncake: {} has no bin/mooncake_master (install mooncake-transfer-engine-non-cuda into it)",
            venv.display()
        );
    }
    let shape = Shape {
        pages: args.pages,
        page_bytes: args.page_bytes,
        batch: args.load.batch,
    };
    let remote = Mooncake::start_filled(&venv, false, &shape).context("starting Mooncake")?;
    let local = Mooncake::start_filled(&venv, true, &shape)
        .map_err(|e| eprintln!("mooncake: same-host rows skipped: {e:#}"))
        .ok();
    let (page, batch) = (args.page_bytes as usize, args.load.batch as usize);
    let raw_buf = Arc::new(rawtcp::prefaulted(args.pages as usize * page, 5));
    let raw = std::net::TcpListener::bind("127.0.0.1:0")?;
    let raw_addr = raw.local_addr()?;
    std::thread::spawn(move || rawtcp::serve(raw, raw_buf));
    let sweep = Sweep::new("mooncake", &args.run, &args.load, args.page_bytes)?;
    let mut rows = Vec::new();
    sweep.run(&mut rows, |cell| {
        cell.row("raw-tcp", |t| {
            crate::load::workload::raw_caller(raw_addr, page, batch, args.pages, t as u64 * 997)
        });
        let (c, round) = (cell.threads, cell.round);
        cell.push(remote.row("mooncake-get", &shape, c, args.run.secs, round)?);
        if let Some(l) = &local {
            cell.push(l.row("mooncake-get-local", &shape, c, args.run.secs, round)?);
        }
        Ok(())
    })?;
    let med = |name: &str, c: u64| {
        report::median(
            rows.iter()
                .filter(|r| r.name == name && r.concurrency == c)
                .map(|r| r.pages_per_s)
                .collect(),
        )
    };
    let mut summary = serde_json::Map::new();
    for &c in &args.load.threads.concurrency {
        let raw = med("raw-tcp", c);
        summary.insert(
            format!("c{c}/mooncake-get/raw-tcp"),
            json!(((med("mooncake-get", c) / raw) * 1000.0).round() / 1000.0),
        );
    }
    summary.insert(
        "mooncake_same_host_available".into(),
        json!(local.is_some()),
    );
    Ok(Report {
        bench: "mooncake".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.load.batch, "concurrency": args.load.threads.concurrency,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages,
            "mooncake": "batch_get_into, pure client, one storage process", "venv": venv.display().to_string(),
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

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
//! * `peercache-get-sealed` (with `--sealed`) — the `peercache-get` read between a third pair
//!   of nodes that require encryption in transit (`encrypt_in_transit = true`): what sealing
//!   every byte costs, beside the open row of the same run;
//! * `mooncake-get` — Mooncake Store's `batch_get_into` into a registered buffer, from a
//!   storage process, by a pure client (no segment of its own), when the Mooncake Python
//!   package is available (`--mooncake-venv`, default `$PEERCACHE_MOONCAKE_VENV` or the cached
//!   `~/.cache/peercache-ci/mooncake-venv-*`); its master and storage process are started on
//!   free loopback ports and stopped afterwards.
//!
//! Writes `compare.svg` (median pages/s per system and concurrency) into `--out-dir`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use peercache_store::Store;
use serde_json::json;

use crate::cmd::mooncake::{Mooncake, Shape, find_venv, free_port};
use crate::load::rawtcp;
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report};

/// Options of `compare`.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("concurrency", |a| a.default_value("1,2")))]
pub struct CompareArgs {
    /// Page size in bytes.
    #[arg(long, visible_alias = "page-size", default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages in the read set.
    #[arg(long, visible_alias = "working-set", default_value_t = 2048)]
    pub pages: u64,
    /// PeerCache deployment modes to compare (`p2p` is the `peercache-get` row; others add
    /// `peercache-<mode>-get`: centralized, hybrid, slotmap).
    #[arg(long, value_delimiter = ',', default_value = "p2p")]
    pub modes: Vec<String>,
    /// Add `peercache-get-sealed`: the same read between two nodes that require encryption
    /// in transit.
    #[arg(long)]
    pub sealed: bool,
    /// A venv with `mooncake-transfer-engine-non-cuda` (its `bin/mooncake_master` and Python).
    #[arg(long)]
    pub mooncake_venv: Option<PathBuf>,
    /// Where the chart goes.
    #[arg(long, default_value = "peercache-bench-results")]
    pub out_dir: PathBuf,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
    /// Pages per call and caller threads (shared by every subcommand).
    #[command(flatten)]
    pub load: crate::load::rows::LoadArgs,
}

/// Runs the comparison.
pub fn run(args: &CompareArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.load.batch as usize;
    let n = args.pages;
    let sweep = Sweep::new("compare", &args.run, &args.load, args.page_bytes)?;
    // PeerCache: node A holds the pages, node B reads them over loopback TCP (the host-local
    // path off, so the bytes move the way they do between two hosts). A second pair, A2 and
    // C, shares the host the way co-located ranks do: C copies A2's pages out of its shared
    // pool. Each pair is its own two-node cluster, so both rows do the same directory work.
    let pool = format!(
        "{}mb",
        (args.pages * args.page_bytes * 2 / (1 << 20)).max(64)
    );
    let pair = |ips: [&str; 2], host_local: bool, sealed: bool| -> Result<(Store, Store)> {
        let seed = format!("{}:{}", ips[0], free_port()?);
        let set = [
            format!("host_local={host_local}"),
            format!("encrypt_in_transit={sealed}"),
        ];
        let w = crate::cmd::main_job::start_node_with(ips[0], &seed, &pool, &set)?;
        let r = crate::cmd::main_job::start_node_with(ips[1], &seed, "64mb", &set)?;
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
    let (a, b) = pair(["127.0.0.1", "127.0.0.2"], false, false)?;
    let (a2, lc) = pair(["127.0.0.3", "127.0.0.4"], true, false)?;
    let sealed = match args.sealed {
        true => Some(pair(["127.0.0.5", "127.0.0.6"], false, true)?),
        false => None,
    };
    // The reader's destination: registered memory, as Mooncake's batch_get_into uses.
    let max_c = sweep.max_threads();
    let dst = Arc::new(crate::load::workload::CallerBuffers::new(
        max_c,
        page * batch,
    ));
    // SAFETY: `b` is shut down before `dst` is dropped (end of this function).
    unsafe { dst.register(&b) }?;
    let dst_local = Arc::new(crate::load::workload::CallerBuffers::new(
        max_c,
        page * batch,
    ));
    // SAFETY: `lc` is shut down before `dst_local` is dropped (end of this function).
    unsafe { dst_local.register(&lc) }?;
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|i| format!("cmp/{i}")).collect());
    let src = rawtcp::prefaulted(page * batch, 17);
    crate::load::workload::publish(&a, &keys, &src, page, batch)?;
    crate::load::workload::publish(&a2, &keys, &src, page, batch)?;
    let mut sealed_reader = None;
    if let Some((a3, b3)) = &sealed {
        crate::load::workload::publish(a3, &keys, &src, page, batch)?;
        let bufs = Arc::new(crate::load::workload::CallerBuffers::new(
            max_c,
            page * batch,
        ));
        // SAFETY: `b3` is shut down before `bufs` is dropped (end of this function).
        unsafe { bufs.register(b3) }?;
        sealed_reader = Some(("peercache-get-sealed".to_string(), b3.clone(), bufs));
    }
    // Other modes: their own small cluster each, the same keys written by its writer, read by
    // its reader into memory registered with that reader.
    let mut others = Vec::new();
    for (i, mode) in args.modes.iter().filter(|m| *m != "p2p").enumerate() {
        let pool_mib = ((args.pages * (args.page_bytes + 4096) * 2) >> 20).max(64);
        let (w, r, all) = crate::cmd::modes::cluster(mode, 10 + i, pool_mib, args.page_bytes)?;
        crate::load::workload::publish(&w, &keys, &src, page, batch)?;
        let bufs = Arc::new(crate::load::workload::CallerBuffers::new(
            max_c,
            page * batch,
        ));
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
    readers.extend(sealed_reader.clone());
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
    let shape = Shape {
        pages: n,
        page_bytes: args.page_bytes,
        batch: args.load.batch,
    };
    let start_mc = |same_host: bool| -> Option<Mooncake> {
        let what = if same_host { "same-host " } else { "" };
        match Mooncake::start_filled(venv.as_ref()?, same_host, &shape) {
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
    sweep.run(&mut rows, |cell| {
        cell.row("raw-tcp", |t| {
            crate::load::workload::raw_caller(raw_addr, page, batch, n, t as u64 * 997)
        });
        for (name, r, bufs) in &readers {
            cell.row(name, |t| {
                crate::load::workload::registered_get_caller(
                    r.clone(),
                    keys.clone(),
                    bufs.clone(),
                    page,
                    batch,
                    t,
                    t as u64 * 613,
                )
            });
        }
        let (c, round) = (cell.threads, cell.round);
        for (name, mc) in [
            ("mooncake-get", &mooncake),
            ("mooncake-get-local", &mooncake_local),
        ] {
            let Some(mc) = mc else { continue };
            cell.push(mc.row(name, &shape, c, args.run.secs, round)?);
        }
        Ok(())
    })?;
    let local_bytes = lc.stats().transport_local_read_bytes;
    drop(readers);
    a.shutdown();
    b.shutdown();
    lc.shutdown();
    a2.shutdown();
    if let Some((a3, b3)) = &sealed {
        b3.shutdown();
        a3.shutdown();
    }
    drop(sealed_reader);
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
        for &c in &args.load.threads.concurrency {
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
    for &c in &args.load.threads.concurrency {
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
    if args.sealed {
        // What sealing costs: the sealed pair's read beside the open pair's, same run.
        for &c in &args.load.threads.concurrency {
            summary.insert(
                format!("c{c}/peercache-get-sealed/peercache-get"),
                json!(round3(
                    med("peercache-get-sealed", Some(c)) / med("peercache-get", Some(c))
                )),
            );
        }
        summary.insert(
            "peercache-get-sealed/peercache-get".into(),
            json!(round3(med("peercache-get-sealed", None) / pc)),
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
    if args.sealed {
        systems.push("peercache-get-sealed");
    }
    if mcl_ok {
        systems.push("mooncake-get-local");
    }
    if mc_ok {
        systems.push("mooncake-get");
    }
    let bars: Vec<(String, Vec<f64>)> = args
        .load
        .threads
        .concurrency
        .iter()
        .map(|&c| {
            (
                format!("{c} thread(s)"),
                systems.iter().map(|s| med(s, Some(c))).collect(),
            )
        })
        .collect();
    std::fs::File::create(&svg)?
        .write_all(crate::report::charts::bar_chart(&systems, &bars).as_bytes())?;
    eprintln!("compare: chart in {}", svg.display());
    Ok(Report {
        bench: "compare".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.load.batch, "concurrency": args.load.threads.concurrency,
            "rounds": args.run.rounds, "secs": args.run.secs, "pages": args.pages, "modes": args.modes, "sealed": args.sealed,
            "transport": "loopback tcp (peercache-get-local: host-local shared memory)", "mooncake": "batch_get_into, pure client, one storage process",
        }),
        summary: serde_json::Value::Object(summary),
        results: rows,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

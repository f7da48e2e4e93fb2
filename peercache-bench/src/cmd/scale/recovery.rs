//! `scale`'s recovery run: a fleet of directory nodes on loopback in this process
//! ([`peercache_directory::testbed::Fleet`]: real shards, hand-off and re-announce code over
//! real sockets), pages published round-robin; one node is killed, then another restarts with
//! an empty shard. Reported: when every page of a live owner was found again (simulated
//! detection + the measured hand-off), what moved, and what a reader saw.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use peercache_directory::testbed::{Fleet, Recovery, RecoveryConfig};

use crate::report::Row;

/// The recovery target of the scale issue: every page of a live owner found again within
/// this much simulated time.
pub const TARGET_RECOVERY_SECS: f64 = 10.0;

/// Options of the recovery run.
#[derive(Debug, Clone, clap::Args)]
pub struct RecoveryArgs {
    /// Pages of the recovery run (0: none): a fleet of `--recovery-nodes` directory nodes on
    /// loopback in this process, one killed, then one restarted with an empty shard.
    #[arg(long, default_value_t = 10_000_000)]
    pub recovery_pages: u64,
    /// Nodes of the recovery fleet (each a shard and a publishing owner).
    #[arg(long, default_value_t = 16)]
    pub recovery_nodes: usize,
    /// Directory owners per entry in the recovery fleet (`directory_replicas`).
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Simulated seconds until every member saw a death or restart: discovery's bound,
    /// `member_ttl` + 2 × `heartbeat_interval` with the defaults.
    #[arg(long, default_value_t = 5.0, value_parser = peercache_store::tools::secs::seconds)]
    pub detect_secs: f64,
}

fn row(name: &str, r: &Recovery) -> Row {
    let c = &r.check;
    let mut row = Row::empty(name);
    // Entries moved (shard hand-off and owners' re-announcement) per second of hand-off.
    row.pages_per_s = (r.handed_off + r.reannounced) as f64 / r.handoff.as_secs_f64().max(1e-9);
    row.max_us = r.handoff.as_secs_f64() * 1e6;
    row.hit_pct = 100.0 * c.found as f64 / c.expected.max(1) as f64;
    row.errors = (c.expected - c.found.min(c.expected)) + c.wrong + c.stale;
    row
}

fn json(r: &Recovery) -> serde_json::Value {
    let c = &r.check;
    let secs = r.recovered_at().as_secs_f64();
    serde_json::json!({
        "detect_s": r.detect.as_secs_f64(),
        "handoff_s": (r.handoff.as_secs_f64() * 1000.0).round() / 1000.0,
        "recovered_s": (secs * 1000.0).round() / 1000.0,
        "target_s": TARGET_RECOVERY_SECS,
        "meets_target": secs <= TARGET_RECOVERY_SECS && c.complete(),
        "handed_off": r.handed_off,
        "handoff_failed": r.failed,
        "reannounced": r.reannounced,
        "collected": r.collected,
        "expected": c.expected,
        "placed": c.placed,
        "found": c.found,
        "wrong": c.wrong,
        "stale": c.stale,
    })
}

/// Runs the recovery scenario; pushes a row per event and returns the summary's `recovery`.
pub fn run(args: &RecoveryArgs, rows: &mut Vec<Row>) -> Result<serde_json::Value> {
    ensure!(
        args.recovery_nodes >= 3,
        "--recovery-nodes must be at least 3 (one is killed, one restarted)"
    );
    ensure!(
        (1..args.recovery_nodes).contains(&args.replicas),
        "--replicas must be at least 1 and below --recovery-nodes"
    );
    ensure!(
        args.detect_secs.is_finite() && args.detect_secs >= 0.0,
        "--detect-secs must be a non-negative number"
    );
    let n = args.recovery_nodes;
    let t0 = Instant::now();
    let mut fleet = Fleet::start(RecoveryConfig {
        nodes: n,
        pages: args.recovery_pages,
        replicas: args.replicas,
        detect: Duration::from_secs_f64(args.detect_secs),
        ..RecoveryConfig::default()
    })
    .context("starting the recovery fleet on loopback")?;
    eprintln!(
        "scale: recovery fleet of {n} nodes, {} pages × {} directory copies loaded in {:.1} s",
        args.recovery_pages,
        args.replicas,
        t0.elapsed().as_secs_f64()
    );
    let mut out = serde_json::Map::new();
    let killed = fleet.kill(n / 2);
    let restarted = fleet
        .restart(n / 2 + 1)
        .context("restarting a node of the recovery fleet")?;
    for (name, r) in [("kill", &killed), ("restart", &restarted)] {
        eprintln!(
            "scale: {name}: found again at {:.2} s (detect {:.1} s + hand-off {:.2} s), {} of {} \
             pages, {} handed off, {} re-announced, {} wrong, {} stale",
            r.recovered_at().as_secs_f64(),
            r.detect.as_secs_f64(),
            r.handoff.as_secs_f64(),
            r.check.found,
            r.check.expected,
            r.handed_off,
            r.reannounced,
            r.check.wrong,
            r.check.stale
        );
        rows.push(row(&format!("recovery-{name}/{}", args.recovery_pages), r));
        out.insert(name.into(), json(r));
    }
    let worst = killed
        .recovered_at()
        .max(restarted.recovered_at())
        .as_secs_f64();
    out.insert("pages".into(), args.recovery_pages.into());
    out.insert("nodes".into(), n.into());
    out.insert("replicas".into(), args.replicas.into());
    out.insert(
        "recovered_s".into(),
        ((worst * 1000.0).round() / 1000.0).into(),
    );
    out.insert(
        "meets_target".into(),
        (worst <= TARGET_RECOVERY_SECS && killed.check.complete() && restarted.check.complete())
            .into(),
    );
    Ok(serde_json::Value::Object(out))
}

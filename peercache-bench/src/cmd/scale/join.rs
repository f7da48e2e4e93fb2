//! `scale`'s join run: a node joins four members with an empty shard while readers look keys
//! up, and the members hand it their entries paced
//! ([`peercache_directory::testbed::join`]: real shards, hand-off and lookups over loopback).
//! Reported: how long the hand-off took, what moved, and what the readers missed (every
//! entry exists throughout, so the target is zero).

use std::time::Duration;

use anyhow::{Context, Result};
use peercache_directory::testbed::join::{self, JoinConfig};

use crate::report::Row;

/// Options of the join run.
#[derive(Debug, Clone, clap::Args)]
pub struct JoinArgs {
    /// Entries published before a node joins (0: no join run).
    #[arg(long, default_value_t = 1_000_000)]
    pub join_entries: u64,
    /// Each member's hand-off pace in bytes per second (`directory_handoff_rate`; 0: unpaced).
    #[arg(long, default_value_t = 8 << 20)]
    pub join_rate: u64,
}

/// Runs the join; pushes a row and returns the summary's `join`.
pub fn run(args: &JoinArgs, rows: &mut Vec<Row>) -> Result<serde_json::Value> {
    let cfg = JoinConfig {
        first: 100,
        members: 4,
        entries: args.join_entries,
        rate: args.join_rate,
        grace: Duration::from_millis(100),
        ..JoinConfig::default()
    };
    let j = join::run(&cfg).context("the join run on loopback")?;
    eprintln!(
        "scale: join: {} entries handed off in {:.2} s at {} B/s per member; readers looked up \
         {} keys: {} missed, {} wrong, {} pointed at the previous holder",
        j.sent,
        j.handoff.as_secs_f64(),
        args.join_rate,
        j.lookups,
        j.misses,
        j.wrong,
        j.redirects
    );
    let mut row = Row::empty(&format!("join/{}", args.join_entries));
    row.pages_per_s = j.sent as f64 / j.handoff.as_secs_f64().max(1e-9);
    row.max_us = j.handoff.as_secs_f64() * 1e6;
    row.hit_pct = 100.0 * (j.lookups - j.misses.min(j.lookups)) as f64 / j.lookups.max(1) as f64;
    row.errors = j.misses + j.wrong + j.failed as u64;
    rows.push(row);
    Ok(serde_json::json!({
        "entries": args.join_entries,
        "members": cfg.members,
        "rate_bytes_per_s": args.join_rate,
        "handoff_s": (j.handoff.as_secs_f64() * 1000.0).round() / 1000.0,
        "handed_off": j.sent,
        "failed": j.failed,
        "lookups": j.lookups,
        "misses": j.misses,
        "wrong": j.wrong,
        "redirects": j.redirects,
        "meets_target": j.misses == 0 && j.wrong == 0 && j.failed == 0 && !j.still_receiving,
    }))
}

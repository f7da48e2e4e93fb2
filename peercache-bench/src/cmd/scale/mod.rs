//! `scale`: one directory shard at fleet size. For each key count (1 M and 10 M by default,
//! two owners per key drawn from 16 publishing nodes) it loads a real [`Shard`], reports the
//! bytes the shard holds per (key, owner) — counted by the bench's allocator, map overhead,
//! keys, LRU links and owner table included — beside the resident-set growth, then measures
//! in-process lookups and exists on one core over random keys, 32 per call through the batch
//! calls the directory service makes. Then recovery at size ([`crate::cmd::scale::recovery`]).

pub mod join;
pub mod recovery;
pub mod republish;

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use peercache_directory::{CopyClass, Location, Rail, Shard, ShardConfig};
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::load::runner::time_calls;
use crate::report::{self, Host, Report, Row};

/// The target of the scale issue: bytes per (key, owner) for the whole shard.
pub const TARGET_BYTES_PER_COPY: f64 = 64.0;

/// Options of the `scale` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Key counts, one shard each, measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    pub keys: Vec<u64>,
    /// Owners per key.
    #[arg(long, default_value_t = 2)]
    pub owners: u64,
    /// Publishing nodes the owners are drawn from.
    #[arg(long, default_value_t = 16)]
    pub nodes: u64,
    /// The recovery run after the shard sizes.
    #[command(flatten)]
    pub recovery: crate::cmd::scale::recovery::RecoveryArgs,
    /// The disk re-publish run after recovery.
    #[command(flatten)]
    pub republish: crate::cmd::scale::republish::RepublishArgs,
    /// The join run after the disk re-publish.
    #[command(flatten)]
    pub join: crate::cmd::scale::join::JoinArgs,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

fn key(i: u64) -> PageKey {
    PageKey::from_bytes(&i.to_le_bytes())
}

struct Owner {
    node: NodeId,
    endpoint: std::net::SocketAddr,
    incarnation: Incarnation,
}

fn location(o: &Owner, i: u64) -> Location {
    Location {
        node: o.node.clone(),
        incarnation: o.incarnation,
        rails: smallvec::smallvec![Rail {
            endpoint: o.endpoint,
            region: 0x5eed_0000 + o.incarnation.0,
        }],
        addr: (i % 100_000) * 131_136,
        len: 131_072,
        valid_len: 131_072,
        generation: i + 1,
        checksum: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

/// Resident set of this process, bytes (0 where /proc is not there).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn label(n: u64) -> String {
    if n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// A row of `calls` calls of `batch` lookups each, timed one call at a time.
fn timed(name: String, batch: u64, round: u64, dur: Duration, mut f: impl FnMut() -> u64) -> Row {
    let (h, calls, errors, secs) = time_calls(dur, || batch - f());
    Row {
        hit_pct: 100.0 * (calls * batch - errors) as f64 / (calls * batch).max(1) as f64,
        errors,
        round,
        ..Row::measured(&name, 0, batch, calls * batch, secs, &h)
    }
}

/// Runs the `scale` subcommand.
pub fn run(args: &ScaleArgs) -> Result<Report> {
    ensure!(args.owners >= 1, "--owners must be at least 1");
    ensure!(
        args.nodes >= args.owners,
        "--nodes must be at least --owners (each key's owners are distinct nodes)"
    );
    let owners: Vec<Owner> = (0..args.nodes)
        .map(|i| {
            Ok(Owner {
                node: NodeId::new(format!("inference-host-{:03}-rank-{}", i / 8, i % 8))?,
                endpoint: format!("10.0.{}.{}:17000", i / 200, i % 200 + 1).parse()?,
                incarnation: Incarnation(1_700_000_000_000_000 + i),
            })
        })
        .collect::<Result<_>>()?;
    crate::load::alloc::track_bytes();
    let dur = Duration::from_secs_f64(args.run.secs);
    let mut rows = Vec::new();
    let mut sizes = serde_json::Map::new();
    // The headline figures: the worst over the key counts measured.
    let (mut worst_bytes, mut worst_lookups) = (0f64, f64::INFINITY);
    for &n in &args.keys {
        ensure!(n >= 1, "--keys must be at least 1");
        let tag = label(n);
        let (bytes0, rss0) = (crate::load::alloc::live_bytes(), rss_bytes());
        let t0 = Instant::now();
        let mut shard = Shard::new(ShardConfig {
            max_entries: n as usize,
            ..ShardConfig::default()
        });
        // As nodes publish: each owner inserts a batch of its own pages.
        const BATCH: u64 = 1024;
        let mut start = 0;
        while start < n {
            let end = (start + BATCH).min(n);
            for j in 0..args.owners {
                let o = &owners[((start / BATCH + j) % args.nodes) as usize];
                for i in start..end {
                    shard.insert(key(i), location(o, i), 0);
                }
            }
            start = end;
        }
        let load_secs = t0.elapsed().as_secs_f64();
        let copies = n * args.owners;
        let bytes = crate::load::alloc::live_bytes().wrapping_sub(bytes0);
        let rss = rss_bytes().saturating_sub(rss0);
        ensure!(
            shard.len() as u64 == n,
            "the shard holds {} keys, not {n}",
            shard.len()
        );
        let per_copy = bytes as f64 / copies as f64;
        eprintln!(
            "scale: {tag} keys × {} owners loaded in {load_secs:.1} s: {bytes} bytes, {per_copy:.1} \
             bytes per (key, owner) (target ≤ {TARGET_BYTES_PER_COPY}), {} owner records",
            args.owners,
            shard.owner_records()
        );
        let mut insert = Row::empty(&format!("shard-insert/{tag}"));
        insert.batch = BATCH;
        insert.pages_per_s = copies as f64 / load_secs;
        rows.push(insert);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            // xorshift: random keys, so the lookups miss the CPU caches as a fleet's would.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut keys = Vec::with_capacity(32);
        let mut draw = |keys: &mut Vec<PageKey>| {
            keys.clear();
            keys.extend((0..32).map(|_| key(next())));
        };
        for round in 0..args.run.rounds {
            // Batches of 32 random keys through the batch calls the directory service makes.
            rows.push(timed(format!("shard-lookup/{tag}"), 32, round, dur, || {
                draw(&mut keys);
                shard
                    .lookup_many(&keys, 1)
                    .iter()
                    .filter(|o| o.as_ref().is_some_and(|o| o.len() as u64 == args.owners))
                    .count() as u64
            }));
            rows.push(timed(format!("shard-exists/{tag}"), 32, round, dur, || {
                draw(&mut keys);
                shard.exists_many(&keys, 1).iter().filter(|&&b| b).count() as u64
            }));
        }
        let med = |name: String| report::median_of(&rows, &name, |r| r.pages_per_s);
        let records = shard.owner_records();
        drop(shard);
        let left = crate::load::alloc::live_bytes().wrapping_sub(bytes0) as i64;
        let lookups = med(format!("shard-lookup/{tag}"));
        worst_bytes = worst_bytes.max(per_copy);
        worst_lookups = worst_lookups.min(lookups);
        sizes.insert(
            tag.clone(),
            serde_json::json!({
                "keys": n,
                "owners_per_key": args.owners,
                "copies": copies,
                "owner_records": records,
                "shard_bytes": bytes,
                "bytes_per_entry": (per_copy * 10.0).round() / 10.0,
                "bytes_per_entry_target": TARGET_BYTES_PER_COPY,
                "meets_target": per_copy <= TARGET_BYTES_PER_COPY,
                "rss_growth_bytes": rss,
                "load_secs": (load_secs * 100.0).round() / 100.0,
                "lookups_per_s": lookups,
                "exists_per_s": med(format!("shard-exists/{tag}")),
                "bytes_left_after_drop": left,
            }),
        );
    }
    let recovery = if args.recovery.recovery_pages > 0 {
        crate::cmd::scale::recovery::run(&args.recovery, &mut rows)?
    } else {
        serde_json::Value::Null
    };
    let republish = if args.republish.republish_pages > 0 {
        crate::cmd::scale::republish::run(&args.republish, &mut rows)?
    } else {
        serde_json::Value::Null
    };
    let join = if args.join.join_entries > 0 {
        crate::cmd::scale::join::run(&args.join, &mut rows)?
    } else {
        serde_json::Value::Null
    };
    Ok(Report {
        bench: "scale".into(),
        host: Host::detect(),
        config: serde_json::json!({"keys": args.keys, "owners": args.owners, "nodes": args.nodes,
            "rounds": args.run.rounds, "secs": args.run.secs,
            "recovery_pages": args.recovery.recovery_pages,
            "recovery_nodes": args.recovery.recovery_nodes,
            "replicas": args.recovery.replicas, "detect_secs": args.recovery.detect_secs,
            "republish_pages": args.republish.republish_pages,
            "republish_page_bytes": args.republish.republish_page_bytes,
            "join_entries": args.join.join_entries, "join_rate": args.join.join_rate}),
        summary: serde_json::json!({
            // Allocator-counted bytes per (key, owner), the largest over the key counts.
            "bytes_per_entry": (worst_bytes * 10.0).round() / 10.0,
            "bytes_per_entry_target": TARGET_BYTES_PER_COPY,
            "meets_target": worst_bytes <= TARGET_BYTES_PER_COPY,
            // In-process lookups per second on one core, the smallest over the key counts.
            "lookups_per_s": worst_lookups.round(),
            "sizes": sizes,
            // A node killed, then one restarted: when every live owner's page was found again.
            "recovery": recovery,
            // A node restarted on a disk tier of small pages: when the cluster found them all.
            "republish": republish,
            // A node joined under a lookup load, the hand-off paced: what readers missed.
            "handoff_misses": join.get("misses").cloned().unwrap_or(serde_json::Value::Null),
            "join": join,
        }),
        results: rows,
    })
}

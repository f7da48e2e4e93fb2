//! `pool`: publish throughput against a plain memcpy of the same bytes, and metadata-only
//! allocate/evict/lookup rates, single-threaded, in interleaved rounds.

use std::time::{Duration, Instant};

use anyhow::Result;
use peercache_pool::{PageWrite, Pool, PoolConfig, PublishScratch, Published, ReplClass};
use peercache_wire::{Layout, PageKey};

use crate::load::rawtcp::prefaulted;
use crate::load::sweep::Rounds;
use crate::report::hist;
use crate::report::{self, Host, Report, Row};

/// Options of the `pool` subcommand.
#[derive(Debug, Clone, clap::Args)]
#[command(mut_arg("secs", |a| a.default_value("1")))]
pub struct PoolArgs {
    /// Page size of the copy rows.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Distinct source bytes in MiB (at least 256 to defeat caches).
    #[arg(long, default_value_t = 256)]
    pub source_mib: u64,
    /// Pool size in MiB.
    #[arg(long, default_value_t = 512)]
    pub pool_mib: u64,
    /// Pages per batch.
    #[arg(long, visible_alias = "batch-size", default_value_t = 32)]
    pub batch: u64,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

struct Acc {
    h: hdrhistogram::Histogram<u64>,
    pages: u64,
    errors: u64,
    t0: Instant,
}

impl Acc {
    fn new() -> Self {
        Acc {
            h: hist::new(),
            pages: 0,
            errors: 0,
            t0: Instant::now(),
        }
    }
    /// One `publish_batch` of `pages` into `pool`, timed into this row: its pages counted, its
    /// failures counted as errors, its evictions dropped.
    fn publish(
        &mut self,
        pool: &Pool,
        pages: &[PageWrite<'_>],
        scratch: &mut PublishScratch,
        out: &mut Vec<Published>,
        evicted: &mut Vec<peercache_pool::Evicted>,
    ) {
        let c0 = Instant::now();
        pool.publish_batch(pages, ReplClass::Retained, scratch, out, evicted);
        hist::record(&mut self.h, c0.elapsed());
        self.errors += out
            .iter()
            .filter(|p| matches!(p, Published::Failed(_)))
            .count() as u64;
        self.pages += pages.len() as u64;
        evicted.clear();
    }

    fn row(&self, name: &str, page: u64, batch: u64, round: u64) -> Row {
        let secs = self.t0.elapsed().as_secs_f64();
        Row {
            errors: self.errors,
            round,
            ..Row::measured(name, page, batch, self.pages, secs, &self.h)
        }
    }
}

/// Runs the `pool` subcommand.
pub fn run(args: &PoolArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.batch as usize;
    let src = prefaulted((args.source_mib as usize) << 20, 11);
    let n_src = src.len() / page;
    let pool_len = (args.pool_mib as usize) << 20;
    // Warmed whole before measuring: the bench is about the steady state.
    let pool = Pool::new(PoolConfig {
        background: false,
        ..PoolConfig::new(pool_len)
    })?;
    let mut dst = prefaulted(pool_len, 13);
    let n_dst = dst.len() / page;
    // 32,768 slots of 64-byte pages: the page count of a 4 GiB pool of 128 KiB pages, so the
    // bookkeeping works on a realistically sized index.
    let meta_pool = Pool::new(PoolConfig {
        slab_bytes: 1 << 20,
        ..PoolConfig::new(4 << 20)
    })?;
    let meta_src = [7u8; 64];
    let dur = Duration::from_secs_f64(args.run.secs);
    let mut rows = Vec::new();
    let mut next_key = 0u64;
    let mut scratch = PublishScratch::default();
    let mut out: Vec<Published> = Vec::new();
    let mut evicted = Vec::new();
    let mut keys: Vec<PageKey> = Vec::with_capacity(batch);
    let mut locs = Vec::new();
    Rounds::new("pool", args.run.rounds).run(&mut rows, |cell| {
        let round = cell.round;
        // memcpy: the same bytes into a pre-faulted destination of the pool's size.
        let mut a = Acc::new();
        let mut i = 0usize;
        while a.t0.elapsed() < dur {
            let c0 = Instant::now();
            for _ in 0..batch {
                let s = (i % n_src) * page;
                let d = (i % n_dst) * page;
                dst[d..d + page].copy_from_slice(&src[s..s + page]);
                i += 1;
            }
            std::hint::black_box(&dst);
            hist::record(&mut a.h, c0.elapsed());
            a.pages += batch as u64;
        }
        cell.push(a.row("memcpy", args.page_bytes, args.batch, round));

        // publish: copy + checksum + header into the pool, evicting once it is full.
        let mut a = Acc::new();
        let mut i = 0usize;
        while a.t0.elapsed() < dur {
            keys.clear();
            let mut segs: [[&[u8]; 1]; 64] = [[&[]]; 64];
            for (j, seg) in segs.iter_mut().enumerate().take(batch) {
                let s = ((i + j) % n_src) * page;
                *seg = [&src[s..s + page]];
                keys.push(PageKey(next_key as u128 | (1u128 << 100)));
                next_key += 1;
            }
            let pages: [PageWrite<'_>; 64] = std::array::from_fn(|j| PageWrite {
                key: keys.get(j).copied().unwrap_or(PageKey(0)),
                segments: &segs[j],
                valid_len: None,
                layout: Layout::NONE,
            });
            a.publish(&pool, &pages[..batch], &mut scratch, &mut out, &mut evicted);
            i += batch;
        }
        cell.push(a.row("publish", args.page_bytes, args.batch, round));

        // Metadata-only: 64-byte pages into a full pool (allocate + evict), then lookups.
        let mut a = Acc::new();
        while a.t0.elapsed() < dur {
            keys.clear();
            for _ in 0..batch {
                keys.push(PageKey::from_bytes(&next_key.to_le_bytes()));
                next_key += 1;
            }
            let segs = [&meta_src[..]];
            let pages: [PageWrite<'_>; 64] = std::array::from_fn(|j| PageWrite {
                key: keys.get(j).copied().unwrap_or(PageKey(0)),
                segments: &segs,
                valid_len: None,
                layout: Layout::NONE,
            });
            a.publish(
                &meta_pool,
                &pages[..batch],
                &mut scratch,
                &mut out,
                &mut evicted,
            );
        }
        cell.push(a.row("meta-publish", 64, args.batch, round));

        let mut a = Acc::new();
        let mut k = next_key;
        while a.t0.elapsed() < dur {
            keys.clear();
            for _ in 0..batch {
                // Walk back over the most recent 30,000 keys (fewer after a short publish
                // phase): all resident.
                k = if k == 0 || k + 30_000 <= next_key {
                    next_key
                } else {
                    k - 1
                };
                keys.push(PageKey::from_bytes(&k.to_le_bytes()));
            }
            let c0 = Instant::now();
            meta_pool.lookup_batch(&keys, &mut locs);
            hist::record(&mut a.h, c0.elapsed());
            a.pages += batch as u64;
            a.errors += locs.iter().filter(|l| l.is_none()).count() as u64;
        }
        cell.push(a.row("meta-lookup", 64, args.batch, round));
        Ok(())
    })?;
    let ratio = report::ratio_of_medians(&rows, "publish", "memcpy", args.page_bytes);
    let med = |name: &str, f: fn(&Row) -> f64| report::median_of(&rows, name, f);
    let stats = pool.stats();
    Ok(Report {
        bench: "pool".into(),
        host: Host::detect(),
        config: serde_json::json!({
            "page_bytes": args.page_bytes, "source_mib": args.source_mib, "pool_mib": args.pool_mib,
            "batch": args.batch, "rounds": args.run.rounds, "secs": args.run.secs,
        }),
        results: rows.clone(),
        summary: serde_json::json!({
            "publish/memcpy": (ratio * 1000.0).round() / 1000.0,
            "publish_gb_per_s_median": med("publish", |r| r.gb_per_s),
            "memcpy_gb_per_s_median": med("memcpy", |r| r.gb_per_s),
            "meta_publish_ops_per_s_median": med("meta-publish", |r| r.pages_per_s),
            "meta_lookup_ops_per_s_median": med("meta-lookup", |r| r.pages_per_s),
            "publish_evictions": stats.evicted_retained,
        }),
    })
}

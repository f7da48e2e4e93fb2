//! `disk`: write-through and promote throughput at 128 KiB against a plain sequential file
//! write and read of the same bytes, in the same run and the same folder.

use std::io::{Read, Write};
use std::time::Instant;

use anyhow::Result;
use peercache_pool::disk::{DiskConfig, DiskTier};
use peercache_pool::{Pool, PoolConfig, PublishScratch, Published};
use peercache_wire::PageKey;

use crate::load::rawtcp::prefaulted;
use crate::load::sweep::Rounds;
use crate::report::{self, Host, Report, Row};

/// Options of the `disk` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct DiskArgs {
    /// Page size.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages per round.
    #[arg(long, default_value_t = 2048)]
    pub pages: u64,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: u64,
    /// Folder to measure in (default: a temporary folder).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
    /// Write the report here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

fn row(name: &str, page: u64, pages: u64, secs: f64, round: u64, errors: u64) -> Row {
    Row {
        name: name.into(),
        page_bytes: page,
        batch: 32,
        concurrency: 1,
        pages_per_s: pages as f64 / secs,
        gb_per_s: (pages * page) as f64 / secs / 1e9,
        hit_pct: 100.0,
        errors,
        round,
        ..Row::default()
    }
}

/// Runs the `disk` subcommand.
pub fn run(args: &DiskArgs) -> Result<Report> {
    let tmp = tempfile::tempdir_in(args.dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let page = args.page_bytes as usize;
    let n = args.pages as usize;
    let src = prefaulted(page * n, 29);
    let pool = Pool::new(PoolConfig {
        background: false,
        ..PoolConfig::new((page + 4096) * n + (64 << 20))
    })?;
    let mut rows = Vec::new();
    Rounds::new("disk", args.rounds).run(&mut rows, |cell| {
        let round = cell.round;
        // Plain sequential file write of the same bytes.
        let path = tmp.path().join(format!("plain-{round}"));
        let t0 = Instant::now();
        {
            let mut f = std::fs::File::create(&path)?;
            for i in 0..n {
                f.write_all(&src[i * page..(i + 1) * page])?;
            }
        }
        cell.push(row(
            "file-write",
            args.page_bytes,
            n as u64,
            t0.elapsed().as_secs_f64(),
            round,
            0,
        ));

        // Write-through: queue every page, then wait until all are on disk.
        let dir = tmp.path().join(format!("tier-{round}"));
        let tier = DiskTier::open(DiskConfig {
            dir: dir.clone(),
            capacity: (page as u64 + 64) * n as u64 * 2,
            queue_depth: 256,
            segment_bytes: 0,
        })?;
        let keys: Vec<PageKey> = (0..n)
            .map(|i| PageKey::from_key(&format!("disk-bench/{round}/{i}")))
            .collect();
        let t0 = Instant::now();
        let mut dropped = 0;
        for (i, k) in keys.iter().enumerate() {
            let seg = &src[i * page..(i + 1) * page];
            while !tier.put(*k, &[seg], page as u32, 0, peercache_wire::Layout::NONE) {
                // The bench measures sustained throughput: wait for queue room instead of
                // skipping (a node skips and counts).
                dropped += 1;
                tier.flush();
            }
        }
        tier.flush();
        cell.push(row(
            "write-through",
            args.page_bytes,
            n as u64,
            t0.elapsed().as_secs_f64(),
            round,
            0,
        ));

        // Plain sequential read back.
        let mut buf = vec![0u8; page];
        let t0 = Instant::now();
        {
            let mut f = std::fs::File::open(&path)?;
            for _ in 0..n {
                f.read_exact(&mut buf)?;
            }
        }
        cell.push(row(
            "file-read",
            args.page_bytes,
            n as u64,
            t0.elapsed().as_secs_f64(),
            round,
            0,
        ));

        // Promote into the pool, 32 pages per batch.
        pool.clear();
        let (mut out, mut ev) = (Vec::new(), Vec::new());
        let mut scratch = PublishScratch::default();
        let mut failed = 0u64;
        let t0 = Instant::now();
        for chunk in keys.chunks(32) {
            pool.promote_batch(&tier, chunk, &mut scratch, &mut out, &mut ev);
            failed += out
                .iter()
                .filter(|p| matches!(p, Published::Failed(_)))
                .count() as u64;
        }
        cell.push(row(
            "promote",
            args.page_bytes,
            n as u64,
            t0.elapsed().as_secs_f64(),
            round,
            failed,
        ));
        // Both the plain file and the tier's segments are deleted together, so every round
        // starts from the same free-space state for both.
        drop(tier);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "disk: round {round} done ({dropped} queue-full waits, load {:.2})",
            report::load_1m()
        );
        Ok(())
    })?;
    let ratio = |a: &str, b: &str| report::ratio_of_medians(&rows, a, b, args.page_bytes);
    Ok(Report {
        bench: "disk".into(),
        host: Host::detect(),
        config: serde_json::json!({"page_bytes": args.page_bytes, "pages": args.pages, "rounds": args.rounds, "queue_depth": 256}),
        summary: serde_json::json!({
            "write-through/file-write": (ratio("write-through", "file-write") * 1000.0).round() / 1000.0,
            "promote/file-read": (ratio("promote", "file-read") * 1000.0).round() / 1000.0,
        }),
        results: rows,
    })
}

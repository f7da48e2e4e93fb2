//! `scale`'s disk re-publish run: a node restarts on a disk tier that holds many small pages,
//! and the cluster must find them again.
//!
//! The tier is filled through [`DiskTier`] itself (the records a previous life of the node
//! wrote with write-through), then three nodes start on loopback and the restarted node joins
//! them on that folder: a real [`Store`] scans its segments, joins, and re-publishes every
//! recovered page to the directory shards of the ring. Reported: the scan (node start), the
//! re-publish after the node became ready, and the total; then another node checks that every
//! page is present and reads a sample byte-exact (promoted from the restarted node's disk).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use peercache_pool::disk::{DiskConfig, DiskTier};
use peercache_store::{PeerCacheConfig, Store};
use peercache_wire::PageKey;
use serde_json::json;

use crate::cmd::serve::fill_page;
use crate::report::Row;

/// The target of the scale issue: a restarted node's small disk pages found again within this.
pub const TARGET_REPUBLISH_SECS: f64 = 10.0;

/// Options of the re-publish run.
#[derive(Debug, Clone, clap::Args)]
pub struct RepublishArgs {
    /// Pages on the restarted node's disk tier (0: no re-publish run).
    #[arg(long, default_value_t = 1_000_000)]
    pub republish_pages: u64,
    /// Bytes per disk page.
    #[arg(long, default_value_t = 4096)]
    pub republish_page_bytes: u64,
}

/// Node id of the restarted node (its disk folder is `<root>/<id>`).
const RESTARTED: &str = "republish-a";

fn key(i: u64) -> String {
    format!("republish/{i}")
}

/// Bytes of tier the pages need: each record carries a header; segments are whole.
fn capacity(pages: u64, page_bytes: u64) -> u64 {
    let records = pages * (page_bytes + 64);
    records + records / 8 + (512 << 20)
}

/// Writes `pages` records into the tier folder `dir`, as write-through would have.
fn fill(dir: &Path, pages: u64, page_bytes: u64) -> Result<Duration> {
    let t0 = Instant::now();
    let mut cfg = DiskConfig::new(dir.to_path_buf(), capacity(pages, page_bytes));
    cfg.queue_depth = 8192;
    let tier = DiskTier::open(cfg).context("opening the disk tier to fill")?;
    let mut buf = vec![0u8; page_bytes as usize];
    for i in 0..pages {
        let k = key(i);
        fill_page(&k, &mut buf);
        if i % 4096 == 4095 {
            // The writer thread drains a bounded queue; wait for it instead of dropping.
            tier.flush();
        }
        ensure!(
            tier.put(
                PageKey::from_key(&k),
                &[&buf],
                page_bytes as u32,
                1,
                peercache_wire::Layout::NONE
            ),
            "the disk tier refused page {i} while filling"
        );
    }
    tier.flush();
    let st = tier.stats();
    ensure!(
        st.keys == pages,
        "the tier holds {} of {pages} pages",
        st.keys
    );
    Ok(t0.elapsed())
}

fn node(ip: &str, seed: &str, id: &str, extra: serde_json::Value) -> Result<Store> {
    let mut cfg = json!({
        "discovery_addr": seed, "protocol": "tcp", "node_id": id,
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb", "heartbeat_interval": 0.5, "member_ttl": 1.5,
        "metrics_enabled": false, "host_local": false,
        "cluster_secret": crate::load::secret::generated(),
    });
    for (k, v) in extra.as_object().context("extra")? {
        cfg[k] = v.clone();
    }
    let (cfg, _) = PeerCacheConfig::from_map(cfg.as_object().context("config")?)?;
    let s = Store::start(cfg)?;
    s.wait_ready(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// Runs the re-publish scenario; pushes a row and returns the summary's `republish`.
pub fn run(args: &RepublishArgs, rows: &mut Vec<Row>) -> Result<serde_json::Value> {
    let pages = args.republish_pages;
    let page_bytes = args.republish_page_bytes;
    ensure!(
        (64..=(1 << 20)).contains(&page_bytes),
        "--republish-page-bytes must be 64 B to 1 MiB"
    );
    let root = tempfile::Builder::new()
        .prefix("peercache-republish-")
        .tempdir()
        .context("a folder for the disk tier")?;
    let wrote = fill(&root.path().join(RESTARTED), pages, page_bytes)?;
    eprintln!(
        "scale: republish: {pages} pages of {page_bytes} B written to the disk tier in {:.1} s",
        wrote.as_secs_f64()
    );
    let port = std::net::TcpListener::bind("127.0.0.71:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.71:{port}");
    let b = node("127.0.0.71", &seed, "republish-b", json!({}))?;
    let others = [
        node("127.0.0.72", &seed, "republish-c", json!({}))?,
        node("127.0.0.73", &seed, "republish-d", json!({}))?,
    ];
    ensure!(
        b.wait_members(3, Duration::from_secs(20)),
        "the three nodes did not see each other"
    );
    let t0 = Instant::now();
    let a = node(
        "127.0.0.74",
        &seed,
        RESTARTED,
        json!({
            "disk_enabled": true,
            "disk_path": root.path().to_str().context("a UTF-8 folder")?,
            "disk_size": capacity(pages, page_bytes),
        }),
    )?;
    let ready = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    while a.stats().disk_republished < pages && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let republished = a.stats().disk_republished;
    let total = t0.elapsed();
    // Check from another node: every page present, a sample byte-exact.
    let mut present = 0u64;
    let keys: Vec<String> = (0..pages).map(key).collect();
    for chunk in keys.chunks(16_384) {
        // A directory lookup: `batch_contains` would start promoting every disk-only page.
        present += b.locate(chunk)?.iter().filter(|o| o.is_some()).count() as u64;
    }
    let sample: Vec<String> = (0..pages)
        .step_by((pages as usize / 64).max(1))
        .map(key)
        .collect();
    let mut wrong = 0u64;
    let mut want = vec![0u8; page_bytes as usize];
    for chunk in sample.chunks(16) {
        let mut bufs = vec![vec![0u8; page_bytes as usize]; chunk.len()];
        let mut dst: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let got = b.batch_get(chunk, &mut dst)?;
        for ((k, g), buf) in chunk.iter().zip(got).zip(&bufs) {
            fill_page(k, &mut want);
            if !g || *buf != want {
                wrong += 1;
            }
        }
    }
    for s in others.iter().chain([&a, &b]) {
        s.shutdown();
    }
    let secs = total.as_secs_f64();
    eprintln!(
        "scale: republish: {republished} of {pages} pages re-published {secs:.2} s after the \
         restart (ready at {:.2} s); {present} present at another node; {} of {} sampled \
         pages read wrong",
        ready.as_secs_f64(),
        wrong,
        sample.len()
    );
    let mut row = Row::empty(&format!("republish/{pages}"));
    row.pages_per_s = republished as f64 / secs.max(1e-9);
    row.max_us = secs * 1e6;
    row.hit_pct = 100.0 * present as f64 / pages.max(1) as f64;
    row.errors = (pages - present.min(pages)) + wrong;
    rows.push(row);
    let r3 = |d: f64| (d * 1000.0).round() / 1000.0;
    Ok(json!({
        "pages": pages,
        "page_bytes": page_bytes,
        "fill_s": r3(wrote.as_secs_f64()),
        "ready_s": r3(ready.as_secs_f64()),
        "republished_s": r3(secs),
        "target_s": TARGET_REPUBLISH_SECS,
        "meets_target": secs <= TARGET_REPUBLISH_SECS && present == pages && wrong == 0,
        "republished": republished,
        "present": present,
        "sampled": sample.len(),
        "wrong": wrong,
    }))
}

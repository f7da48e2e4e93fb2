//! `latency --breakdown`: where a `get` call's time goes, stage by stage
//! ([`peercache_store::observe::read_timing`]), as rows `get/<stage>` with each stage's percentiles
//! over the calls of one round.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use peercache_store::Store;
use peercache_store::observe::read_timing::{self, ReadStages};

use crate::report::Row;

/// How a stage's time is read from a capture.
pub type Pick = fn(&ReadStages) -> Duration;

/// The stages reported, in call order, with how each is read from a capture.
pub const STAGES: [(&str, Pick); 7] = [
    ("locate", |s| s.locate),
    ("local", |s| s.local),
    ("prepare", |s| s.prepare),
    ("transport", |s| s.transport),
    ("verify", |s| s.verify),
    ("other", |s| s.other()),
    ("total", |s| s.total),
];

/// Times `batch`-page gets of the next keys of `keys` for `measure`, one call at a time on
/// this thread, and returns a row `get/<stage>` per stage (percentiles in µs, at nanosecond
/// resolution; `errors` counts calls that missed a page).
pub fn get_stages(
    store: &Store,
    keys: &[String],
    page: usize,
    batch: usize,
    start: u64,
    measure: Duration,
    round: u64,
) -> Vec<Row> {
    let mut hists: Vec<Histogram<u64>> = STAGES
        .iter()
        .map(|_| Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds"))
        .collect();
    let mut bufs = crate::load::rawtcp::prefaulted(batch * page, 3);
    let mut k = start;
    let mut errors = 0u64;
    let until = Instant::now() + measure;
    while Instant::now() < until {
        let ks: Vec<&str> = (0..batch)
            .map(|_| {
                k = (k + 1) % keys.len() as u64;
                keys[k as usize].as_str()
            })
            .collect();
        let mut dst: Vec<&mut [u8]> = bufs.chunks_mut(page).collect();
        let (found, stages) = read_timing::capture(|| store.batch_get(&ks, &mut dst));
        if !found.is_ok_and(|f| f.iter().all(|&x| x)) {
            errors += 1;
        }
        for (h, (_, pick)) in hists.iter_mut().zip(STAGES) {
            let ns = (pick(&stages).as_nanos() as u64).clamp(1, 60_000_000_000);
            h.record(ns).expect("value clamped into range");
        }
    }
    STAGES
        .iter()
        .zip(&hists)
        .map(|((name, _), h)| {
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            Row {
                name: format!("get/{name}"),
                page_bytes: page as u64,
                batch: batch as u64,
                p50_us: us(0.5),
                p95_us: us(0.95),
                p99_us: us(0.99),
                p999_us: us(0.999),
                max_us: h.max() as f64 / 1000.0,
                errors,
                round,
                ..Row::empty("")
            }
        })
        .collect()
}

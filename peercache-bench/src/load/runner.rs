//! Runs one row: `concurrency` threads, each with one batch in flight, for a fixed time.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::report::Row;
use crate::report::hist;

/// What one call of a worker did.
pub struct CallOutcome {
    /// Pages moved (or looked up).
    pub pages: u64,
    /// Pages requested but not found.
    pub misses: u64,
    /// True if the call failed.
    pub error: bool,
    /// True if this worker has nothing more to do (a page budget ran out): its measurement
    /// ends before this call, which is not counted.
    pub stop: bool,
}

impl CallOutcome {
    /// A call that did `pages` of work, `misses` not found.
    pub fn done(pages: u64, misses: u64, error: bool) -> Self {
        CallOutcome {
            pages,
            misses,
            error,
            stop: false,
        }
    }

    /// The worker is finished.
    pub fn stop() -> Self {
        CallOutcome {
            pages: 0,
            misses: 0,
            error: false,
            stop: true,
        }
    }
}

/// Timing of one row.
pub struct Timing {
    /// Warm-up before measuring.
    pub warmup: Duration,
    /// Measured time.
    pub measure: Duration,
}

/// Runs `make(thread)` workers on `concurrency` threads and folds their calls into a [`Row`].
pub fn run_row<F, W>(
    name: &str,
    page_bytes: u64,
    batch: u64,
    concurrency: u64,
    round: u64,
    t: &Timing,
    make: F,
) -> Row
where
    F: Fn(usize) -> W,
    W: FnMut() -> CallOutcome + Send + 'static,
{
    run_row_counts(name, page_bytes, batch, concurrency, round, t, make).0
}

/// What a row measured, before it is folded into a [`Row`] (for merging across processes).
pub struct RowCounts {
    /// Latency of every measured call, µs.
    pub hist: hdrhistogram::Histogram<u64>,
    /// Pages moved.
    pub pages: u64,
    /// Pages not found.
    pub misses: u64,
    /// Failed calls.
    pub errors: u64,
    /// Measured time.
    pub elapsed: Duration,
}

/// [`run_row`], also returning the raw counts and histogram.
pub fn run_row_counts<F, W>(
    name: &str,
    page_bytes: u64,
    batch: u64,
    concurrency: u64,
    round: u64,
    t: &Timing,
    make: F,
) -> (Row, RowCounts)
where
    F: Fn(usize) -> W,
    W: FnMut() -> CallOutcome + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(concurrency as usize));
    let (warm, meas) = (t.warmup, t.measure);
    let handles: Vec<_> = (0..concurrency as usize)
        .map(|i| {
            let mut w = make(i);
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let mut stopped = false;
                while start.elapsed() < warm && !stopped {
                    stopped = w().stop;
                }
                let mut h = hist::new();
                let (mut pages, mut misses, mut errors) = (0u64, 0u64, 0u64);
                let t0 = Instant::now();
                let mut end = t0;
                while !stopped && t0.elapsed() < meas {
                    let c0 = Instant::now();
                    let o = w();
                    if o.stop {
                        break;
                    }
                    end = Instant::now();
                    hist::record(&mut h, end - c0);
                    pages += o.pages;
                    misses += o.misses;
                    errors += o.error as u64;
                }
                (h, pages, misses, errors, end - t0)
            })
        })
        .collect();
    let mut h = hist::new();
    let (mut pages, mut misses, mut errors) = (0u64, 0u64, 0u64);
    let mut elapsed = Duration::ZERO;
    for th in handles {
        let (hh, p, m, e, el) = th.join().expect("bench worker panicked");
        h.add(&hh).expect("same histogram bounds");
        pages += p;
        misses += m;
        errors += e;
        elapsed = elapsed.max(el);
    }
    let counts = RowCounts {
        hist: h,
        pages,
        misses,
        errors,
        elapsed,
    };
    (
        fold_row(name, page_bytes, batch, concurrency, round, &counts),
        counts,
    )
}

/// Folds counts (of one process, or merged from several) into a [`Row`].
pub fn fold_row(
    name: &str,
    page_bytes: u64,
    batch: u64,
    concurrency: u64,
    round: u64,
    c: &RowCounts,
) -> Row {
    let looked = c.pages + c.misses;
    Row {
        concurrency,
        hit_pct: if looked == 0 {
            100.0
        } else {
            100.0 * c.pages as f64 / looked as f64
        },
        errors: c.errors,
        round,
        ..Row::measured(
            name,
            page_bytes,
            batch,
            c.pages,
            c.elapsed.as_secs_f64(),
            &c.hist,
        )
    }
}

/// Calls `f` back to back on this thread for `dur`, timing each call; `f` returns how many of
/// its items failed. Returns the latencies, the calls, the failed items and the seconds taken.
pub fn time_calls(
    dur: Duration,
    mut f: impl FnMut() -> u64,
) -> (hdrhistogram::Histogram<u64>, u64, u64, f64) {
    let mut h = hist::new();
    let (mut calls, mut failed) = (0u64, 0u64);
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        let c0 = Instant::now();
        failed += f();
        hist::record(&mut h, c0.elapsed());
        calls += 1;
    }
    (h, calls, failed, t0.elapsed().as_secs_f64())
}

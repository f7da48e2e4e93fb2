//! [`Tally`]: one count that is both a Prometheus series (through the `metrics` facade) and a
//! value the crate's `stats()` reads, so every event is counted by one call, once.
//!
//! ```
//! use peercache_wire::tally::Tally;
//! let t = Tally::new(metrics::counter!("example_events_total"));
//! t.add(3);
//! t.add(0); // free: nothing is touched
//! assert_eq!(t.get(), 3);
//! let copy = t.clone(); // the same count
//! copy.add(1);
//! assert_eq!(t.get(), 4);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A cumulative counter readable by its owner and exported as one metrics series (and, for a
/// name kept from an earlier release, as a gauge of the same value: see [`Tally::mirrored`]).
/// Clones share the count.
#[derive(Clone)]
pub struct Tally {
    value: Arc<AtomicU64>,
    series: metrics::Counter,
    mirror: Option<metrics::Gauge>,
}

impl Tally {
    /// A count exported as `series` (resolve the handle once, with its labels).
    pub fn new(series: metrics::Counter) -> Self {
        Tally {
            value: Arc::new(AtomicU64::new(0)),
            series,
            mirror: None,
        }
    }

    /// The same count also exported as `gauge`, moved by the same call: a dashboard written
    /// for a release that exported this count as a gauge under another name keeps working,
    /// and the two series never disagree.
    ///
    /// ```
    /// use peercache_wire::tally::Tally;
    /// let t = Tally::new(metrics::counter!("example_timeouts_total"))
    ///     .mirrored(metrics::gauge!("example_read_timeouts"));
    /// t.add(2);
    /// assert_eq!(t.get(), 2);
    /// ```
    pub fn mirrored(mut self, gauge: metrics::Gauge) -> Self {
        gauge.set(self.get() as f64);
        self.mirror = Some(gauge);
        self
    }

    /// Adds `n` events (no work at all for `n == 0`).
    #[inline]
    pub fn add(&self, n: u64) {
        if n != 0 {
            self.value.fetch_add(n, Ordering::Relaxed);
            self.series.increment(n);
            if let Some(g) = &self.mirror {
                mirror(g, n);
            }
        }
    }

    /// Adds one event and returns the new total.
    #[inline]
    pub fn bump(&self) -> u64 {
        self.series.increment(1);
        if let Some(g) = &self.mirror {
            mirror(g, 1);
        }
        self.value.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Events so far.
    #[inline]
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Moves a kept-name gauge: out of line, so the counters inlined on hot paths stay as small
/// as they were (only a handful of RDMA counters have a mirror).
#[cold]
#[inline(never)]
fn mirror(g: &metrics::Gauge, n: u64) {
    g.increment(n as f64);
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tally({})", self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_series_and_the_value_see_the_same_events() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let t = metrics::with_local_recorder(&recorder, || {
            Tally::new(metrics::counter!("tally_test_total", "side" => "a"))
        });
        t.add(5);
        assert_eq!(t.bump(), 6);
        t.add(0);
        let exported: Vec<u64> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(k, _, _, v)| match v {
                metrics_util::debugging::DebugValue::Counter(n)
                    if k.key().name() == "tally_test_total" =>
                {
                    Some(n)
                }
                _ => None,
            })
            .collect();
        assert_eq!(exported, [6]);
        assert_eq!(t.get(), 6);
    }

    #[test]
    fn a_mirrored_count_moves_its_gauge_with_the_same_call() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let t = metrics::with_local_recorder(&recorder, || {
            Tally::new(metrics::counter!("mirror_test_total"))
                .mirrored(metrics::gauge!("mirror_test"))
        });
        t.add(4);
        t.bump();
        t.add(0);
        let mut counter = None;
        let mut gauge = None;
        for (k, _, _, v) in snapshotter.snapshot().into_vec() {
            match (k.key().name(), v) {
                ("mirror_test_total", metrics_util::debugging::DebugValue::Counter(n)) => {
                    counter = Some(n)
                }
                ("mirror_test", metrics_util::debugging::DebugValue::Gauge(g)) => {
                    gauge = Some(g.into_inner())
                }
                _ => {}
            }
        }
        assert_eq!(counter, Some(5));
        assert_eq!(gauge, Some(5.0));
        assert_eq!(t.get(), 5);
    }
}

//! Latency histograms (microseconds) and their percentiles.

use hdrhistogram::Histogram;

/// A latency histogram from 1 µs to 60 s with 3 significant digits.
pub fn new() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Records a duration in microseconds (clamped into range).
pub fn record(h: &mut Histogram<u64>, d: std::time::Duration) {
    let us = (d.as_micros() as u64).clamp(1, 60_000_000);
    h.record(us).expect("value clamped into range");
}

/// (p50, p95, p99, p999, max) in µs.
pub fn percentiles(h: &Histogram<u64>) -> (f64, f64, f64, f64, f64) {
    if h.is_empty() {
        return (0.0, 0.0, 0.0, 0.0, 0.0);
    }
    (
        h.value_at_quantile(0.50) as f64,
        h.value_at_quantile(0.95) as f64,
        h.value_at_quantile(0.99) as f64,
        h.value_at_quantile(0.999) as f64,
        h.max() as f64,
    )
}

//! Staying up under connection floods: accept loops that back off when the process runs out
//! of descriptors instead of spinning, and warnings that cannot flood the log.
//!
//! Every listener of a node (the data port's blocking accept thread, the async RPC ports) uses
//! [`AcceptBackoff`] on accept errors and [`Throttle`] for its "at the connection limit" line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// At most one line per this period from one [`Throttle`].
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Lets one event in per [`WARN_EVERY`] and counts the ones it held back.
#[derive(Debug, Default)]
pub struct Throttle {
    last_s: AtomicU64,
    held: AtomicU64,
}

impl Throttle {
    /// A throttle that lets the first event in.
    pub const fn new() -> Self {
        Throttle {
            last_s: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this event may be logged, `n` being the events held back since the last
    /// one; `None` to stay quiet.
    pub fn admit(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.last_s.load(Ordering::Relaxed);
        if (last == 0 || now >= last + WARN_EVERY.as_secs())
            && self
                .last_s
                .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.held.swap(0, Ordering::Relaxed))
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// What an accept loop should do after `accept` failed.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    pause: Option<Duration>,
    throttle: Throttle,
}

/// Shortest and longest pause after running out of descriptors.
const MIN_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Errors that mean the process or the system is out of a resource: accepting again at once
/// would fail the same way (the pending connection stays queued), so the loop must wait.
fn exhausted(e: &std::io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

impl AcceptBackoff {
    /// A fresh backoff.
    pub fn new() -> Self {
        AcceptBackoff::default()
    }

    /// An accept succeeded: the next exhaustion starts from the shortest pause again.
    pub fn accepted(&mut self) {
        self.pause = None;
    }

    /// An accept failed with `e`: how long to pause before the next one (zero: retry now, the
    /// error concerned one connection only). Out of descriptors it doubles from 10 ms to 1 s
    /// and logs one warning per 10 s, naming `listener`.
    pub fn failed(&mut self, e: &std::io::Error, listener: &str) -> Duration {
        if !exhausted(e) {
            return Duration::ZERO;
        }
        let pause = self.pause.map_or(MIN_PAUSE, |p| (p * 2).min(MAX_PAUSE));
        self.pause = Some(pause);
        if let Some(held) = self.throttle.admit() {
            tracing::warn!(
                listener,
                error = %e,
                ?pause,
                repeated = held,
                "cannot accept connections (out of file descriptors?); pausing accepts"
            );
        }
        pause
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_admits_one_event_per_period_and_counts_the_rest() {
        let t = Throttle::new();
        assert_eq!(t.admit(), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.admit(), None);
        }
        assert_eq!(t.held.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn running_out_of_descriptors_backs_off_exponentially_to_a_cap() {
        let mut b = AcceptBackoff::new();
        let emfile = std::io::Error::from_raw_os_error(24);
        let pauses: Vec<Duration> = (0..10).map(|_| b.failed(&emfile, "test")).collect();
        assert_eq!(pauses[0], MIN_PAUSE);
        assert_eq!(pauses[1], MIN_PAUSE * 2);
        assert_eq!(*pauses.last().unwrap(), MAX_PAUSE);
        let aborted = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
        assert_eq!(b.failed(&aborted, "test"), Duration::ZERO);
        b.accepted();
        assert_eq!(b.failed(&emfile, "test"), MIN_PAUSE);
    }
}

//! Where one read's time goes: the stages of a `get` on the calling thread, captured on
//! request ([`capture`]) for `peercache-bench latency --breakdown`.
//!
//! Off by default and then nearly free: each stage boundary reads one thread-local flag and
//! takes no clock. Inside [`capture`], each stage adds its wall time to a [`ReadStages`];
//! stages that run more than once in a call (one transport batch per owner) add up.
//!
//! # Example
//!
//! ```
//! use peercache_store::observe::read_timing::{self, ReadStages};
//!
//! let (answer, stages) = read_timing::capture(|| 6 * 7);
//! assert_eq!(answer, 42);
//! // Nothing was read, so no stage took any time.
//! assert_eq!(stages, ReadStages::default());
//! ```

use std::cell::Cell;
use std::time::{Duration, Instant};

/// The stages of one read call, each the wall time the calling thread spent in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStages {
    /// Finding the owners: a primed `exists`, the read cache, or a directory fan-out.
    pub locate: Duration,
    /// Pages this node owns: leases, disk promotion, the copy out of the pool.
    pub local: Duration,
    /// Building each remote batch: scratch memory, destination segments.
    pub prepare: Duration,
    /// The transport carrying each remote batch: request out, every page's bytes in.
    pub transport: Duration,
    /// Checking each remote page (header, key, generation, checksum), and copying it out of
    /// staging where it could not land directly.
    pub verify: Duration,
    /// The whole call.
    pub total: Duration,
}

impl ReadStages {
    /// What the named stages leave of the whole call (argument checks, bookkeeping,
    /// counters).
    pub fn other(&self) -> Duration {
        self.total
            .saturating_sub(self.locate + self.local + self.prepare + self.transport + self.verify)
    }
}

thread_local! {
    static CAPTURE: Cell<Option<ReadStages>> = const { Cell::new(None) };
}

/// Runs `f` (a read on this thread) and returns what each read stage took within it.
/// Captures nest: an inner capture's stages are not added to the outer one.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, ReadStages) {
    let outer = CAPTURE.with(|c| c.replace(Some(ReadStages::default())));
    let r = f();
    let got = CAPTURE.with(|c| c.replace(outer)).unwrap_or_default();
    (r, got)
}

/// A stage in progress: holds its start only while a capture is armed on this thread.
#[must_use = "a stage is counted when it ends"]
pub(crate) struct Stage(Option<Instant>);

impl Stage {
    /// Starts a stage (takes the clock only inside [`capture`]).
    #[inline]
    pub(crate) fn start() -> Stage {
        let armed = CAPTURE.with(|c| c.get().is_some());
        Stage(armed.then(Instant::now))
    }

    /// Ends it, adding its time to the field `pick` names.
    #[inline]
    pub(crate) fn end(self, pick: fn(&mut ReadStages) -> &mut Duration) {
        self.end_less(pick, Duration::ZERO);
    }

    /// Ends it, adding its time less `inner` (a stage that ran inside it and counted itself)
    /// to the field `pick` names.
    #[inline]
    pub(crate) fn end_less(self, pick: fn(&mut ReadStages) -> &mut Duration, inner: Duration) {
        if let Some(t0) = self.0 {
            let took = t0.elapsed().saturating_sub(inner);
            CAPTURE.with(|c| {
                if let Some(mut s) = c.get() {
                    *pick(&mut s) += took;
                    c.set(Some(s));
                }
            });
        }
    }
}

/// What the capture armed on this thread has counted so far (zero when none is).
#[inline]
pub(crate) fn so_far() -> ReadStages {
    CAPTURE.with(|c| c.get()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_add_up_inside_a_capture_and_cost_nothing_outside() {
        // Outside a capture a stage takes no clock.
        assert!(Stage::start().0.is_none());
        let ((), s) = capture(|| {
            for _ in 0..2 {
                let st = Stage::start();
                std::thread::sleep(Duration::from_millis(2));
                st.end(|s| &mut s.transport);
            }
            let st = Stage::start();
            st.end(|s| &mut s.verify);
        });
        assert!(s.transport >= Duration::from_millis(4), "{s:?}");
        assert!(s.verify < s.transport, "{s:?}");
        assert_eq!(s.locate, Duration::ZERO);
        // The capture is over: nothing is armed any more.
        assert!(Stage::start().0.is_none());
    }

    #[test]
    fn captures_nest_without_mixing() {
        let ((inner, ()), outer) = capture(|| {
            let st = Stage::start();
            let ((), inner) = capture(|| {
                let st = Stage::start();
                std::thread::sleep(Duration::from_millis(1));
                st.end(|s| &mut s.locate);
            });
            st.end(|s| &mut s.total);
            (inner, ())
        });
        assert!(inner.locate >= Duration::from_millis(1));
        assert_eq!(inner.total, Duration::ZERO);
        assert_eq!(outer.locate, Duration::ZERO, "the inner stage stays inner");
        assert!(outer.total >= inner.locate);
        assert_eq!(outer.other(), outer.total);
    }
}

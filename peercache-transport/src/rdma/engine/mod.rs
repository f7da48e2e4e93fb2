//! The RDMA engine: turns a batch of one-sided ops into work requests on a peer's queue pairs
//! and accounts for every completion — independent of the verbs library underneath.
//!
//! * **Rails**: a host may have several NICs; rails pair by index with the peer's. Ops are
//!   striped over the rails by op index (op `i` goes to rail `i % rails`), each rail working on
//!   its share at once.
//! * **Channels**: per (peer, rail) a small pool of queue pairs, each with its own completion
//!   queue; a batch leases one per rail and returns it — or discards it when it failed.
//! * **Posting**: an op whose local segments exceed the device's `max_sge` is split into
//!   several work requests over consecutive remote addresses; requests are posted in windows of
//!   at most the send-queue depth, only the last of each window signaled (the others
//!   unsignaled: the hardware reports errors on them anyway).
//! * **Deadline**: each window must complete within the batch deadline. When it does not, the
//!   queue pair is moved to the error state and its completion queue is drained until every
//!   posted request is accounted for — flushed or completed — *before* the call returns, so no
//!   late DMA can touch memory the caller reuses. The channel is then discarded.
//! * **Counters**: work-completion errors (with the last status), timeouts, discarded
//!   channels, post failures.
//!
//! The verbs interface the backends implement is in `types`; one rail's share of a batch in
//! flight — its requests, windows, polling and the drain after a failure — in `rail`.

use super::RdmaError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

mod rail;
mod types;

use rail::RailRun;
pub use types::{
    Completion, EngineOp, LocalSge, MAX_RAILS, QueuePair, RdmaOp, RdmaOpError, Sge, Verbs,
    WcStatus, WorkRequest,
};

pub use crate::metrics::EngineCounters;

/// The channels of one (peer, rail): the idle ones, and how many exist (idle or leased).
struct Channels<Q> {
    idle: Vec<Q>,
    live: usize,
}

impl<Q> Default for Channels<Q> {
    fn default() -> Self {
        Channels {
            idle: Vec::new(),
            live: 0,
        }
    }
}

type Pools<Q> = Mutex<HashMap<(String, usize), Channels<Q>>>;

/// The engine over a backend.
pub struct Engine<V: Verbs> {
    verbs: V,
    pools: Pools<V::Qp>,
    /// Signalled whenever a channel is given back or discarded (a waiter may lease).
    freed: Condvar,
    max_idle: usize,
    /// Most channels (queue pairs) per (peer, rail), idle or leased.
    max_live: usize,
    /// Counters.
    pub counters: Arc<EngineCounters>,
}

impl<V: Verbs> std::fmt::Debug for Engine<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("rails", &self.verbs.rails())
            .finish()
    }
}

/// Why no channel could be leased.
enum Lease {
    /// Every channel the limit allows is in use until the deadline.
    Busy,
    /// Connecting a new one failed.
    Connect(RdmaError),
}

impl<V: Verbs> Engine<V> {
    /// An engine keeping at most `max_idle` idle channels per (peer, rail), with no bound on
    /// how many exist at once (see [`Engine::with_channel_limit`]).
    pub fn new(verbs: V, max_idle: usize) -> Self {
        Self::with_channel_limit(verbs, max_idle, usize::MAX)
    }

    /// An engine with at most `max_live` channels (queue pairs) per (peer, rail), idle or in
    /// use — `max_channels_per_peer`. A batch that finds them all in use waits for one within
    /// its deadline (its ops then fail with [`RdmaOpError::Timeout`]); each queue pair costs
    /// the peer memory and a completion queue, so a burst of callers cannot make a peer create
    /// without bound.
    pub fn with_channel_limit(verbs: V, max_idle: usize, max_live: usize) -> Self {
        let max_live = max_live.max(1);
        Engine {
            verbs,
            pools: Mutex::new(HashMap::new()),
            freed: Condvar::new(),
            max_idle: max_idle.min(max_live),
            max_live,
            counters: Arc::new(EngineCounters::default()),
        }
    }

    /// Runs `ops` against `peer` within `timeout`; one result per op.
    pub fn execute(
        &self,
        peer: &str,
        ops: &[EngineOp],
        timeout: Duration,
    ) -> Vec<Result<(), RdmaOpError>> {
        let deadline = Instant::now() + timeout;
        let rails = self.verbs.rails().clamp(1, MAX_RAILS);
        let mut results: Vec<Result<(), RdmaOpError>> = vec![Ok(()); ops.len()];
        // Stripe by op index; each rail's share runs on its own channel, all rails at once.
        let mut runs = Vec::with_capacity(rails);
        for rail in 0..rails {
            let share: Vec<usize> = (rail..ops.len()).step_by(rails).collect();
            if share.is_empty() {
                continue;
            }
            match self.lease(peer, rail, deadline) {
                Ok(qp) => runs.push(RailRun::new(qp, rail, ops, share)),
                Err(why) => {
                    let e = match why {
                        Lease::Busy => {
                            self.counters.lease_timeouts.add(1);
                            RdmaOpError::Timeout
                        }
                        Lease::Connect(e) => {
                            tracing::debug!(peer, rail, error = %e, "connecting a queue pair failed");
                            self.counters.lease_failures.add(1);
                            RdmaOpError::Post
                        }
                    };
                    for i in share {
                        results[i] = Err(e);
                    }
                }
            }
        }
        // Every rail's first window is posted before any rail is polled, so a batch striped
        // over N NICs moves on all of them at once; then each rail posts its next window as
        // soon as its current one completed.
        for r in &mut runs {
            self.post_window(r);
        }
        loop {
            let (mut busy, mut progressed) = (false, false);
            for r in runs.iter_mut().filter(|r| r.in_flight()) {
                busy = true;
                progressed |= self.poll_rail(r);
            }
            if !busy {
                break;
            }
            if Instant::now() >= deadline {
                for r in runs.iter_mut().filter(|r| r.in_flight()) {
                    self.counters.timeouts[r.wrs[0].op.index()].add(1);
                    r.healthy = false;
                    r.timed_out = true;
                }
                break;
            }
            if !progressed {
                std::hint::spin_loop();
            }
        }
        for mut r in runs {
            if self.finish(&mut r, deadline, &mut results) {
                self.give_back(peer, r.rail, r.qp);
            } else {
                self.counters.channel_discards.add(1);
                let rail = r.rail;
                drop(r); // the queue pair is destroyed before its place is freed
                self.release(peer, rail);
            }
        }
        results
    }

    /// The backend.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    /// An idle channel to `peer` on `rail`, or a new one while fewer than `max_live` exist;
    /// else waits for one to be given back, until `deadline`.
    fn lease(&self, peer: &str, rail: usize, deadline: Instant) -> Result<V::Qp, Lease> {
        let key = (peer.to_string(), rail);
        let mut pools = self.pools.lock();
        loop {
            let c = pools.entry(key.clone()).or_default();
            if let Some(q) = c.idle.pop() {
                return Ok(q);
            }
            if c.live < self.max_live {
                c.live += 1;
                break;
            }
            if self.freed.wait_until(&mut pools, deadline).timed_out() {
                // One last look: a channel freed at the deadline still serves.
                let c = pools.entry(key.clone()).or_default();
                if let Some(q) = c.idle.pop() {
                    return Ok(q);
                }
                return Err(Lease::Busy);
            }
        }
        drop(pools);
        match self.verbs.connect(peer, rail) {
            Ok(q) => Ok(q),
            Err(e) => {
                self.release(peer, rail);
                Err(Lease::Connect(e))
            }
        }
    }

    fn give_back(&self, peer: &str, rail: usize, qp: V::Qp) {
        let mut pools = self.pools.lock();
        let c = pools.entry((peer.to_string(), rail)).or_default();
        if c.idle.len() < self.max_idle {
            c.idle.push(qp);
        } else {
            c.live = c.live.saturating_sub(1);
            drop(pools);
            drop(qp);
        }
        self.freed.notify_one();
    }

    /// A channel of (`peer`, `rail`) is gone (discarded or never connected): its place is free.
    fn release(&self, peer: &str, rail: usize) {
        let mut pools = self.pools.lock();
        if let Some(c) = pools.get_mut(&(peer.to_string(), rail)) {
            c.live = c.live.saturating_sub(1);
        }
        self.freed.notify_one();
    }

    /// Channels to `peer` on `rail` that exist now (idle or leased).
    pub fn channels(&self, peer: &str, rail: usize) -> usize {
        self.pools
            .lock()
            .get(&(peer.to_string(), rail))
            .map_or(0, |c| c.live)
    }
}

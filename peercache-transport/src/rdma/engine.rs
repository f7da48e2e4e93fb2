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

use super::RdmaError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;

/// One-sided operation kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaOp {
    /// Remote memory → local segments.
    Read,
    /// Local segments → remote memory.
    Write,
}

impl RdmaOp {
    /// The index of this op in per-op counters ([`EngineCounters`]): read 0, write 1.
    pub fn index(self) -> usize {
        match self {
            RdmaOp::Read => 0,
            RdmaOp::Write => 1,
        }
    }
}

/// A local scatter/gather element: address, length, local key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Local address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key of the registration that covers it.
    pub lkey: u32,
}

/// One work request as posted to a send queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Caller's id, echoed in the completion.
    pub wr_id: u64,
    /// Read or write.
    pub op: RdmaOp,
    /// Local segments, at most the device's `max_sge`.
    pub sges: SmallVec<[Sge; 4]>,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Whether a successful completion is reported.
    pub signaled: bool,
}

/// Status of a work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// Done.
    Success,
    /// Flushed because the queue pair entered the error state.
    Flushed,
    /// Any other error, with the provider's status code.
    Error(u32),
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
}

/// One queue pair with its private completion queue, as the engine sees it.
pub trait QueuePair: Send {
    /// Posts a chain of work requests.
    fn post(&mut self, wrs: &[WorkRequest]) -> Result<(), RdmaError>;
    /// Appends completions to `out` (about `max`; a backend may return more when its device
    /// hands them over in bigger batches — none may be dropped); returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize;
    /// Moves the queue pair to the error state: outstanding requests are flushed.
    fn to_error(&mut self);
    /// Most SGEs per request.
    fn max_sge(&self) -> usize;
    /// Send-queue depth (most requests outstanding).
    fn sq_depth(&self) -> usize;
}

/// A verbs backend: opens queue pairs to a peer on a rail.
pub trait Verbs: Send + Sync {
    /// The backend's queue pair.
    type Qp: QueuePair;
    /// Rails (NICs) of this host.
    fn rails(&self) -> usize;
    /// Connects a new queue pair to `peer` on `rail`.
    fn connect(&self, peer: &str, rail: usize) -> Result<Self::Qp, RdmaError>;
}

/// Most rails the engine drives (the largest hosts carry eight NICs).
pub const MAX_RAILS: usize = 8;

/// A local segment of an op: its memory is registered on every rail, each registration with
/// its own local key (rails are separate devices and protection domains).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalSge {
    /// Local address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key on each rail (index = rail; unused entries 0).
    pub lkeys: [u32; MAX_RAILS],
}

impl LocalSge {
    /// A segment whose local keys are `lkeys` on rails 0, 1, … in order.
    pub fn new(addr: u64, len: u32, lkeys: &[u32]) -> LocalSge {
        let mut k = [0u32; MAX_RAILS];
        for (d, s) in k.iter_mut().zip(lkeys) {
            *d = *s;
        }
        LocalSge {
            addr,
            len,
            lkeys: k,
        }
    }
}

/// One op of a batch.
#[derive(Clone, Debug)]
pub struct EngineOp {
    /// Read or write.
    pub op: RdmaOp,
    /// Local segments in order.
    pub local: SmallVec<[LocalSge; 4]>,
    /// Remote start address.
    pub remote_addr: u64,
    /// Remote key on each rail (rails pair by index).
    pub rkeys: SmallVec<[u32; 2]>,
}

/// Why an op failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdmaOpError {
    /// A work completion with an error status.
    #[error("work completion error {0}")]
    Wc(u32),
    /// Flushed after another request of the batch failed or the deadline passed.
    #[error("flushed")]
    Flushed,
    /// The deadline passed before it completed.
    #[error("timed out")]
    Timeout,
    /// Could not post (or connect).
    #[error("post failed")]
    Post,
}

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

/// The requests of one op: (first wr index, count).
type Span = (usize, usize);

/// Builds the requests of one rail's ops, SGE lists chunked to `max_sge`.
fn build_requests(
    ops: &[EngineOp],
    share: &[usize],
    rail: usize,
    max_sge: usize,
) -> (Vec<WorkRequest>, Vec<Span>) {
    let mut wrs = Vec::new();
    let mut spans = Vec::with_capacity(share.len());
    for &i in share {
        let op = &ops[i];
        let first = wrs.len();
        let mut remote = op.remote_addr;
        let rkey = op
            .rkeys
            .get(rail)
            .or(op.rkeys.first())
            .copied()
            .unwrap_or(0);
        for chunk in op.local.chunks(max_sge.max(1)) {
            wrs.push(WorkRequest {
                wr_id: wrs.len() as u64,
                op: op.op,
                sges: chunk
                    .iter()
                    .map(|l| Sge {
                        addr: l.addr,
                        len: l.len,
                        lkey: l.lkeys[rail],
                    })
                    .collect(),
                remote_addr: remote,
                rkey,
                signaled: false,
            });
            remote += chunk.iter().map(|s| s.len as u64).sum::<u64>();
        }
        spans.push((first, wrs.len() - first));
    }
    (wrs, spans)
}

/// One rail's share of a batch in flight: its channel, its requests and what became of them.
struct RailRun<Q> {
    rail: usize,
    qp: Q,
    /// The batch's op indices this rail carries.
    share: Vec<usize>,
    wrs: Vec<WorkRequest>,
    /// Per op of `share`, its requests in `wrs`.
    spans: Vec<Span>,
    /// Per request, its outcome; `None` = no completion seen (yet).
    done: Vec<Option<WcStatus>>,
    /// Requests posted so far (windows are posted in order).
    posted: usize,
    /// The send-queue depth: the most requests of one window.
    depth: usize,
    healthy: bool,
    timed_out: bool,
    /// Completions of one poll (allocated once per rail and batch).
    cqes: Vec<Completion>,
}

impl<Q: QueuePair> RailRun<Q> {
    fn new(qp: Q, rail: usize, ops: &[EngineOp], share: Vec<usize>) -> Self {
        let (wrs, spans) = build_requests(ops, &share, rail, qp.max_sge());
        let depth = qp.sq_depth().max(1);
        RailRun {
            rail,
            done: vec![None; wrs.len()],
            qp,
            share,
            wrs,
            spans,
            posted: 0,
            depth,
            healthy: true,
            timed_out: false,
            cqes: Vec::with_capacity(depth),
        }
    }

    /// Still waiting for the completion of its last posted window.
    fn in_flight(&self) -> bool {
        self.healthy && self.posted > 0 && self.done[self.posted - 1].is_none()
    }
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

    /// Posts `r`'s next window (at most the send-queue depth, its last request signaled).
    fn post_window(&self, r: &mut RailRun<V::Qp>) {
        if !r.healthy || r.posted >= r.wrs.len() {
            return;
        }
        let end = (r.posted + r.depth).min(r.wrs.len());
        r.wrs[end - 1].signaled = true;
        if r.qp.post(&r.wrs[r.posted..end]).is_err() {
            self.counters.post_failures.add(1);
            for d in &mut r.done[r.posted..] {
                *d = Some(WcStatus::Error(u32::MAX));
            }
            r.healthy = false;
            return;
        }
        self.counters.wrs_posted.add((end - r.posted) as u64);
        r.posted = end;
    }

    /// Polls `r` once; posts its next window when the current one completed. True when a
    /// completion arrived.
    fn poll_rail(&self, r: &mut RailRun<V::Qp>) -> bool {
        r.cqes.clear();
        r.qp.poll(&mut r.cqes, r.depth);
        self.record(&r.cqes, &r.wrs, &mut r.done, &mut r.healthy);
        if r.healthy && r.done[r.posted - 1].is_some() {
            self.post_window(r);
        }
        !r.cqes.is_empty()
    }

    /// Drains `r` if it failed, then writes its ops' results; false when the channel must be
    /// discarded.
    fn finish(
        &self,
        r: &mut RailRun<V::Qp>,
        deadline: Instant,
        results: &mut [Result<(), RdmaOpError>],
    ) -> bool {
        // False when a queue pair in error did not flush within the grace.
        let mut drained = true;
        if !r.healthy && r.posted > 0 {
            // Drain before release: the error state flushes whatever has not executed; a
            // signaled marker posted behind everything completes (flushed) only after every
            // earlier request did, so when it shows up no late DMA can touch the caller's
            // memory any more.
            r.qp.to_error();
            let marker = WorkRequest {
                wr_id: DRAIN_MARKER,
                op: RdmaOp::Read,
                sges: SmallVec::new(),
                remote_addr: 0,
                rkey: 0,
                signaled: true,
            };
            if r.qp.post(std::slice::from_ref(&marker)).is_ok() {
                // Bounded too: a device that never flushes must not hold the caller. Past the
                // grace the channel is discarded, and destroying its queue pair (before the
                // batch returns) stops any DMA into the caller's memory.
                let until = Instant::now().max(deadline) + DRAIN_GRACE;
                let mut seen = false;
                drained = false;
                while !seen {
                    r.cqes.clear();
                    r.qp.poll(&mut r.cqes, r.depth);
                    seen = r.cqes.iter().any(|c| c.wr_id == DRAIN_MARKER);
                    self.record(&r.cqes, &r.wrs, &mut r.done, &mut r.healthy);
                    drained = seen;
                    if !seen && Instant::now() >= until {
                        self.counters.drain_timeouts.add(1);
                        tracing::warn!("a queue pair did not drain in time; destroying it");
                        break;
                    }
                    if r.cqes.is_empty() {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        // Requests without a completion executed successfully (unsignaled ones report only
        // errors, and completions come in order) — unless the queue pair never finished
        // draining: then nothing is known of them, and they failed.
        let unknown = if drained {
            WcStatus::Success
        } else {
            WcStatus::Flushed
        };
        for d in &mut r.done[..r.posted] {
            d.get_or_insert(unknown);
        }
        // Requests of windows never posted (an earlier window failed or timed out) did not
        // run: their ops failed with the batch, whatever the posted ones did.
        for d in &mut r.done[r.posted..] {
            d.get_or_insert(WcStatus::Flushed);
        }
        for (k, &(first, n)) in r.spans.iter().enumerate() {
            // The op's first request that did not succeed decides; every request has a
            // status by now.
            let st = r.done[first..first + n]
                .iter()
                .map(|d| d.unwrap_or(WcStatus::Flushed))
                .find(|d| *d != WcStatus::Success)
                .unwrap_or(WcStatus::Success);
            results[r.share[k]] = match st {
                WcStatus::Success => Ok(()),
                WcStatus::Flushed if r.timed_out => Err(RdmaOpError::Timeout),
                WcStatus::Flushed => Err(RdmaOpError::Flushed),
                WcStatus::Error(u32::MAX) => Err(RdmaOpError::Post),
                WcStatus::Error(c) => Err(RdmaOpError::Wc(c)),
            };
        }
        r.healthy
    }

    fn record(
        &self,
        cqes: &[Completion],
        wrs: &[WorkRequest],
        done: &mut [Option<WcStatus>],
        healthy: &mut bool,
    ) {
        for c in cqes {
            let Some(d) = done.get_mut(c.wr_id as usize) else {
                continue;
            };
            *d = Some(c.status);
            if c.status != WcStatus::Success {
                *healthy = false;
                if let WcStatus::Error(code) = c.status {
                    let op = wrs.get(c.wr_id as usize).map_or(RdmaOp::Read, |w| w.op);
                    self.counters.wc_error(op.index(), code);
                }
            }
        }
    }
}

/// The wr_id of the drain marker (never a request index).
const DRAIN_MARKER: u64 = u64::MAX;

/// How long past the batch deadline a queue pair in error may take to flush its requests.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;

/// One-sided operation kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaOp {
    /// Remote memory → local segments.
    Read,
    /// Local segments → remote memory.
    Write,
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

type Pools<Q> = Mutex<HashMap<(String, usize), Vec<Q>>>;

/// The engine over a backend.
pub struct Engine<V: Verbs> {
    verbs: V,
    pools: Pools<V::Qp>,
    max_idle: usize,
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

/// The requests of one op: (first wr index, count).
type Span = (usize, usize);

impl<V: Verbs> Engine<V> {
    /// An engine keeping at most `max_idle` idle channels per (peer, rail).
    pub fn new(verbs: V, max_idle: usize) -> Self {
        Engine {
            verbs,
            pools: Mutex::new(HashMap::new()),
            max_idle,
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
        // Stripe by op index; each rail's share runs on its own channel. (Rails run one after
        // another here; their work overlaps on the wire because each window is posted before
        // it is polled.)
        for rail in 0..rails {
            let share: Vec<usize> = (rail..ops.len()).step_by(rails).collect();
            if share.is_empty() {
                continue;
            }
            let mut qp = match self.lease(peer, rail) {
                Ok(q) => q,
                Err(_) => {
                    self.counters.lease_failures.add(1);
                    for &i in &share {
                        results[i] = Err(RdmaOpError::Post);
                    }
                    continue;
                }
            };
            let ok = self.run_rail(&mut qp, rail, ops, &share, deadline, &mut results);
            if ok {
                self.give_back(peer, rail, qp);
            } else {
                self.counters.channel_discards.add(1);
            }
        }
        results
    }

    /// The backend.
    pub fn verbs(&self) -> &V {
        &self.verbs
    }

    fn lease(&self, peer: &str, rail: usize) -> Result<V::Qp, RdmaError> {
        if let Some(q) = self
            .pools
            .lock()
            .get_mut(&(peer.to_string(), rail))
            .and_then(|v| v.pop())
        {
            return Ok(q);
        }
        self.verbs.connect(peer, rail)
    }

    fn give_back(&self, peer: &str, rail: usize, qp: V::Qp) {
        let mut pools = self.pools.lock();
        let v = pools.entry((peer.to_string(), rail)).or_default();
        if v.len() < self.max_idle {
            v.push(qp);
        }
    }

    /// Builds the requests of one rail's ops, SGE lists chunked to `max_sge`.
    fn build(
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

    /// Posts and completes one rail's share; false when the channel must be discarded.
    fn run_rail(
        &self,
        qp: &mut V::Qp,
        rail: usize,
        ops: &[EngineOp],
        share: &[usize],
        deadline: Instant,
        results: &mut [Result<(), RdmaOpError>],
    ) -> bool {
        let (mut wrs, spans) = Self::build(ops, share, rail, qp.max_sge());
        // Per-request outcome; None = no completion seen (yet).
        let mut done: Vec<Option<WcStatus>> = vec![None; wrs.len()];
        let depth = qp.sq_depth().max(1);
        let mut healthy = true;
        let mut timed_out = false;
        // False when a queue pair in error did not flush within the grace.
        let mut drained = true;
        let mut posted = 0;
        let mut cqes = Vec::with_capacity(depth);
        while posted < wrs.len() && healthy {
            let end = (posted + depth).min(wrs.len());
            wrs[end - 1].signaled = true;
            if qp.post(&wrs[posted..end]).is_err() {
                self.counters.post_failures.add(1);
                for d in &mut done[posted..] {
                    *d = Some(WcStatus::Error(u32::MAX));
                }
                healthy = false;
                break;
            }
            self.counters.wrs_posted.add((end - posted) as u64);
            posted = end;
            // Wait for the window's signaled request, an error, or the deadline.
            loop {
                cqes.clear();
                qp.poll(&mut cqes, depth);
                self.record(&cqes, &mut done, &mut healthy);
                if done[end - 1].is_some() || !healthy {
                    break;
                }
                if Instant::now() >= deadline {
                    self.counters.timeouts.add(1);
                    healthy = false;
                    timed_out = true;
                    break;
                }
                if cqes.is_empty() {
                    std::hint::spin_loop();
                }
            }
        }
        if !healthy && posted > 0 {
            // Drain before release: the error state flushes whatever has not executed; a
            // signaled marker posted behind everything completes (flushed) only after every
            // earlier request did, so when it shows up no late DMA can touch the caller's
            // memory any more.
            qp.to_error();
            let marker = WorkRequest {
                wr_id: DRAIN_MARKER,
                op: RdmaOp::Read,
                sges: SmallVec::new(),
                remote_addr: 0,
                rkey: 0,
                signaled: true,
            };
            if qp.post(std::slice::from_ref(&marker)).is_ok() {
                // Bounded too: a device that never flushes must not hold the caller. Past the
                // grace the channel is discarded, and destroying its queue pair (before the
                // batch returns) stops any DMA into the caller's memory.
                let until = Instant::now().max(deadline) + DRAIN_GRACE;
                let mut seen = false;
                drained = false;
                while !seen {
                    cqes.clear();
                    qp.poll(&mut cqes, depth);
                    seen = cqes.iter().any(|c| c.wr_id == DRAIN_MARKER);
                    self.record(&cqes, &mut done, &mut healthy);
                    drained = seen;
                    if !seen && Instant::now() >= until {
                        self.counters.drain_timeouts.add(1);
                        tracing::warn!("a queue pair did not drain in time; destroying it");
                        break;
                    }
                    if cqes.is_empty() {
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
        for d in &mut done[..posted] {
            d.get_or_insert(unknown);
        }
        // Requests of windows never posted (an earlier window failed or timed out) did not
        // run: their ops failed with the batch, whatever the posted ones did.
        for d in &mut done[posted..] {
            d.get_or_insert(WcStatus::Flushed);
        }
        for (k, &(first, n)) in spans.iter().enumerate() {
            // The op's first request that did not succeed decides; every request has a
            // status by now.
            let st = done[first..first + n]
                .iter()
                .map(|d| d.unwrap_or(WcStatus::Flushed))
                .find(|d| *d != WcStatus::Success)
                .unwrap_or(WcStatus::Success);
            results[share[k]] = match st {
                WcStatus::Success => Ok(()),
                WcStatus::Flushed if timed_out => Err(RdmaOpError::Timeout),
                WcStatus::Flushed => Err(RdmaOpError::Flushed),
                WcStatus::Error(u32::MAX) => Err(RdmaOpError::Post),
                WcStatus::Error(c) => Err(RdmaOpError::Wc(c)),
            };
        }
        healthy
    }

    fn record(&self, cqes: &[Completion], done: &mut [Option<WcStatus>], healthy: &mut bool) {
        for c in cqes {
            let Some(d) = done.get_mut(c.wr_id as usize) else {
                continue;
            };
            *d = Some(c.status);
            if c.status != WcStatus::Success {
                *healthy = false;
                if let WcStatus::Error(code) = c.status {
                    self.counters.wc_errors.add(1);
                    self.counters
                        .last_wc_status
                        .store(code as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// The wr_id of the drain marker (never a request index).
const DRAIN_MARKER: u64 = u64::MAX;

/// How long past the batch deadline a queue pair in error may take to flush its requests.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

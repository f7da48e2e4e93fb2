//! One rail's share of a batch in flight: its work requests (SGE lists chunked to the
//! device's `max_sge`), posted in windows of the send-queue depth, polled, and — after an
//! error or the deadline — the queue pair moved to error and drained before the call returns.

use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::{
    Completion, Engine, EngineOp, QueuePair, RdmaOp, RdmaOpError, Sge, Verbs, WcStatus, WorkRequest,
};

/// The requests of one op: (first wr index, count).
pub(super) type Span = (usize, usize);

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
pub(super) struct RailRun<Q> {
    pub(super) rail: usize,
    pub(super) qp: Q,
    /// The batch's op indices this rail carries.
    pub(super) share: Vec<usize>,
    pub(super) wrs: Vec<WorkRequest>,
    /// Per op of `share`, its requests in `wrs`.
    pub(super) spans: Vec<Span>,
    /// Per request, its outcome; `None` = no completion seen (yet).
    pub(super) done: Vec<Option<WcStatus>>,
    /// Requests posted so far (windows are posted in order).
    pub(super) posted: usize,
    /// The send-queue depth: the most requests of one window.
    pub(super) depth: usize,
    pub(super) healthy: bool,
    pub(super) timed_out: bool,
    /// Completions of one poll (allocated once per rail and batch).
    pub(super) cqes: Vec<Completion>,
}

impl<Q: QueuePair> RailRun<Q> {
    pub(super) fn new(qp: Q, rail: usize, ops: &[EngineOp], share: Vec<usize>) -> Self {
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
    pub(super) fn in_flight(&self) -> bool {
        self.healthy && self.posted > 0 && self.done[self.posted - 1].is_none()
    }
}

impl<V: Verbs> Engine<V> {
    /// Posts `r`'s next window (at most the send-queue depth, its last request signaled).
    pub(super) fn post_window(&self, r: &mut RailRun<V::Qp>) {
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
    pub(super) fn poll_rail(&self, r: &mut RailRun<V::Qp>) -> bool {
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
    pub(super) fn finish(
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

//! What the engine asks of a verbs backend ([`Verbs`], [`QueuePair`]) and the ops, work
//! requests and completions that cross between them.

use super::RdmaError;

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
    /// The index of this op in per-op counters ([`EngineCounters`](super::EngineCounters)):
    /// read 0, write 1.
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

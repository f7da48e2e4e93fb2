//! Batches: the unit of transport work.

use crate::RegionKey;

/// A range of a peer's registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRange {
    /// The peer's region key.
    pub region: RegionKey,
    /// Start address inside that region (absolute, like an RDMA remote address).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A range of one of this process's registered regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Local region key.
    pub region: RegionKey,
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// One op: a remote range and the local segments it scatters into (read) or gathers from
/// (write), in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpDesc {
    /// The remote side.
    pub remote: RemoteRange,
    /// Index of the first local segment in [`Batch::segments`].
    pub seg_start: u32,
    /// Number of local segments.
    pub seg_count: u32,
}

/// A reusable list of ops. `clear()` keeps the capacity, so a caller that reuses one batch
/// allocates nothing per call.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    ops: Vec<OpDesc>,
    segs: Vec<Segment>,
    /// Local segments may name [`crate::RegionKey::UNREGISTERED`] memory (set only through the
    /// unsafe [`Batch::allow_unregistered`]).
    unregistered: bool,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `ops` ops and `segs` segments.
    pub fn with_capacity(ops: usize, segs: usize) -> Self {
        Batch {
            ops: Vec::with_capacity(ops),
            segs: Vec::with_capacity(segs),
            unregistered: false,
        }
    }

    /// Appends an op.
    pub fn push(&mut self, remote: RemoteRange, local: &[Segment]) {
        let seg_start = self.segs.len() as u32;
        self.segs.extend_from_slice(local);
        self.ops.push(OpDesc {
            remote,
            seg_start,
            seg_count: local.len() as u32,
        });
    }

    /// Lets local segments of this batch name [`crate::RegionKey::UNREGISTERED`] memory:
    /// the TCP plane then reads into (or writes from) them directly and the RDMA path
    /// registers them for the batch. Without this, such segments are refused per op.
    ///
    /// # Safety
    /// Until the batch has been executed (or cleared), every `UNREGISTERED` segment must be
    /// valid for writes (reads, for a write batch) of its length, and not overlap another
    /// segment of the batch or memory another thread uses meanwhile.
    pub unsafe fn allow_unregistered(&mut self) {
        self.unregistered = true;
    }

    /// Whether [`Batch::allow_unregistered`] was called since the last clear.
    pub fn allows_unregistered(&self) -> bool {
        self.unregistered
    }

    /// Empties the batch, keeping its capacity.
    pub fn clear(&mut self) {
        self.ops.clear();
        self.segs.clear();
        self.unregistered = false;
    }

    /// Number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if there are no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The ops.
    pub fn ops(&self) -> &[OpDesc] {
        &self.ops
    }

    /// All local segments (ops index into this).
    pub fn segments(&self) -> &[Segment] {
        &self.segs
    }

    /// The local segments of op `op`.
    pub fn op_segments(&self, op: &OpDesc) -> &[Segment] {
        &self.segs[op.seg_start as usize..(op.seg_start + op.seg_count) as usize]
    }

    /// Total remote bytes.
    pub fn total_bytes(&self) -> u64 {
        self.ops.iter().map(|o| o.remote.len as u64).sum()
    }
}

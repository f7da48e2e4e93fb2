//! What the tier's parts share: the index of records and segments, the writer's jobs, the
//! recovery scan's state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;

use parking_lot::{Condvar, Mutex};
use peercache_wire::PageKey;

use super::record::RecordHeader;
use super::types::DiskConfig;

/// Where one record is.
#[derive(Clone, Copy)]
pub(super) struct Entry {
    pub(super) seg: u64,
    pub(super) offset: u64,
    pub(super) header: RecordHeader,
}

/// One segment file.
pub(super) struct Segment {
    pub(super) file: Arc<File>,
    pub(super) bytes: u64,
    pub(super) keys: Vec<PageKey>,
    /// Most recent use of any record in it.
    pub(super) tick: u64,
}

/// Where every record is, and the segments in least-recently-used order.
pub(super) struct Index {
    pub(super) map: HashMap<PageKey, Entry>,
    pub(super) segs: BTreeMap<u64, Segment>,
    /// tick → segment, least recent first.
    pub(super) lru: BTreeMap<u64, u64>,
    pub(super) bytes: u64,
    pub(super) next_tick: u64,
    pub(super) active: Option<u64>,
    pub(super) next_seg: u64,
    /// While the recovery scan runs: keys written or forgotten since the tier opened, which
    /// the scan must not bring back (`None` once it is done).
    pub(super) touched: Option<HashSet<PageKey>>,
}

impl Index {
    pub(super) fn touch_seg(&mut self, seg: u64) {
        let t = self.next_tick;
        self.next_tick += 1;
        if let Some(s) = self.segs.get_mut(&seg) {
            self.lru.remove(&s.tick);
            s.tick = t;
            self.lru.insert(t, seg);
        }
    }
}

/// What the tier's threads share: settings, the index, counters, the writer's queue state.
pub(super) struct Shared {
    pub(super) cfg: DiskConfig,
    pub(super) index: Mutex<Index>,
    pub(super) counters: crate::metrics::DiskCounters,
    pub(super) disabled: AtomicBool,
    /// Keys queued for the writer and not yet written (or failed).
    pub(super) pending: Mutex<std::collections::HashSet<PageKey>>,
    /// Recycled page buffers, so queued writes allocate nothing in steady state.
    pub(super) free_bufs: Mutex<Vec<Vec<u8>>>,
    pub(super) recovery: Recovery,
}

/// The recovery scan's state.
pub(super) struct Recovery {
    /// True while it runs.
    pub(super) running: Mutex<bool>,
    /// Signalled when it ends.
    pub(super) ended: Condvar,
    /// Set when the tier is dropped: the scan stops between records.
    pub(super) stop: AtomicBool,
    /// The first segment this run writes: lower ids are a previous run's.
    pub(super) first_new: u64,
    /// The folder held segments at open.
    pub(super) previous: bool,
}

/// What the writer thread is handed.
pub(super) enum Job {
    Write { header: RecordHeader, buf: Vec<u8> },
    Barrier(mpsc::Sender<()>),
}

impl Shared {
    /// Keeps a written page's buffer for the next queued write (up to the queue's depth).
    pub(super) fn recycle(&self, buf: Vec<u8>) {
        let mut free = self.free_bufs.lock();
        if free.len() < self.cfg.queue_depth {
            free.push(buf);
        }
    }
}

/// The file of segment `id` in `dir`.
pub(super) fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:016x}.log"))
}

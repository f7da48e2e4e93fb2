//! [`DiskTier`]: the L4 tier — a log of records in segment files.
//!
//! * Writes go through a bounded queue to a dedicated thread that appends records to the active
//!   segment (`seg-<id>.log`, rolled at `segment_bytes`): sequential I/O, no file creation per
//!   page. When the queue is full the page is skipped and counted — memory stays bounded.
//! * An in-memory index maps each key to (segment, offset, header). The tier holds at most
//!   `capacity` bytes of segments; beyond it the least recently used segment (by the most
//!   recent use of any record in it) is deleted with its records.
//! * After a restart (or `kill -9`) the segments are scanned on a thread of their own while the
//!   tier already serves and writes (`pc-disk-recover`: the node does not wait for it; a page
//!   not yet indexed is a miss, and a page written or forgotten meanwhile is never undone by
//!   the scan): every record with a sound header
//!   and its full length is indexed (a newer record of a key wins); a torn or corrupt record is
//!   counted and skipped, the scan resuming at the next record whose marker, header and payload
//!   verify, so one bad record costs that record alone; the segment stays (its sound records are
//!   served) until the tier's least-recently-used eviction deletes it. Payload checksums are
//!   checked on every read; a corrupt record is dropped and reported, never served.
//! * A failed write (disk full, failing disk) disables the tier with one error log and a
//!   metric; records already on disk stay readable and the pool keeps working.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use peercache_wire::{Layout, PageKey};
use thiserror::Error;

use super::private::{self, UnsafeFolder};
use super::record::{RECORD_HEADER, RecordError, RecordHeader};

/// Why the disk tier refused something.
#[derive(Debug, Error)]
pub enum DiskError {
    /// The folder could not be created or read.
    #[error("disk tier folder {path}: {source}")]
    Folder {
        /// The folder.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The key is not on disk.
    #[error("page {0} is not on disk")]
    NotFound(PageKey),
    /// The destination does not match the page.
    #[error("destination holds {dst} bytes, page has {len}")]
    LengthMismatch {
        /// Destination bytes.
        dst: u64,
        /// Page bytes.
        len: u64,
    },
    /// The record failed verification (it has been dropped from the index).
    #[error("record of page {key} is corrupt: {reason:?}")]
    Corrupt {
        /// The page.
        key: PageKey,
        /// Why.
        reason: RecordError,
    },
    /// I/O on a record.
    #[error("disk i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The folder is not private to this user, so its contents cannot be trusted (see
    /// [`UnsafeFolder`]); nothing in it is read.
    #[error(
        "disk tier folder {path} refused: {why}; use a folder of this user's with mode 0700 (disk_path)"
    )]
    UnsafeFolder {
        /// The folder.
        path: PathBuf,
        /// What is wrong with it.
        why: UnsafeFolder,
    },
}

/// Disk tier settings.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    /// The tier's folder (already specific to the node, e.g. `<disk_path>/<node_id>`).
    pub dir: PathBuf,
    /// Bytes of segments kept.
    pub capacity: u64,
    /// Pages that may wait for the writer thread; beyond it writes are skipped and counted.
    pub queue_depth: usize,
    /// Segment size (0: capacity / 16, clamped to 1–256 MiB). Eviction works a segment at a
    /// time, so smaller segments follow LRU more closely.
    pub segment_bytes: u64,
}

impl DiskConfig {
    /// A tier in `dir` of `capacity` bytes with a 256-page queue and derived segments.
    pub fn new(dir: PathBuf, capacity: u64) -> Self {
        DiskConfig {
            dir,
            capacity,
            queue_depth: 256,
            segment_bytes: 0,
        }
    }

    fn segment_size(&self) -> u64 {
        if self.segment_bytes != 0 {
            return self.segment_bytes;
        }
        (self.capacity / 16).clamp(1 << 20, 256 << 20)
    }
}

/// Counters of the tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Records indexed.
    pub keys: u64,
    /// Bytes of segments on disk.
    pub bytes: u64,
    /// Segments on disk.
    pub segments: u64,
    /// Records written.
    pub writes: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Writes skipped (queue full, tier disabled).
    pub dropped: u64,
    /// Records dropped with their segment to stay within capacity.
    pub evictions: u64,
    /// Torn or corrupt records found.
    pub corrupt: u64,
    /// Records found by the recovery scan (counted when it ends).
    pub recovered: u64,
    /// True while the recovery scan of a previous run's segments goes on.
    pub recovering: bool,
    /// True once a failed write disabled the tier.
    pub disabled: bool,
    /// Reads served.
    pub reads: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    seg: u64,
    offset: u64,
    header: RecordHeader,
}

struct Segment {
    file: Arc<File>,
    bytes: u64,
    keys: Vec<PageKey>,
    /// Most recent use of any record in it.
    tick: u64,
}

struct Index {
    map: HashMap<PageKey, Entry>,
    segs: BTreeMap<u64, Segment>,
    /// tick → segment, least recent first.
    lru: BTreeMap<u64, u64>,
    bytes: u64,
    next_tick: u64,
    active: Option<u64>,
    next_seg: u64,
    /// While the recovery scan runs: keys written or forgotten since the tier opened, which
    /// the scan must not bring back (`None` once it is done).
    touched: Option<HashSet<PageKey>>,
}

impl Index {
    fn touch_seg(&mut self, seg: u64) {
        let t = self.next_tick;
        self.next_tick += 1;
        if let Some(s) = self.segs.get_mut(&seg) {
            self.lru.remove(&s.tick);
            s.tick = t;
            self.lru.insert(t, seg);
        }
    }
}

struct Shared {
    cfg: DiskConfig,
    index: Mutex<Index>,
    counters: crate::metrics::DiskCounters,
    disabled: AtomicBool,
    /// Keys queued for the writer and not yet written (or failed).
    pending: Mutex<std::collections::HashSet<PageKey>>,
    /// Recycled page buffers, so queued writes allocate nothing in steady state.
    free_bufs: Mutex<Vec<Vec<u8>>>,
    recovery: Recovery,
}

/// The recovery scan's state.
struct Recovery {
    /// True while it runs.
    running: Mutex<bool>,
    /// Signalled when it ends.
    ended: Condvar,
    /// Set when the tier is dropped: the scan stops between records.
    stop: AtomicBool,
    /// The first segment this run writes: lower ids are a previous run's.
    first_new: u64,
    /// The folder held segments at open.
    previous: bool,
}

enum Job {
    Write { header: RecordHeader, buf: Vec<u8> },
    Barrier(mpsc::Sender<()>),
}

/// The disk tier. Dropping it drains the queue and stops the writer (and a recovery scan still
/// running, between two records).
pub struct DiskTier {
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    scanner: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.shared.cfg.dir)
            .finish()
    }
}

/// The default parent folder of disk tiers: `$XDG_DATA_HOME/peercache`, else
/// `~/.local/share/peercache`; `None` when neither variable is set (no fallback to a shared
/// temporary folder: set `disk_path`).
pub fn default_root() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return Some(PathBuf::from(x).join("peercache"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|h| PathBuf::from(h).join(".local/share/peercache"))
}

fn seg_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:016x}.log"))
}

impl DiskTier {
    /// Opens (creating if needed) the tier and starts recovering what a previous run left, on
    /// a thread of its own: the tier serves and writes at once; [`DiskTier::wait_recovered`]
    /// waits for the scan.
    ///
    /// ```
    /// use peercache_pool::disk::{DiskConfig, DiskTier};
    /// use peercache_wire::{Layout, PageKey};
    /// let dir = tempfile::tempdir().unwrap();
    /// let cfg = DiskConfig::new(dir.path().join("tier"), 64 << 20);
    /// let key = PageKey::from_key("page");
    /// {
    ///     let tier = DiskTier::open(cfg.clone()).unwrap();
    ///     assert!(tier.put(key, &[&[7u8; 4096]], 4096, 1, Layout::NONE));
    ///     tier.flush();
    /// }
    /// // Restarted: the page is indexed again once the scan is done.
    /// let tier = DiskTier::open(cfg).unwrap();
    /// assert!(tier.wait_recovered(std::time::Duration::from_secs(10)));
    /// let mut page = vec![0u8; 4096];
    /// tier.read(key, &mut [&mut page[..]]).unwrap();
    /// assert_eq!(page, vec![7u8; 4096]);
    /// ```
    pub fn open(cfg: DiskConfig) -> Result<DiskTier, DiskError> {
        let dir = cfg.dir.clone();
        let folder = |source| DiskError::Folder {
            path: dir.clone(),
            source,
        };
        if let Err(why) = private::prepare_folder(&cfg.dir).map_err(folder)? {
            return Err(DiskError::UnsafeFolder { path: dir, why });
        }
        let old = segment_ids(&cfg.dir).map_err(folder)?;
        // Ids count up from 1, one per segment: an id past 2^63 was never written by a tier (a
        // stray or crafted file), and counting on from it would overflow.
        if let Some(&id) = old.last().filter(|&&id| id >= 1 << 63) {
            return Err(folder(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("segment seg-{id:016x}.log has an id no disk tier writes; move it aside"),
            )));
        }
        let first_new = old.last().map_or(1, |id| id + 1);
        let scanning = !old.is_empty();
        let shared = Arc::new(Shared {
            index: Mutex::new(Index {
                map: HashMap::new(),
                segs: BTreeMap::new(),
                lru: BTreeMap::new(),
                bytes: 0,
                next_tick: 1,
                active: None,
                next_seg: first_new,
                touched: scanning.then(HashSet::new),
            }),
            counters: {
                let c = crate::metrics::DiskCounters::register();
                c.recovering.set(if scanning { 1.0 } else { 0.0 });
                c
            },
            disabled: AtomicBool::new(false),
            pending: Mutex::new(Default::default()),
            free_bufs: Mutex::new(Vec::new()),
            recovery: Recovery {
                running: Mutex::new(scanning),
                ended: Condvar::new(),
                stop: AtomicBool::new(false),
                first_new,
                previous: scanning,
            },
            cfg,
        });
        let scanner = if scanning {
            tracing::info!(segments = old.len(), dir = %shared.cfg.dir.display(), "disk tier: recovering a previous run's segments in the background");
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("pc-disk-recover".into())
                .spawn(move || recover(&s, old));
            match spawned {
                Ok(t) => Some(t),
                Err(e) => {
                    end_recovery(&shared);
                    return Err(folder(e));
                }
            }
        } else {
            None
        };
        let (tx, rx) = mpsc::sync_channel::<Job>(shared.cfg.queue_depth.max(1));
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("pc-disk".into())
            .spawn(move || write_loop(&s, rx));
        let mut tier = DiskTier {
            shared,
            tx: Some(tx),
            writer: None,
            scanner,
        };
        // On an error, dropping `tier` stops the scan.
        tier.writer = Some(writer.map_err(folder)?);
        Ok(tier)
    }

    /// True while the recovery scan of a previous run's segments goes on (pages it has not
    /// reached yet are misses meanwhile).
    pub fn is_recovering(&self) -> bool {
        *self.shared.recovery.running.lock()
    }

    /// True when the folder held a previous run's segments at open: what the recovery scan
    /// finds in them is the [`DiskTier::inventory`] a restarted node re-publishes.
    pub fn found_previous_run(&self) -> bool {
        self.shared.recovery.previous
    }

    /// Waits up to `timeout` for the recovery scan to end; true once it has.
    pub fn wait_recovered(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let r = &self.shared.recovery;
        let mut running = r.running.lock();
        while *running {
            if r.ended.wait_until(&mut running, deadline).timed_out() {
                return !*running;
            }
        }
        true
    }

    /// The tier's folder.
    pub fn dir(&self) -> &Path {
        &self.shared.cfg.dir
    }

    /// Queues a page for write-through. Returns false (and counts a drop) when the queue is
    /// full, the page does not fit a segment, or the tier is disabled.
    pub fn put(
        &self,
        key: PageKey,
        segments: &[&[u8]],
        valid_len: u32,
        generation: u64,
        layout: Layout,
    ) -> bool {
        let len: usize = segments.iter().map(|s| s.len()).sum();
        let fits = (len as u64 + RECORD_HEADER as u64)
            <= self.shared.cfg.segment_size().min(self.shared.cfg.capacity);
        if len == 0 || !fits || self.is_disabled() {
            self.shared.counters.dropped.add(1);
            return false;
        }
        // The same page is already on disk; the same key in another layout is replaced.
        if self
            .shared
            .index
            .lock()
            .map
            .get(&key)
            .is_some_and(|e| e.header.layout == layout)
        {
            return true;
        }
        let mut buf = self.shared.free_bufs.lock().pop().unwrap_or_default();
        buf.clear();
        for s in segments {
            buf.extend_from_slice(s);
        }
        let header = RecordHeader {
            key,
            len: len as u32,
            valid_len: valid_len.min(len as u32),
            checksum: crate::header::checksum(&buf),
            generation,
            layout,
        };
        let Some(tx) = &self.tx else { return false };
        self.shared.pending.lock().insert(key);
        match tx.try_send(Job::Write { header, buf }) {
            Ok(()) => true,
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                self.shared.pending.lock().remove(&key);
                self.shared.counters.dropped.add(1);
                if let Job::Write { buf, .. } = job {
                    recycle(&self.shared, buf);
                }
                false
            }
        }
    }

    /// True once a write failed (disk full or failing).
    pub fn is_disabled(&self) -> bool {
        self.shared.disabled.load(Ordering::Relaxed)
    }

    /// True if `key` is on disk or queued to be written.
    pub fn holds_or_pending(&self, key: PageKey) -> bool {
        self.shared.pending.lock().contains(&key) || self.contains(key)
    }

    /// True if `key` is queued and not yet written.
    pub fn is_pending(&self, key: PageKey) -> bool {
        self.shared.pending.lock().contains(&key)
    }

    /// True if `key` is on disk.
    pub fn contains(&self, key: PageKey) -> bool {
        self.shared.index.lock().map.contains_key(&key)
    }

    /// The length of a page on disk.
    pub fn len_of(&self, key: PageKey) -> Option<u32> {
        self.shared.index.lock().map.get(&key).map(|e| e.header.len)
    }

    /// Every key on disk (for re-publishing after a restart).
    pub fn keys(&self) -> Vec<PageKey> {
        self.shared.index.lock().map.keys().copied().collect()
    }

    /// Every record a previous run left that is still on disk, as (key, payload bytes,
    /// layout), taken under one lock: what a restarted node re-publishes (call it once
    /// [`DiskTier::wait_recovered`] says the scan is done). Records this run wrote are not in
    /// it: their pages were published when they were written.
    pub fn inventory(&self) -> Vec<(PageKey, u32, Layout)> {
        let first_new = self.shared.recovery.first_new;
        let idx = self.shared.index.lock();
        idx.map
            .iter()
            .filter(|(_, e)| e.seg < first_new)
            .map(|(k, e)| (*k, e.header.len, e.header.layout))
            .collect()
    }

    /// Reads a page into `dst` segments and verifies it against its checksum.
    pub fn read(&self, key: PageKey, dst: &mut [&mut [u8]]) -> Result<RecordHeader, DiskError> {
        let (entry, file) = {
            let mut idx = self.shared.index.lock();
            let e = *idx.map.get(&key).ok_or(DiskError::NotFound(key))?;
            let file = idx
                .segs
                .get(&e.seg)
                .map(|s| s.file.clone())
                .ok_or(DiskError::NotFound(key))?;
            idx.touch_seg(e.seg);
            (e, file)
        };
        let h = entry.header;
        let total: u64 = dst.iter().map(|d| d.len() as u64).sum();
        if total != h.len as u64 {
            return Err(DiskError::LengthMismatch {
                dst: total,
                len: h.len as u64,
            });
        }
        let corrupt = |reason| DiskError::Corrupt { key, reason };
        let result = (|| -> Result<(), DiskError> {
            let mut hb = [0u8; RECORD_HEADER];
            file.read_exact_at(&mut hb, entry.offset)?;
            if RecordHeader::decode(&hb).map_err(corrupt)? != h {
                return Err(corrupt(RecordError::BadHeader));
            }
            let mut off = entry.offset + RECORD_HEADER as u64;
            let mut hasher = twox_hash::XxHash3_64::new();
            for d in dst.iter_mut() {
                file.read_exact_at(d, off).map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => corrupt(RecordError::Truncated),
                    _ => DiskError::Io(e),
                })?;
                std::hash::Hasher::write(&mut hasher, d);
                off += d.len() as u64;
            }
            if std::hash::Hasher::finish(&hasher) != h.checksum {
                return Err(corrupt(RecordError::PayloadChecksum));
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                self.shared.counters.reads.add(1);
                Ok(h)
            }
            Err(e @ DiskError::Corrupt { .. }) => {
                self.shared.counters.corrupt.add(1);
                tracing::warn!(%key, error = %e, "corrupt disk record dropped");
                self.remove(key);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Forgets a page (its bytes are reclaimed with its segment).
    pub fn remove(&self, key: PageKey) -> bool {
        let mut idx = self.shared.index.lock();
        if let Some(t) = &mut idx.touched {
            t.insert(key);
        }
        idx.map.remove(&key).is_some()
    }

    /// Waits until every write queued so far has been appended (to the page cache: records
    /// carry checksums, so a crash mid-write is detected at recovery rather than prevented).
    pub fn flush(&self) {
        let Some(tx) = &self.tx else { return };
        let (done_tx, done_rx) = mpsc::channel::<()>();
        if tx.send(Job::Barrier(done_tx)).is_ok() {
            let _ = done_rx.recv();
        }
    }

    /// Counters.
    pub fn stats(&self) -> DiskStats {
        let idx = self.shared.index.lock();
        let c = &self.shared.counters;
        DiskStats {
            keys: idx.map.len() as u64,
            bytes: idx.bytes,
            segments: idx.segs.len() as u64,
            writes: c.writes.get(),
            bytes_written: c.bytes_written.get(),
            dropped: c.dropped.get(),
            evictions: c.evictions.get(),
            corrupt: c.corrupt.get(),
            recovered: c.recovered.get(),
            recovering: idx.touched.is_some(),
            disabled: self.is_disabled(),
            reads: c.reads.get(),
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.shared.recovery.stop.store(true, Ordering::Release);
        if let Some(s) = self.scanner.take() {
            let _ = s.join();
        }
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn recycle(sh: &Shared, buf: Vec<u8>) {
    let mut free = sh.free_bufs.lock();
    if free.len() < sh.cfg.queue_depth {
        free.push(buf);
    }
}

fn write_loop(sh: &Shared, rx: Receiver<Job>) {
    let mut active: Option<(u64, File, u64)> = None;
    for job in rx {
        match job {
            Job::Barrier(done) => {
                let _ = done.send(());
            }
            Job::Write { header, buf } => {
                if sh.disabled.load(Ordering::Relaxed) {
                    sh.counters.dropped.add(1);
                } else if let Err(e) = append(sh, &mut active, &header, &buf) {
                    // One error line, then the tier stays off; the pool is unaffected.
                    sh.disabled.store(true, Ordering::Relaxed);
                    sh.counters.dropped.add(1);
                    metrics::gauge!(crate::metrics::DISK_DISABLED).set(1.0);
                    tracing::error!(dir = %sh.cfg.dir.display(), error = %e, "disk tier write failed; disk tier disabled, pool keeps working");
                }
                sh.pending.lock().remove(&header.key);
                recycle(sh, buf);
            }
        }
    }
}

/// Appends one record to the active segment (rolling and evicting as needed).
fn append(
    sh: &Shared,
    active: &mut Option<(u64, File, u64)>,
    h: &RecordHeader,
    payload: &[u8],
) -> std::io::Result<()> {
    let size = RECORD_HEADER as u64 + h.len as u64;
    let seg_size = sh.cfg.segment_size();
    if active
        .as_ref()
        .is_none_or(|(_, _, used)| used + size > seg_size)
    {
        let id = {
            let mut idx = sh.index.lock();
            let id = idx.next_seg;
            idx.next_seg += 1;
            id
        };
        let file = private::segment_options()
            .create(true)
            .append(true)
            .read(true)
            .open(seg_path(&sh.cfg.dir, id))?;
        let reader = Arc::new(file.try_clone()?);
        {
            let mut idx = sh.index.lock();
            let t = idx.next_tick;
            idx.next_tick += 1;
            idx.segs.insert(
                id,
                Segment {
                    file: reader,
                    bytes: 0,
                    keys: Vec::new(),
                    tick: t,
                },
            );
            idx.lru.insert(t, id);
            idx.active = Some(id);
        }
        *active = Some((id, file, 0));
    }
    let (id, file, used) = active.as_mut().expect("an active segment was just ensured");
    let offset = *used;
    let hb = h.encode();
    let mut iov = [std::io::IoSlice::new(&hb), std::io::IoSlice::new(payload)];
    write_all_vectored(file, &mut iov)?;
    *used += size;
    let mut victims: Vec<u64> = Vec::new();
    {
        let mut idx = sh.index.lock();
        if let Some(t) = &mut idx.touched {
            t.insert(h.key);
        }
        idx.map.insert(
            h.key,
            Entry {
                seg: *id,
                offset,
                header: *h,
            },
        );
        if let Some(s) = idx.segs.get_mut(id) {
            s.bytes += size;
            s.keys.push(h.key);
        }
        idx.bytes += size;
        idx.touch_seg(*id);
        // Stay within capacity: drop whole least-recently-used segments (never the active one).
        while idx.bytes > sh.cfg.capacity {
            let Some((&tick, &victim)) = idx.lru.iter().find(|(_, s)| Some(**s) != idx.active)
            else {
                break;
            };
            idx.lru.remove(&tick);
            if let Some(seg) = idx.segs.remove(&victim) {
                idx.bytes -= seg.bytes;
                let mut dropped = 0u64;
                for k in seg.keys {
                    if idx.map.get(&k).is_some_and(|e| e.seg == victim) {
                        idx.map.remove(&k);
                        dropped += 1;
                    }
                }
                sh.counters.evictions.add(dropped);
            }
            victims.push(victim);
        }
    }
    sh.counters.writes.add(1);
    sh.counters.bytes_written.add(h.len as u64);
    for v in victims {
        let _ = fs::remove_file(seg_path(&sh.cfg.dir, v));
    }
    Ok(())
}

fn write_all_vectored(f: &mut File, mut bufs: &mut [std::io::IoSlice<'_>]) -> std::io::Result<()> {
    while !bufs.is_empty() {
        match f.write_vectored(bufs) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "disk accepted no bytes",
                ));
            }
            Ok(n) => std::io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The ids of the segment files in `dir`, in order (other files are ignored).
fn segment_ids(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut ids: Vec<u64> = Vec::new();
    for ent in fs::read_dir(dir)? {
        let ent = ent?;
        let name = ent.file_name();
        let name = name.to_string_lossy();
        match name
            .strip_prefix("seg-")
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| u64::from_str_radix(n, 16).ok())
        {
            Some(id) => ids.push(id),
            None => {
                tracing::debug!(file = %name, "ignoring a foreign file in the disk tier folder")
            }
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// The recovery scan (its own thread): every segment of `ids` in order, each read without the
/// index lock and then indexed under one hold of it. A record counts when its header decodes
/// and its full length is present. A bad record (a torn tail after a crash, or corruption) is
/// counted and skipped: the scan resumes at the next record found by its marker whose header
/// and payload both verify ([`resync`]), so one bad record costs that record only. Later
/// records of a key replace earlier ones; a key this run wrote or forgot is left as it is.
/// A segment that cannot be read is skipped with an error line (it stays on disk).
fn recover(sh: &Shared, ids: Vec<u64>) {
    let t0 = Instant::now();
    for id in ids {
        if sh.recovery.stop.load(Ordering::Acquire) {
            break;
        }
        let path = seg_path(&sh.cfg.dir, id);
        match scan_segment(sh, &path) {
            Ok(Some((file, len, records))) => index_segment(sh, id, file, len, records),
            Ok(None) => break,
            Err(e) => {
                tracing::error!(segment = %path.display(), error = %e, "disk tier: a segment could not be recovered; its pages are not served")
            }
        }
    }
    let stopped = sh.recovery.stop.load(Ordering::Acquire);
    let (records, bytes) = {
        let idx = sh.index.lock();
        let first_new = sh.recovery.first_new;
        let records = idx.map.values().filter(|e| e.seg < first_new).count() as u64;
        (records, idx.bytes)
    };
    sh.counters.recovered.add(records);
    if !stopped {
        tracing::info!(records, bytes, secs = t0.elapsed().as_secs_f64(), dir = %sh.cfg.dir.display(), "disk tier recovered");
    }
    end_recovery(sh);
}

/// Marks the scan ended and wakes whoever waits for it.
fn end_recovery(sh: &Shared) {
    sh.index.lock().touched = None;
    *sh.recovery.running.lock() = false;
    sh.counters.recovering.set(0.0);
    sh.recovery.ended.notify_all();
}

/// One segment's sound records as (offset, header), with its file and length; `None` when
/// the tier is being dropped.
#[allow(clippy::type_complexity)]
fn scan_segment(
    sh: &Shared,
    path: &Path,
) -> std::io::Result<Option<(File, u64, Vec<(u64, RecordHeader)>)>> {
    private::tighten_file(path)?;
    let file = OpenOptions::new().read(true).open(path)?;
    let len = file.metadata()?.len();
    let mut off = 0u64;
    let mut records = Vec::new();
    let mut hb = [0u8; RECORD_HEADER];
    while off + RECORD_HEADER as u64 <= len {
        if sh.recovery.stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let sound = file
            .read_exact_at(&mut hb, off)
            .ok()
            .and_then(|()| RecordHeader::decode(&hb).ok())
            .filter(|h| off + (RECORD_HEADER as u64) + u64::from(h.len) <= len);
        let (at, h) = match sound {
            Some(h) => (off, h),
            None => {
                // A bad record: skip to the next whole, verified record (the rest of the
                // segment when there is none — a torn tail after a crash).
                sh.counters.corrupt.add(1);
                let next = resync(&file, off + 1, len);
                let to = next.map_or(len, |(at, _)| at);
                tracing::warn!(segment = %path.display(), at = off, skipped = to - off, size = len, "torn or corrupt disk record: skipped to the next sound record");
                match next {
                    Some(n) => n,
                    None => {
                        off = len;
                        break;
                    }
                }
            }
        };
        records.push((at, h));
        off = at + RECORD_HEADER as u64 + u64::from(h.len);
    }
    if off < len {
        // A tail shorter than a header.
        sh.counters.corrupt.add(1);
        tracing::warn!(segment = %path.display(), at = off, size = len, "torn disk record at the end of a segment: skipped");
    }
    Ok(Some((file, len, records)))
}

/// Indexes a scanned segment under one hold of the index lock.
fn index_segment(sh: &Shared, id: u64, file: File, len: u64, records: Vec<(u64, RecordHeader)>) {
    let mut idx = sh.index.lock();
    let mut keys = Vec::with_capacity(records.len());
    for (offset, header) in records {
        if idx
            .touched
            .as_ref()
            .is_some_and(|t| t.contains(&header.key))
        {
            continue;
        }
        idx.map.insert(
            header.key,
            Entry {
                seg: id,
                offset,
                header,
            },
        );
        keys.push(header.key);
    }
    let t = idx.next_tick;
    idx.next_tick += 1;
    idx.segs.insert(
        id,
        Segment {
            file: Arc::new(file),
            bytes: len,
            keys,
            tick: t,
        },
    );
    idx.lru.insert(t, id);
    idx.bytes += len;
}

/// Bytes read at a time while looking for the next record.
const RESYNC_CHUNK: usize = 1 << 20;

/// The first record at or after `from` (and before `len`) that is whole and sound: its marker
/// (the magic), a header that decodes, its full length present and a payload that matches its
/// checksum. The checks rule out the marker's bytes merely occurring in other data; bytes
/// crafted as a whole record inside a page's payload would pass them (docs/security.md says
/// what that allows). `None` when there is none.
fn resync(file: &File, from: u64, len: u64) -> Option<(u64, RecordHeader)> {
    let magic = super::record::RECORD_MAGIC;
    let mut buf = vec![0u8; RESYNC_CHUNK];
    let mut at = from;
    while at + RECORD_HEADER as u64 <= len {
        let n = (len - at).min(RESYNC_CHUNK as u64) as usize;
        file.read_exact_at(&mut buf[..n], at).ok()?;
        for i in 0..n.saturating_sub(magic.len() - 1) {
            if buf[i..i + magic.len()] != magic {
                continue;
            }
            let cand = at + i as u64;
            if let Some(h) = sound_at(file, cand, len) {
                return Some((cand, h));
            }
        }
        // The next chunk starts where a marker cut by this chunk's end would begin.
        at += (n - (magic.len() - 1)).max(1) as u64;
    }
    None
}

/// The record at `at` if its header decodes, its full length is present and its payload
/// verifies.
fn sound_at(file: &File, at: u64, len: u64) -> Option<RecordHeader> {
    let mut hb = [0u8; RECORD_HEADER];
    file.read_exact_at(&mut hb, at).ok()?;
    let h = RecordHeader::decode(&hb).ok()?;
    let start = at + RECORD_HEADER as u64;
    if start + u64::from(h.len) > len {
        return None;
    }
    let mut payload = vec![0u8; h.len as usize];
    file.read_exact_at(&mut payload, start).ok()?;
    h.verify_payload(&payload).ok()?;
    Some(h)
}

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
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use peercache_wire::{Layout, PageKey};

use super::private;
use super::record::{RECORD_HEADER, RecordError, RecordHeader};
use super::recover::{end_recovery, recover, segment_ids};
use super::state::{Index, Job, Recovery, Shared};
use super::types::{DiskConfig, DiskError, DiskStats};
use super::writer::write_loop;

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
                    self.shared.recycle(buf);
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

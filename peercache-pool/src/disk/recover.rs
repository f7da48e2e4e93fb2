//! Recovery after a restart: a previous run's segments scanned on a thread of their own,
//! every sound record indexed, a torn or corrupt one skipped by resynchronising on the next
//! record that verifies.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::private;
use super::record::{RECORD_HEADER, RecordHeader};
use super::state::{Entry, Segment, Shared, seg_path};

/// The ids of the segment files in `dir`, in order (other files are ignored).
pub(super) fn segment_ids(dir: &Path) -> std::io::Result<Vec<u64>> {
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
pub(super) fn recover(sh: &Shared, ids: Vec<u64>) {
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
pub(super) fn end_recovery(sh: &Shared) {
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

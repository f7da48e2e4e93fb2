//! The writer thread: queued records appended to the active segment, rolled at the segment
//! size, least recently used segments deleted to stay within capacity; a failed write
//! disables the tier.

use std::fs::{self, File};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use super::private;
use super::record::{RECORD_HEADER, RecordHeader};
use super::state::{Entry, Job, Segment, Shared, seg_path};

pub(super) fn write_loop(sh: &Shared, rx: Receiver<Job>) {
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
                sh.recycle(buf);
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

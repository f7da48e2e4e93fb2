//! The write wing: pages into the local pool (and the directory), or into the storage servers
//! or slot regions the mode names.

use std::sync::atomic::AtomicBool;

use peercache_directory::Location;
use peercache_pool::{PageWrite, PublishScratch, Published, ReplClass};
use peercache_wire::{Layout, PageKey};

use crate::StoreError;
use crate::modes::central::writer::StorageWriter;
use crate::modes::slot::SlotIo;
use crate::node::home::PageHome;

/// Where a write goes, by mode and write policy (decided once per call).
pub(crate) enum WriteRoute<'a> {
    /// Slot mode: the slot regions.
    Slots(SlotIo<'a>),
    /// This node's pool only: p2p, a storage server, hybrid's `local` policy.
    Local,
    /// The storage servers. `also_local`: this node's pool too (hybrid `both`);
    /// `fallback_local`: this node's pool when no storage server is registered (hybrid).
    Storage {
        writer: StorageWriter<'a>,
        also_local: bool,
        fallback_local: bool,
    },
}

/// One write call's pages: their keys, their segments back to back, how many segments each
/// page has, and — for pages shorter than the bytes they were given — each valid length.
#[derive(Clone, Copy)]
pub(crate) struct Writes<'a> {
    pub(crate) keys: &'a [PageKey],
    pub(crate) slices: &'a [&'a [u8]],
    pub(crate) counts: &'a [usize],
    pub(crate) valid_lens: Option<&'a [u32]>,
}

/// The write wing's view of the node: the pool it publishes into, the directory it names the
/// pages in, and the route the mode gives a write.
pub(crate) struct WriteWing<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    pub(crate) stopping: &'a AtomicBool,
    /// The layout this node writes.
    pub(crate) layout: Layout,
    pub(crate) route: WriteRoute<'a>,
}

impl WriteWing<'_> {
    /// The write entry point every API shares (the store's and the client API's): refuses
    /// after shutdown, checks the segment counts, publishes, records the latency.
    pub(crate) fn set_pages(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        StoreError::refuse_if_stopping(self.stopping)?;
        crate::read::dest::check_counts(keys.len(), slices.len(), counts)?;
        let t0 = std::time::Instant::now();
        let r = self.write(Writes {
            keys,
            slices,
            counts,
            valid_lens: None,
        });
        self.home
            .metrics
            .write_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }

    /// Routes a write by mode and write policy: the local pool (p2p, a storage server), storage
    /// servers (centralized; hybrid `storage`), or both (hybrid `both`).
    pub(crate) fn write(&self, w: Writes<'_>) -> Vec<bool> {
        let (writer, also_local, fallback_local) = match &self.route {
            WriteRoute::Slots(slots) => return slots.set(w.keys, w.slices, w.counts),
            WriteRoute::Local => return self.write_local(w),
            WriteRoute::Storage {
                writer,
                also_local,
                fallback_local,
            } => (writer, *also_local, *fallback_local),
        };
        match writer.write(w.keys, w.slices, w.counts, w.valid_lens) {
            Some(stored) if also_local => {
                let local = self.write_local(w);
                stored.iter().zip(local).map(|(s, l)| *s || l).collect()
            }
            Some(stored) => stored,
            // No storage server registered: hybrid falls back to the local pool.
            None if fallback_local => self.write_local(w),
            None => vec![false; w.keys.len()],
        }
    }

    /// Publishes into this node's pool and names the pages in the directory; a page the
    /// directory did not take is withdrawn again.
    pub(crate) fn write_local(&self, w: Writes<'_>) -> Vec<bool> {
        let Writes {
            keys,
            slices,
            counts,
            valid_lens,
        } = w;
        let m = &self.home.metrics;
        m.write_requests.add(1);
        let mut pages = Vec::with_capacity(keys.len());
        let mut at = 0;
        let layout = self.layout;
        for (j, (k, &c)) in keys.iter().zip(counts).enumerate() {
            pages.push(PageWrite {
                key: *k,
                segments: &slices[at..at + c],
                valid_len: valid_lens.map(|v| v[j]),
                layout,
            });
            at += c;
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut evicted = Vec::new();
        self.home.pool.publish_batch(
            &pages,
            ReplClass::Retained,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        let mut results = vec![false; keys.len()];
        let mut entries: Vec<(PageKey, Location)> = Vec::new();
        let mut entry_of: Vec<usize> = Vec::new();
        let mut written = 0u64;
        for (i, p) in out.iter().enumerate() {
            match p {
                Published::New(loc) => {
                    written += loc.len as u64;
                    if let Some(d) = self.home.disk {
                        d.put(
                            keys[i],
                            pages[i].segments,
                            loc.valid_len,
                            loc.generation,
                            loc.layout,
                        );
                    }
                    entries.push((keys[i], self.home.stamp.resident(loc)));
                    entry_of.push(i);
                }
                // Resident already; in another layout only while a reader holds it (the
                // write could not replace it): not stored.
                Published::Duplicate(loc) => results[i] = loc.layout == layout,
                Published::Failed(e) => tracing::debug!(error = %e, "page not published"),
            }
        }
        m.evictions.add(evicted.len() as u64);
        if let Some(b) = self.home.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        if entries.is_empty() {
            return results;
        }
        let mut demote = Vec::new();
        let mut undo = Vec::new();
        match self.home.dir.insert(&entries) {
            Ok(outcomes) => {
                for ((j, oc), (k, loc)) in outcomes.into_iter().enumerate().zip(&entries) {
                    match oc {
                        Some(oc) => {
                            results[entry_of[j]] = true;
                            if oc.reclaimable {
                                demote.push(*k);
                            }
                        }
                        None => undo.push((*k, Some(loc.generation))),
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "directory insert failed; pages withdrawn");
                undo.extend(entries.iter().map(|(k, l)| (*k, Some(l.generation))));
            }
        }
        if !demote.is_empty() {
            self.home.pool.mark_reclaimable(&demote);
        }
        if !undo.is_empty() {
            // Not findable: withdraw, so a retry publishes again instead of being answered
            // "already stored" for a page nobody can find.
            self.home.pool.remove_batch(&undo);
        }
        m.bytes_written.add(written);
        results
    }
}

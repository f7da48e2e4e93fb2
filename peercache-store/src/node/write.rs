//! The write path on [`Core`]: pages into the local pool (and the directory), or into the
//! storage servers or slot regions the mode names.

use peercache_directory::Location;
use peercache_pool::{PageWrite, PublishScratch, Published, ReplClass};
use peercache_wire::PageKey;

use crate::StoreError;
use crate::node::core::Core;

impl Core {
    /// The write entry point every API shares (the store's and the client API's): refuses
    /// after shutdown, checks the segment counts, publishes, records the latency.
    pub(crate) fn set_pages(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        crate::read::dest::check_counts(keys.len(), slices.len(), counts)?;
        let t0 = std::time::Instant::now();
        let r = self.set_impl(keys, slices, counts);
        self.metrics
            .write_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }

    pub(crate) fn set_impl(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
    ) -> Vec<bool> {
        self.set_impl_valid(keys, slices, counts, None)
    }

    /// Routes a write by mode and write policy: the local pool (p2p), storage servers
    /// (centralized; hybrid `storage`), or both (hybrid `both`).
    pub(crate) fn set_impl_valid(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Vec<bool> {
        use crate::config::{Role, WritePolicy};
        use crate::modes::state::ModeState;
        // A storage server keeps what it is sent; otherwise the mode decides.
        let (st, also_local, fallback_local) = match &self.mode {
            ModeState::Slotmap(slots) => return self.slot_io(slots).set(keys, slices, counts),
            ModeState::P2p => return self.set_local(keys, slices, counts, valid_lens),
            _ if self.cfg.role == Role::Storage => {
                return self.set_local(keys, slices, counts, valid_lens);
            }
            // No storage server registered: centralized has no pool to fall back to.
            ModeState::Centralized(st) => (st, false, false),
            ModeState::Hybrid(st) => match st.policy {
                WritePolicy::Local => return self.set_local(keys, slices, counts, valid_lens),
                WritePolicy::Storage => (st, false, true),
                WritePolicy::Both => (st, true, true),
            },
        };
        match self
            .storage_writer(st)
            .write(keys, slices, counts, valid_lens)
        {
            Some(stored) if also_local => {
                let local = self.set_local(keys, slices, counts, valid_lens);
                stored.iter().zip(local).map(|(s, l)| *s || l).collect()
            }
            Some(stored) => stored,
            // No storage server registered: hybrid falls back to the local pool.
            None if fallback_local => self.set_local(keys, slices, counts, valid_lens),
            None => vec![false; keys.len()],
        }
    }

    pub(crate) fn set_local(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Vec<bool> {
        let inner = self;
        let m = &inner.metrics;
        m.write_requests.add(1);
        let mut pages = Vec::with_capacity(keys.len());
        let mut at = 0;
        let layout = inner.layout();
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
        inner.pool.publish_batch(
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
                    if let Some(d) = &inner.disk {
                        d.put(
                            keys[i],
                            pages[i].segments,
                            loc.valid_len,
                            loc.generation,
                            loc.layout,
                        );
                    }
                    entries.push((keys[i], inner.resident_location(loc)));
                    entry_of.push(i);
                }
                // Resident already; in another layout only while a reader holds it (the
                // write could not replace it): not stored.
                Published::Duplicate(loc) => results[i] = loc.layout == layout,
                Published::Failed(e) => tracing::debug!(error = %e, "page not published"),
            }
        }
        m.evictions.add(evicted.len() as u64);
        if let Some(b) = inner.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        if entries.is_empty() {
            return results;
        }
        let mut demote = Vec::new();
        let mut undo = Vec::new();
        match inner.dir.insert(&entries) {
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
            inner.pool.mark_reclaimable(&demote);
        }
        if !undo.is_empty() {
            // Not findable: withdraw, so a retry publishes again instead of being answered
            // "already stored" for a page nobody can find.
            inner.pool.remove_batch(&undo);
        }
        m.bytes_written.add(written);
        results
    }
}

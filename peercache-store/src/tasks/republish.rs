//! After a restart, the pages the disk tier recovered are told to the directory again (as this
//! node's disk-only copies), so the cluster finds them without anyone writing them anew.
//!
//! This runs once, on its own thread, as soon as the ring includes this node: the node is
//! ready (and serves reads) meanwhile, membership changes are not held up, and shutdown stops
//! it between batches. Each batch is one directory insert of [`BATCH`] pages, which the
//! directory client splits per shard and sends to the shards in parallel.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use peercache_directory::{CopyClass, Location, Rail};

use crate::node::core::Core;

/// Pages per directory insert: large enough that every shard gets a full request per batch,
/// small enough that the entries of one batch stay a few MiB.
pub(crate) const BATCH: usize = 64 * 1024;

/// Starts the re-publish thread if recovered pages wait and the ring includes this node.
pub(crate) fn start(core: &Arc<Core>) {
    if core.disk.is_none()
        || !*core.tasks.ring_ready.0.lock()
        || !core.tasks.republish_pending.swap(false, Ordering::AcqRel)
    {
        return;
    }
    let weak = Arc::downgrade(core);
    let spawned = std::thread::Builder::new()
        .name("pc-republish".into())
        .spawn(move || {
            if let Some(core) = weak.upgrade() {
                core.republish_recovered();
            }
        });
    match spawned {
        Ok(t) => *core.tasks.republisher.lock() = Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "could not start re-publishing; doing it inline");
            core.republish_recovered();
        }
    }
}

impl Core {
    /// Tells the directory about every page the disk tier recovered, a batch at a time, until
    /// done or the node stops.
    fn republish_recovered(&self) {
        let Some(disk) = &self.disk else { return };
        let t0 = std::time::Instant::now();
        let inventory = disk.inventory();
        let template = Location {
            node: self.me.clone(),
            incarnation: self.incarnation,
            rails: smallvec::smallvec![Rail {
                endpoint: self.data_endpoint,
                region: self.pool_key,
            }],
            addr: 0,
            len: 0,
            valid_len: 0,
            generation: 0,
            checksum: 0,
            resident: false,
            class: CopyClass::Retained,
            layout: peercache_wire::Layout::NONE,
        };
        let mut entries = Vec::with_capacity(BATCH.min(inventory.len()));
        let mut done = 0usize;
        let mut failed = 0usize;
        for chunk in inventory.chunks(BATCH) {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            entries.clear();
            entries.extend(chunk.iter().map(|&(k, len, layout)| {
                let mut loc = template.clone();
                loc.len = len;
                loc.valid_len = len;
                loc.layout = layout;
                (k, loc)
            }));
            match self.dir.insert(&entries) {
                Ok(r) => {
                    let n = r.iter().filter(|o| o.is_some()).count();
                    done += n;
                    failed += r.len() - n;
                    self.metrics.republishes.add(n as u64);
                }
                Err(e) => {
                    failed += entries.len();
                    tracing::warn!(error = %e, pages = entries.len(), "re-publishing a batch failed");
                }
            }
        }
        tracing::info!(
            pages = done,
            failed,
            secs = t0.elapsed().as_secs_f64(),
            "re-published pages recovered from the disk tier"
        );
    }

    /// Waits for the re-publish thread (it stops between batches once `stopping` is set).
    pub(crate) fn stop_republish(&self) {
        if let Some(t) = self.tasks.republisher.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

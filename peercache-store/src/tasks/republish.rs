//! After a restart, the pages the disk tier recovered are told to the directory again (as this
//! node's disk-only copies), so the cluster finds them without anyone writing them anew.
//!
//! This runs once, on its own thread, as soon as the ring includes this node and the disk
//! tier's recovery scan (on a thread of its own) has found what is on disk: the node is
//! ready (and serves reads) meanwhile, membership changes are not held up, and shutdown stops
//! it between batches. Each batch is one directory insert of [`BATCH`] pages, which the
//! directory client splits per shard and sends to the shards in parallel.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::node::home::PageHome;

/// Re-publishing, with what it needs of its node (`Core::republish`).
pub(crate) struct Republish<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    /// Set once the node stops: the run ends between batches.
    pub(crate) stopping: &'a AtomicBool,
}

/// Pages per directory insert: large enough that every shard gets a full request per batch,
/// small enough that the entries of one batch stay a few MiB.
pub(crate) const BATCH: usize = 64 * 1024;

impl Republish<'_> {
    /// Tells the directory about every page the disk tier recovered, a batch at a time, until
    /// done or the node stops.
    pub(crate) fn recovered(&self) {
        let Some(disk) = self.home.disk else { return };
        let t0 = std::time::Instant::now();
        // The scan runs on the disk tier's own thread; shutdown ends the wait.
        while !disk.wait_recovered(std::time::Duration::from_millis(100)) {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
        }
        let inventory = disk.inventory();
        let template = self.home.stamp.on_disk();
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
            match self.home.dir.insert(&entries) {
                Ok(r) => {
                    let n = r.iter().filter(|o| o.is_some()).count();
                    done += n;
                    failed += r.len() - n;
                    self.home.metrics.republishes.add(n as u64);
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
    pub(crate) fn stop(&self) {
        if let Some(t) = self.home.tasks.republisher.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

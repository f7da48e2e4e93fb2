//! Eviction notices, off the write path: the pool hands evicted pages to a channel per
//! publish batch; one background thread coalesces them and tells the directory in batches
//! (owner-conditional by generation, so a late notice never removes a newer publish).

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::time::Duration;

use peercache_directory::{DirectoryClient, OwnerRef};
use peercache_pool::Evicted;
use peercache_wire::NodeId;
use peercache_wire::tally::Tally;

enum Msg {
    Evicted(Vec<Evicted>),
    /// Directory entries to insert off the caller's thread (pages promoted for a peer).
    Publish(Vec<(peercache_wire::PageKey, peercache_directory::Location)>),
    Flush(mpsc::Sender<()>),
}

/// Counters of the batcher (pages, not batches).
pub(crate) struct EvictCounters {
    pub(crate) queued: Tally,
    pub(crate) notified: Tally,
    pub(crate) failed: Tally,
}

impl EvictCounters {
    fn register(node: &NodeId) -> Self {
        let t = |name: &'static str| {
            Tally::new(metrics::counter!(name, "node" => node.as_str().to_string()))
        };
        EvictCounters {
            queued: t(crate::observe::series::EVICTION_NOTICES_QUEUED),
            notified: t(crate::observe::series::EVICTION_NOTICES),
            failed: t(crate::observe::series::EVICTION_NOTICES_FAILED),
        }
    }
}

/// The batcher's handle; dropping it flushes and stops the thread.
pub(crate) struct EvictionBatcher {
    tx: Option<SyncSender<Msg>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(crate) counters: Arc<EvictCounters>,
}

const MAX_BATCH: usize = 8192;
const LINGER: Duration = Duration::from_millis(20);

impl EvictionBatcher {
    /// With a disk tier, pages it holds are marked disk-only instead of removed.
    pub(crate) fn start(
        me: NodeId,
        dir: Arc<DirectoryClient>,
        disk: Option<Arc<peercache_pool::disk::DiskTier>>,
        queue_depth: usize,
    ) -> Self {
        // Bounded: a writer that outruns the notices waits for the batcher (no notice is lost).
        let (tx, rx) = mpsc::sync_channel::<Msg>(queue_depth.max(1));
        let counters = Arc::new(EvictCounters::register(&me));
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("pc-evict".into())
            .spawn(move || {
                let mut pending: Vec<OwnerRef> = Vec::new();
                let send = |pending: &mut Vec<OwnerRef>| {
                    if pending.is_empty() {
                        return;
                    }
                    let (on_disk, gone): (Vec<OwnerRef>, Vec<OwnerRef>) = pending
                        .drain(..)
                        .partition(|r| disk.as_ref().is_some_and(|d| d.holds_or_pending(r.key)));
                    let n = on_disk.len() + gone.len();
                    let res = match (on_disk.is_empty(), gone.is_empty()) {
                        (true, _) => dir.remove(&gone),
                        (false, true) => dir.mark_nonresident(&on_disk),
                        (false, false) => dir.mark_nonresident(&on_disk).and_then(|_| dir.remove(&gone)),
                    };
                    pending.clear();
                    match res {
                        Ok(_) => {
                            c.notified.add(n as u64);
                        }
                        Err(e) => {
                            c.failed.add(n as u64);
                            tracing::warn!(error = %e, pages = n, "eviction notices not delivered; entries will fail verification and expire");
                        }
                    }
                };
                loop {
                    let msg = if pending.is_empty() { rx.recv().map_err(|_| RecvTimeoutError::Disconnected) } else { rx.recv_timeout(LINGER) };
                    match msg {
                        Ok(Msg::Evicted(v)) => {
                            pending.extend(v.into_iter().map(|e| OwnerRef {
                                key: e.key,
                                node: me.clone(),
                                generation: Some(e.generation),
                            }));
                            if pending.len() >= MAX_BATCH {
                                send(&mut pending);
                            }
                        }
                        Ok(Msg::Publish(entries)) => {
                            send(&mut pending);
                            if let Err(e) = dir.insert(&entries) {
                                tracing::warn!(error = %e, pages = entries.len(), "promoted pages not re-published");
                            }
                        }
                        Ok(Msg::Flush(done)) => {
                            // Drain whatever is already queued, then answer.
                            while let Ok(m) = rx.try_recv() {
                                match m {
                                    Msg::Evicted(v) => pending.extend(v.into_iter().map(|e| OwnerRef {
                                        key: e.key,
                                        node: me.clone(),
                                        generation: Some(e.generation),
                                    })),
                                    Msg::Publish(entries) => {
                                        let _ = dir.insert(&entries);
                                    }
                                    Msg::Flush(d) => {
                                        let _ = d.send(());
                                    }
                                }
                            }
                            send(&mut pending);
                            let _ = done.send(());
                        }
                        Err(RecvTimeoutError::Timeout) => send(&mut pending),
                        Err(RecvTimeoutError::Disconnected) => {
                            send(&mut pending);
                            return;
                        }
                    }
                }
            })
            .expect("spawning the eviction thread");
        EvictionBatcher {
            tx: Some(tx),
            thread: Some(thread),
            counters,
        }
    }

    /// Queues evicted pages (one channel send per publish batch).
    pub(crate) fn push(&self, evicted: Vec<Evicted>) {
        if evicted.is_empty() {
            return;
        }
        self.counters.queued.add(evicted.len() as u64);
        if let Some(tx) = &self.tx {
            let _ = tx.send(Msg::Evicted(evicted));
        }
    }

    /// Queues directory inserts to run on the batcher's thread.
    pub(crate) fn publish(
        &self,
        entries: Vec<(peercache_wire::PageKey, peercache_directory::Location)>,
    ) {
        if let (Some(tx), false) = (&self.tx, entries.is_empty()) {
            let _ = tx.send(Msg::Publish(entries));
        }
    }

    /// Waits until every queued notice has been sent (or `timeout` passes).
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let (done_tx, done_rx) = mpsc::channel();
        match &self.tx {
            Some(tx) if tx.send(Msg::Flush(done_tx)).is_ok() => {
                done_rx.recv_timeout(timeout).is_ok()
            }
            _ => false,
        }
    }

    /// Flushes and stops.
    pub(crate) fn stop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EvictionBatcher {
    fn drop(&mut self) {
        self.stop();
    }
}

//! The node's background threads, each holding the node weakly and ending with it: the
//! promoter's worker (disk-tier promotions an `exists` asked for), the membership thread
//! (`pc-membership`) and the re-publish thread (`pc-republish`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::StoreError;
use crate::node::core::Core;
use crate::tasks::promoter::{Job, Promoter};

/// Starts the promoter: its worker promotes this node's share of a job here and asks the other
/// owners for theirs.
pub(crate) fn start_promoter(core: &Arc<Core>) -> Result<(), StoreError> {
    let _ = core.tasks.promoter.set(Promoter::start({
        let node = Arc::downgrade(core);
        move |job: Job| {
            let Some(inner) = node.upgrade() else {
                return false;
            };
            let (mine, theirs): (Job, Job) = job.into_iter().partition(|(n, _)| *n == inner.id.me);
            for (_, keys) in mine {
                inner.promotion().promote_here(&keys, true);
            }
            if !theirs.is_empty() {
                inner.promotion().ask_promote(&theirs);
            }
            true
        }
    })?);
    Ok(())
}

/// Starts the membership thread (`pc-membership`): on each membership event, or a heartbeat
/// without one, it refreshes the pool and disk gauges, reaps expired reservations and due
/// directory entries, forgets strangers, and — on an event, or while the ring lacks this node —
/// re-syncs the ring and starts re-publishing recovered pages. It holds the node weakly and
/// ends with it.
pub(crate) fn spawn_membership(core: &Arc<Core>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let weak = Arc::downgrade(core);
    let events = core.discovery.subscribe();
    let heartbeat = Duration::from_secs_f64(core.cfg.heartbeat_interval);
    std::thread::Builder::new()
        .name("pc-membership".into())
        .spawn(move || {
            loop {
                let got = events.recv_timeout(heartbeat);
                let Some(core) = weak.upgrade() else { return };
                if core.stopping.load(Ordering::Acquire) {
                    return;
                }
                let ps = core.pool.stats();
                let ds = core.disk.as_ref().map(|d| d.stats());
                core.metrics
                    .refresh(ps.retained + ps.reclaimable, ds.as_ref());
                let sync = core.membership_sync();
                sync.reap_reservations();
                core.dir.drop_due();
                sync.forget_strangers();
                if got.is_err() && *core.tasks.ring_ready.0.lock() {
                    continue;
                }
                // Coalesce a burst of events into one ring change.
                while events.try_recv().is_ok() {}
                sync.sync();
                start_republish(&core);
            }
        })
}

/// Starts the re-publish thread if recovered pages wait and the ring includes this node.
pub(crate) fn start_republish(core: &Arc<Core>) {
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
                core.republish().recovered();
            }
        });
    match spawned {
        Ok(t) => *core.tasks.republisher.lock() = Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "could not start re-publishing; doing it inline");
            core.republish().recovered();
        }
    }
}

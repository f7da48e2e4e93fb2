//! Background promotion: `batch_exists` finds pages whose only copies are on a disk tier and
//! hands them here, so the `batch_get` that usually follows finds them in memory. Bounded: a
//! short queue, and a full queue drops the request (the get promotes synchronously instead).

use std::sync::mpsc::{self, SyncSender, TrySendError};

use parking_lot::Mutex;
use peercache_wire::{NodeId, PageKey};

/// Requests queued at most; more are dropped (and counted by the caller's metrics).
const QUEUE: usize = 8;
/// Keys in one queued request at most.
pub(crate) const MAX_KEYS: usize = 4096;

/// Pages to promote, grouped by the node that holds them on disk.
pub(crate) type Job = Vec<(NodeId, Vec<PageKey>)>;

/// The promoter's handle; dropping the sender stops the thread.
pub(crate) struct Promoter {
    tx: Mutex<Option<SyncSender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Promoter {
    /// Starts the thread, which hands each job to `run` (the node's promotion, holding only a
    /// weak reference to it); it stops when `run` returns false (the node is gone) or the
    /// promoter is stopped.
    pub(crate) fn start(run: impl Fn(Job) -> bool + Send + 'static) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("pc-promote".into())
            .spawn(move || {
                for job in rx {
                    if !run(job) {
                        return;
                    }
                }
            })?;
        Ok(Promoter {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a promotion; false when the queue is full or stopped (nothing is waited for).
    pub(crate) fn offer(&self, job: Job) -> bool {
        match self.tx.lock().as_ref().map(|tx| tx.try_send(job)) {
            Some(Ok(())) => true,
            Some(Err(TrySendError::Full(_) | TrySendError::Disconnected(_))) | None => false,
        }
    }

    /// Stops the thread after the queued jobs.
    pub(crate) fn stop(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

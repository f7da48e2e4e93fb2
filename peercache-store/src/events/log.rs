//! The numbered log of published batches: each batch gets the next sequence number (from 1)
//! and is framed once for every subscriber; the newest are kept, bounded in count and bytes,
//! for replay; the shard's whole state can be read as of a sequence number.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use peercache_directory::{Change, ChangeKind, DirectoryService};
use peercache_wire::NodeId;

use super::batch::{self, Encoded};
use super::zmtp;

/// Batches kept for replay, at most.
const REPLAY_BATCHES: usize = 10_000;
/// Bytes of batches kept for replay, at most (payloads and their framed copies).
const REPLAY_BYTES: usize = 64 << 20;
/// Entry slots of the shard read under one hold of its lock while a state is sent.
const STATE_CHUNK: u32 = 16_384;
/// Batches a subscriber may fall behind before it misses some.
const SUBSCRIBER_QUEUE: usize = 1024;

/// One published batch.
#[derive(Debug)]
pub(crate) struct Published {
    pub(crate) seq: u64,
    /// The topic: the node whose copies the batch reports.
    pub(crate) topic: NodeId,
    pub(crate) payload: Vec<u8>,
    /// The `PUB` message (topic, 8-byte sequence number, payload) as ZMTP frames.
    pub(crate) framed: Vec<u8>,
}

impl Published {
    /// Bytes this batch keeps in memory: its payload and its framed copy.
    fn held(&self) -> usize {
        self.payload.len() + self.framed.len()
    }
}

struct Inner {
    seq: u64,
    ring: VecDeque<Arc<Published>>,
    bytes: usize,
}

/// A node's published batches.
pub(crate) struct EventLog {
    node: NodeId,
    block_size: u64,
    inner: Mutex<Inner>,
    tx: tokio::sync::broadcast::Sender<Arc<Published>>,
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventLog {
    pub(crate) fn new(node: NodeId, block_size: u64) -> EventLog {
        EventLog {
            node,
            block_size,
            inner: Mutex::new(Inner {
                seq: 0,
                ring: VecDeque::new(),
                bytes: 0,
            }),
            tx: tokio::sync::broadcast::channel(SUBSCRIBER_QUEUE).0,
        }
    }

    /// A new subscriber's queue: every batch published from now on.
    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Published>> {
        self.tx.subscribe()
    }

    /// Publishes `changes`; returns the batches sent.
    pub(crate) fn publish_changes(&self, changes: &[Change]) -> u64 {
        let batches = batch::encode(changes, self.block_size, now_s());
        let n = batches.len() as u64;
        for b in batches {
            self.push(b.holder, b.payload);
        }
        n
    }

    /// Tells every subscriber to forget what it was told (`AllBlocksCleared`) and publishes
    /// the shard's whole state; returns the batches sent.
    pub(crate) fn publish_state(&self, dir: &DirectoryService) -> u64 {
        let cleared = self.cleared();
        self.push(cleared.holder, cleared.payload);
        let mut n = 1;
        let mut from = Some(0);
        while let Some(f) = from {
            let (batches, next) = self.state_chunk(dir, f);
            n += batches.len() as u64;
            for b in batches {
                self.push(b.holder, b.payload);
            }
            from = next;
        }
        n
    }

    fn push(&self, topic: NodeId, payload: Vec<u8>) {
        let mut inner = self.inner.lock();
        inner.seq += 1;
        let seq = inner.seq;
        let mut framed = Vec::with_capacity(payload.len() + topic.as_str().len() + 32);
        zmtp::put_message(
            &mut framed,
            &[topic.as_str().as_bytes(), &seq.to_be_bytes(), &payload],
        );
        let p = Arc::new(Published {
            seq,
            topic,
            payload,
            framed,
        });
        inner.bytes += p.held();
        inner.ring.push_back(p.clone());
        while inner.ring.len() > REPLAY_BATCHES || inner.bytes > REPLAY_BYTES {
            match inner.ring.pop_front() {
                Some(old) => inner.bytes -= old.held(),
                None => break,
            }
        }
        // Sent under the lock, so subscribers see batches in sequence order. No receiver is
        // not an error.
        let _ = self.tx.send(p);
    }

    /// The batches numbered `start` and later, if the log still holds all of them.
    pub(crate) fn since(&self, start: u64) -> Option<Vec<Arc<Published>>> {
        let inner = self.inner.lock();
        let first = inner.ring.front().map_or(inner.seq + 1, |p| p.seq);
        if start < first || start > inner.seq + 1 {
            return None;
        }
        Some(
            inner
                .ring
                .iter()
                .filter(|p| p.seq >= start)
                .cloned()
                .collect(),
        )
    }

    /// The sequence number a state read from now on is current as of: every batch numbered up
    /// to it was applied to the shard before it was published, so the state includes it; later
    /// batches may repeat part of the state (a `BlockStored` told twice changes nothing).
    pub(crate) fn as_of(&self) -> u64 {
        self.inner.lock().seq
    }

    /// The batch that leads a state: forget what this node told you before.
    pub(crate) fn cleared(&self) -> Encoded {
        Encoded {
            holder: self.node.clone(),
            payload: batch::all_cleared(now_s()),
        }
    }

    /// The state's copies in [`STATE_CHUNK`] entry slots from slot `from` on, as batches, and
    /// the slot to go on from (`None` at the end). The shard's lock is held for one chunk.
    pub(crate) fn state_chunk(
        &self,
        dir: &DirectoryService,
        from: u32,
    ) -> (Vec<Encoded>, Option<u32>) {
        let mut copies = Vec::new();
        let next = dir.with_shard(|sh, _| {
            sh.for_each_copy_in(from, STATE_CHUNK, |key, node, resident| {
                copies.push(Change {
                    key,
                    node: node.clone(),
                    resident,
                    kind: ChangeKind::Stored,
                })
            })
        });
        (batch::encode(&copies, self.block_size, now_s()), next)
    }
}

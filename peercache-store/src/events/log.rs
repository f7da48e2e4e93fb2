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
/// Bytes of batches kept for replay, at most.
const REPLAY_BYTES: usize = 64 << 20;
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
        self.push(self.node.clone(), batch::all_cleared(now_s()));
        let state = self.state_batches(dir);
        let n = 1 + state.len() as u64;
        for b in state {
            self.push(b.holder, b.payload);
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
        inner.bytes += p.payload.len();
        inner.ring.push_back(p.clone());
        while inner.ring.len() > REPLAY_BATCHES || inner.bytes > REPLAY_BYTES {
            match inner.ring.pop_front() {
                Some(old) => inner.bytes -= old.payload.len(),
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

    /// The shard's whole state as batches, led by an `AllBlocksCleared` (forget what this
    /// node told you before), and the sequence number it is current as of: every batch
    /// numbered up to it is reflected, later ones may repeat part of it (a `BlockStored` told
    /// twice changes nothing).
    pub(crate) fn state(&self, dir: &DirectoryService) -> (u64, Vec<Encoded>) {
        // The number first: whatever it covers was applied to the shard before it was
        // published, so the state read after it includes it.
        let as_of = self.inner.lock().seq;
        let mut batches = vec![Encoded {
            holder: self.node.clone(),
            payload: batch::all_cleared(now_s()),
        }];
        batches.extend(self.state_batches(dir));
        (as_of, batches)
    }

    fn state_batches(&self, dir: &DirectoryService) -> Vec<Encoded> {
        let mut copies = Vec::new();
        dir.with_shard(|sh, _| {
            sh.for_each_copy(|key, node, resident| {
                copies.push(Change {
                    key,
                    node: node.clone(),
                    resident,
                    kind: ChangeKind::Stored,
                })
            })
        });
        batch::encode(&copies, self.block_size, now_s())
    }
}

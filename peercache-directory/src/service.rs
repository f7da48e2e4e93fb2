//! The serving side: a shard behind a lock, answering [`DirRequest`]s.
//!
//! [`DirectoryService::handle`] plugs into any `peercache-wire` RPC server; the store routes
//! directory kinds to it from its one control listener.

use std::time::Instant;

use parking_lot::Mutex;
use peercache_wire::envelope::{self, Envelope, Message};
use peercache_wire::rpc::{Reply, RpcError};

use crate::msg::{DirReply, DirRequest};
use crate::shard::{Millis, Shard, ShardConfig};

/// One node's shard, served.
#[derive(Debug)]
pub struct DirectoryService {
    shard: Mutex<Shard>,
    entries: metrics::Gauge,
    malformed: metrics::Counter,
    epoch: Instant,
    /// Largest number of items accepted in one request.
    pub max_items: usize,
}

impl DirectoryService {
    /// A service over an empty shard.
    pub fn new(cfg: ShardConfig) -> Self {
        DirectoryService {
            shard: Mutex::new(Shard::new(cfg)),
            entries: metrics::gauge!(crate::metrics::SHARD_ENTRIES),
            malformed: metrics::counter!(crate::metrics::MALFORMED_TOTAL),
            epoch: Instant::now(),
            max_items: 1 << 20,
        }
    }

    /// Milliseconds since start (the shard's clock).
    pub fn now(&self) -> Millis {
        self.epoch.elapsed().as_millis() as Millis
    }

    /// Runs `f` with the shard locked.
    pub fn with_shard<R>(&self, f: impl FnOnce(&mut Shard, Millis) -> R) -> R {
        let now = self.now();
        f(&mut self.shard.lock(), now)
    }

    /// Applies a request (local callers skip the wire).
    pub fn apply(&self, req: &DirRequest<'_>) -> DirReply {
        let now = self.now();
        let mut sh = self.shard.lock();
        let reply = match req {
            DirRequest::Insert(entries) => DirReply::Inserted(
                entries
                    .iter()
                    .map(|(k, loc)| sh.insert(*k, loc.clone(), now))
                    .collect(),
            ),
            DirRequest::Lookup(keys) => {
                DirReply::Found(keys.iter().map(|k| sh.lookup(*k, now)).collect())
            }
            DirRequest::Exists(keys) => {
                DirReply::Exists(keys.iter().map(|k| sh.exists(*k, now)).collect())
            }
            DirRequest::Remove(items) => DirReply::Applied(
                items
                    .iter()
                    .filter(|r| sh.remove(r.key, &r.node, r.generation))
                    .count() as u32,
            ),
            DirRequest::MarkNonResident(items) => DirReply::Applied(
                items
                    .iter()
                    .filter(|r| sh.mark_nonresident(r.key, &r.node, r.generation))
                    .count() as u32,
            ),
            DirRequest::Handoff(entries) => {
                for (k, owners) in entries.iter() {
                    sh.merge(*k, owners, now);
                }
                DirReply::Applied(entries.len() as u32)
            }
        };
        self.entries.set(sh.len() as f64);
        reply
    }

    fn items(req: &DirRequest<'_>) -> usize {
        match req {
            DirRequest::Insert(v) => v.len(),
            DirRequest::Lookup(v) | DirRequest::Exists(v) => v.len(),
            DirRequest::Remove(v) | DirRequest::MarkNonResident(v) => v.len(),
            DirRequest::Handoff(v) => v.len(),
        }
    }

    /// Handles a directory envelope; `None` if the kind is not a directory request.
    pub fn handle(&self, env: Envelope<'_>) -> Option<Reply> {
        if env.kind != DirRequest::KIND {
            return None;
        }
        let req: DirRequest<'static> = match env.decode() {
            Ok(r) => r,
            Err(e) => {
                self.malformed.increment(1);
                return Some(Reply::Error {
                    error: RpcError {
                        code: RpcError::CODE_MALFORMED,
                        message: e.to_string(),
                    },
                    close: true,
                });
            }
        };
        if Self::items(&req) > self.max_items {
            return Some(Reply::Error {
                error: RpcError {
                    code: RpcError::CODE_REFUSED,
                    message: format!("more than {} items in one request", self.max_items),
                },
                close: false,
            });
        }
        let reply = self.apply(&req);
        Some(match envelope::encode(&reply, &[]) {
            Ok(f) => Reply::Frame(f),
            Err(e) => Reply::Error {
                error: RpcError {
                    code: RpcError::CODE_REFUSED,
                    message: e.to_string(),
                },
                close: false,
            },
        })
    }
}

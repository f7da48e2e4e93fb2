//! The discovery server's state, without I/O: soft-state registrations that expire after a
//! TTL without a heartbeat.

use std::collections::HashMap;

use peercache_wire::NodeId;

use crate::info::NodeInfo;
use crate::msg::{DiscReply, DiscRequest};

/// Milliseconds on the caller's clock.
pub type Millis = u64;

struct Entry {
    info: NodeInfo,
    expires: Millis,
}

/// One discovery server's membership table.
pub struct ServerCore {
    ttl: Millis,
    members: HashMap<NodeId, Entry>,
    version: u64,
}

impl std::fmt::Debug for ServerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCore")
            .field("members", &self.members.len())
            .field("version", &self.version)
            .finish()
    }
}

impl ServerCore {
    /// A table whose entries live `ttl_ms` past their last heartbeat.
    pub fn new(ttl_ms: Millis) -> Self {
        ServerCore {
            ttl: ttl_ms,
            members: HashMap::new(),
            version: 1,
        }
    }

    /// Membership version (changes whenever the member set or an announcement changes).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Drops expired registrations.
    pub fn prune(&mut self, now: Millis) -> Vec<NodeId> {
        let gone: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, e)| e.expires <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for g in &gone {
            self.members.remove(g);
        }
        if !gone.is_empty() {
            self.version += 1;
        }
        gone
    }

    /// The live members, sorted by id.
    pub fn members(&mut self, now: Millis) -> Vec<NodeInfo> {
        self.prune(now);
        let mut v: Vec<NodeInfo> = self.members.values().map(|e| e.info.clone()).collect();
        v.sort_by(|a, b| a.node.cmp(&b.node));
        v
    }

    /// Answers one request.
    pub fn handle(&mut self, req: DiscRequest, now: Millis) -> DiscReply {
        self.prune(now);
        match req {
            DiscRequest::Register(info) => {
                let expires = now + self.ttl;
                let changed = self.members.get(&info.node).is_none_or(|e| e.info != info);
                if changed {
                    if let Some(old) = self.members.get(&info.node)
                        && old.info.incarnation != info.incarnation
                    {
                        tracing::info!(node = %info.node, "member restarted with a new incarnation");
                    }
                    self.version += 1;
                }
                self.members
                    .insert(info.node.clone(), Entry { info, expires });
                DiscReply::Members {
                    version: self.version,
                    members: self.members(now),
                }
            }
            DiscRequest::Heartbeat {
                node,
                incarnation,
                known_version,
            } => {
                let known = match self.members.get_mut(&node) {
                    Some(e) if e.info.incarnation == incarnation => {
                        e.expires = now + self.ttl;
                        true
                    }
                    _ => false,
                };
                let members = (known_version != self.version).then(|| self.members(now));
                DiscReply::Heartbeat {
                    known,
                    version: self.version,
                    members,
                }
            }
            DiscRequest::Deregister { node, incarnation } => {
                if self
                    .members
                    .get(&node)
                    .is_some_and(|e| e.info.incarnation == incarnation)
                {
                    self.members.remove(&node);
                    self.version += 1;
                }
                DiscReply::Ok
            }
            DiscRequest::Members => DiscReply::Members {
                version: self.version,
                members: self.members(now),
            },
        }
    }
}

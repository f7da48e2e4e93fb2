//! The discovery server's state, without I/O: soft-state registrations that expire after a
//! TTL without a heartbeat, admitted by [`crate::admission`].

use std::collections::{HashMap, HashSet, VecDeque};

use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};

use crate::admission::{self, Limits, Refusal};
use crate::info::NodeInfo;
use crate::msg::{DiscReply, DiscRequest};

/// Milliseconds on the caller's clock.
pub type Millis = u64;

struct Entry {
    info: NodeInfo,
    expires: Millis,
    /// Encoded size of `info`.
    bytes: usize,
}

/// One discovery server's membership table.
pub struct ServerCore {
    ttl: Millis,
    members: HashMap<NodeId, Entry>,
    version: u64,
    limits: Limits,
    /// Encoded size of every announcement held.
    table_bytes: usize,
    /// Members pruned for a missed heartbeat, by incarnation: one that registers again in the
    /// same life is logged as a re-registration (bounded by [`Limits::max_members`]).
    lapsed: HashMap<NodeId, Incarnation>,
    /// Who changed at each version, oldest first, for [`DiscReply::Changes`]; complete for every
    /// version above `log_floor`, at most [`CHANGE_LOG`] entries.
    changes: VecDeque<(u64, NodeId)>,
    log_floor: u64,
    /// Registrations that changed a live member's entry within one life (see
    /// [`ServerCore::live_changes`]).
    live_changes: u64,
}

/// Changes a server remembers for delta heartbeats: a member further behind gets the table.
pub const CHANGE_LOG: usize = 8192;

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
        Self::with_limits(ttl_ms, Limits::default())
    }

    /// A table with explicit bounds.
    pub fn with_limits(ttl_ms: Millis, limits: Limits) -> Self {
        ServerCore {
            ttl: ttl_ms,
            members: HashMap::new(),
            version: 1,
            limits,
            table_bytes: 0,
            lapsed: HashMap::new(),
            changes: VecDeque::new(),
            log_floor: 1,
            live_changes: 0,
        }
    }

    /// Encoded bytes of every announcement held (bounded by [`Limits::max_table_bytes`]).
    pub fn table_bytes(&self) -> usize {
        self.table_bytes
    }

    /// Membership version (changes whenever the member set or an announcement changes).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Extends the registration of `node`'s life `incarnation`; false if this table lacks it.
    fn refresh(&mut self, node: &NodeId, incarnation: Incarnation, now: Millis) -> bool {
        match self.members.get_mut(node) {
            Some(e) if e.info.incarnation == incarnation => {
                e.expires = now + self.ttl;
                true
            }
            _ => false,
        }
    }

    /// Bumps the version for a change of `ids`.
    fn changed(&mut self, ids: impl IntoIterator<Item = NodeId>) {
        self.version += 1;
        for id in ids {
            self.changes.push_back((self.version, id));
        }
        while self.changes.len() > CHANGE_LOG {
            if let Some((v, _)) = self.changes.pop_front() {
                self.log_floor = v;
            }
        }
    }

    /// The changes since `since`, if the log covers them.
    fn changes_since(&self, since: u64) -> Option<(Vec<NodeInfo>, Vec<NodeId>)> {
        if since < self.log_floor || since > self.version {
            return None;
        }
        let ids: HashSet<&NodeId> = self
            .changes
            .iter()
            .rev()
            .take_while(|(v, _)| *v > since)
            .map(|(_, id)| id)
            .collect();
        let mut upserted = Vec::new();
        let mut removed = Vec::new();
        for id in ids {
            match self.members.get(id) {
                Some(e) => upserted.push(e.info.clone()),
                None => removed.push(id.clone()),
            }
        }
        upserted.sort_by(|a, b| a.node.cmp(&b.node));
        removed.sort();
        Some((upserted, removed))
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
            if let Some(e) = self.members.remove(g) {
                self.table_bytes -= e.bytes;
                if self.lapsed.len() >= self.limits.max_members {
                    self.lapsed.clear();
                }
                self.lapsed.insert(g.clone(), e.info.incarnation);
                tracing::info!(
                    node = %g,
                    members = self.members.len(),
                    "member pruned: no heartbeat within the member TTL"
                );
            }
        }
        if !gone.is_empty() {
            self.changed(gone.clone());
        }
        gone
    }

    /// Registrations that changed a live member's entry without a new incarnation since this
    /// table started: each is a registration in another's name or the member's repair of one.
    pub fn live_changes(&self) -> u64 {
        self.live_changes
    }

    /// The live members, sorted by id.
    pub fn members(&mut self, now: Millis) -> Vec<NodeInfo> {
        self.prune(now);
        let mut v: Vec<NodeInfo> = self.members.values().map(|e| e.info.clone()).collect();
        v.sort_by(|a, b| a.node.cmp(&b.node));
        v
    }

    /// Admits `info` into the table: within bounds, and with room for it.
    fn admit(&self, info: &NodeInfo) -> Result<usize, Refusal> {
        let bytes = admission::check_info(info, &self.limits)?;
        let replaced = self.members.get(&info.node).map_or(0, |e| e.bytes);
        if replaced == 0 && self.members.len() >= self.limits.max_members {
            return Err(Refusal::TooManyMembers {
                max: self.limits.max_members,
            });
        }
        if self.table_bytes - replaced + bytes > self.limits.max_table_bytes {
            return Err(Refusal::TableFull {
                max: self.limits.max_table_bytes,
            });
        }
        Ok(bytes)
    }

    /// Turns the source check of registrations on or off ([`Limits::check_sources`]).
    pub fn set_check_sources(&mut self, on: bool) {
        self.limits.check_sources = on;
    }

    /// Answers one request from `from` (the connection's handshake identity): a member may
    /// register, heartbeat and deregister only as itself, within the table's bounds.
    pub fn handle(
        &mut self,
        from: &Peer,
        req: DiscRequest,
        now: Millis,
    ) -> Result<DiscReply, Refusal> {
        admission::check_identity(from, &req)?;
        self.prune(now);
        Ok(match req {
            DiscRequest::Register(info) => {
                if self.limits.check_sources {
                    admission::check_sources(from, &info, &admission::local_address)?;
                }
                let bytes = self.admit(&info)?;
                let expires = now + self.ttl;
                let changed = self.members.get(&info.node).is_none_or(|e| e.info != info);
                let held = self.members.len() + usize::from(!self.members.contains_key(&info.node));
                match self.members.get(&info.node) {
                    Some(old) if old.info.incarnation != info.incarnation => {
                        tracing::info!(node = %info.node, members = held, "member restarted with a new incarnation")
                    }
                    Some(old) if old.info != info => {
                        // One life announces one entry: a change is a registration in its name
                        // (or a member repairing one). Taken — the member's own registration
                        // must win — but counted; the service logs it.
                        self.live_changes += 1;
                        tracing::debug!(node = %info.node, from = %from.label(), "a live member's entry changed")
                    }
                    Some(_) => {
                        tracing::info!(node = %info.node, members = held, "member re-registered")
                    }
                    None if self.lapsed.remove(&info.node) == Some(info.incarnation) => {
                        tracing::info!(
                            node = %info.node,
                            members = held,
                            "member re-registered after its registration lapsed"
                        )
                    }
                    None => tracing::info!(node = %info.node, members = held, "member registered"),
                }
                if changed {
                    self.changed([info.node.clone()]);
                }
                self.table_bytes += bytes;
                if let Some(old) = self.members.insert(
                    info.node.clone(),
                    Entry {
                        info,
                        expires,
                        bytes,
                    },
                ) {
                    self.table_bytes -= old.bytes;
                }
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
                let known = self.refresh(&node, incarnation, now);
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
                    && let Some(e) = self.members.remove(&node)
                {
                    self.table_bytes -= e.bytes;
                    self.changed([node.clone()]);
                    tracing::info!(node = %node, members = self.members.len(), "member deregistered");
                }
                DiscReply::Ok
            }
            DiscRequest::Sync {
                node,
                incarnation,
                known_version,
            } => {
                let known = self.refresh(&node, incarnation, now);
                if known_version == self.version {
                    DiscReply::Heartbeat {
                        known,
                        version: self.version,
                        members: None,
                    }
                } else if let Some((upserted, removed)) = self.changes_since(known_version) {
                    DiscReply::Changes {
                        known,
                        since: known_version,
                        version: self.version,
                        upserted,
                        removed,
                    }
                } else {
                    DiscReply::Heartbeat {
                        known,
                        version: self.version,
                        members: Some(self.members(now)),
                    }
                }
            }
            DiscRequest::Members => DiscReply::Members {
                version: self.version,
                members: self.members(now),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peercache_wire::{Incarnation, NodeId};

    fn info(n: usize, attr_bytes: usize) -> NodeInfo {
        NodeInfo {
            node: NodeId::new(format!("node-{n}")).unwrap(),
            incarnation: Incarnation(1),
            host: "127.0.0.1".parse().unwrap(),
            meta: None,
            control: "127.0.0.1:1".parse().unwrap(),
            data: vec![],
            role: "inference".into(),
            attrs: vec![("a".into(), "x".repeat(attr_bytes))],
        }
    }

    fn peer(i: &NodeInfo) -> Peer {
        Peer {
            node: Some(i.node.clone()),
            incarnation: i.incarnation,
            addr: std::net::SocketAddr::new(i.host, 9),
            authenticated: true,
            grant: peercache_wire::auth::Grant::Full,
            verified: false,
        }
    }

    fn sync(i: &NodeInfo, known_version: u64) -> DiscRequest {
        DiscRequest::Sync {
            node: i.node.clone(),
            incarnation: i.incarnation,
            known_version,
        }
    }

    #[test]
    fn a_sync_gets_only_what_changed_and_a_member_too_far_behind_gets_the_table() {
        let mut s = ServerCore::new(10_000);
        let (a, b, c) = (info(1, 1), info(2, 1), info(3, 1));
        for i in [&a, &b] {
            s.handle(&peer(i), DiscRequest::Register(i.clone()), 0)
                .unwrap();
        }
        let v = s.version();
        // Up to date: no members at all.
        match s.handle(&peer(&a), sync(&a, v), 1).unwrap() {
            DiscReply::Heartbeat {
                known: true,
                members: None,
                ..
            } => {}
            other => panic!("{other:?}"),
        }
        // c joins, b leaves: a learns exactly that.
        s.handle(&peer(&c), DiscRequest::Register(c.clone()), 2)
            .unwrap();
        s.handle(
            &peer(&b),
            DiscRequest::Deregister {
                node: b.node.clone(),
                incarnation: b.incarnation,
            },
            3,
        )
        .unwrap();
        match s.handle(&peer(&a), sync(&a, v), 4).unwrap() {
            DiscReply::Changes {
                known: true,
                since,
                version,
                upserted,
                removed,
            } => {
                assert_eq!(since, v);
                assert_eq!(version, s.version());
                assert_eq!(upserted, vec![c.clone()]);
                assert_eq!(removed, vec![b.node.clone()]);
            }
            other => panic!("{other:?}"),
        }
        // More changes than the log keeps: the whole table.
        for n in 0..CHANGE_LOG + 10 {
            let mut x = info(100, 1);
            x.attrs = vec![("n".into(), n.to_string())];
            s.handle(&peer(&x), DiscRequest::Register(x), 5).unwrap();
        }
        match s.handle(&peer(&a), sync(&a, v), 6).unwrap() {
            DiscReply::Heartbeat {
                members: Some(m), ..
            } => assert_eq!(m.len(), 3),
            other => panic!("{other:?}"),
        }
        // A version from before a server restart (ahead of this table): the table too.
        match s.handle(&peer(&a), sync(&a, s.version() + 5), 7).unwrap() {
            DiscReply::Heartbeat {
                members: Some(_), ..
            } => {}
            other => panic!("{other:?}"),
        }
        // Someone else's Sync is refused like a heartbeat.
        assert!(s.handle(&peer(&a), sync(&c, 0), 8).is_err());
    }

    #[test]
    fn the_table_stops_at_its_member_and_byte_limits_and_frees_room_as_members_leave() {
        let limits = Limits {
            max_members: 3,
            max_table_bytes: 10_000,
            ..Limits::default()
        };
        let mut core = ServerCore::with_limits(1000, limits);
        for n in 0..3 {
            let i = info(n, 10);
            core.handle(&peer(&i), DiscRequest::Register(i.clone()), 0)
                .unwrap();
        }
        let fourth = info(3, 10);
        assert_eq!(
            core.handle(&peer(&fourth), DiscRequest::Register(fourth.clone()), 0),
            Err(Refusal::TooManyMembers { max: 3 })
        );
        // Re-registering a member that is already there is not a new member.
        let again = info(0, 20);
        core.handle(&peer(&again), DiscRequest::Register(again.clone()), 0)
            .unwrap();
        // Growing one announcement past the table's bytes is refused too.
        let huge = info(1, 9_990);
        assert_eq!(
            core.handle(&peer(&huge), DiscRequest::Register(huge.clone()), 0),
            Err(Refusal::TableFull { max: 10_000 })
        );
        let before = core.table_bytes();
        // Expiry frees the room: the bytes and the member count go back down.
        let later = core.members(5000);
        assert!(later.is_empty());
        assert_eq!(core.table_bytes(), 0);
        assert!(before > 0);
        core.handle(&peer(&fourth), DiscRequest::Register(fourth.clone()), 5000)
            .unwrap();
    }
}

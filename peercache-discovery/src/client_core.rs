//! A member's view of the cluster, without I/O: which servers to talk to this round, how to
//! merge their answers, who the masters are, and what changed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;

use peercache_wire::NodeId;

use crate::info::NodeInfo;
use crate::msg::{DiscReply, DiscRequest};

/// A membership change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A member appeared (or came back with a new incarnation).
    Joined(NodeInfo),
    /// A member is gone (or its previous incarnation is).
    Left(NodeInfo),
    /// The master set changed.
    MastersChanged(Vec<SocketAddr>),
}

/// Picks the masters: seeds pinned first, in the order given, while they are alive, then the
/// other hosts that run a discovery server, in address order (10.0.0.2 before 10.0.0.10).
pub fn choose_masters(
    seeds: &[SocketAddr],
    alive_servers: &HashSet<SocketAddr>,
    max_masters: usize,
) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::with_capacity(max_masters);
    for s in seeds {
        if out.len() == max_masters {
            return out;
        }
        if alive_servers.contains(s) && !out.contains(s) {
            out.push(*s);
        }
    }
    let mut rest: Vec<SocketAddr> = alive_servers
        .iter()
        .filter(|a| !out.contains(a))
        .copied()
        .collect();
    rest.sort_by_key(|a| (a.ip(), a.port()));
    for a in rest {
        if out.len() == max_masters {
            break;
        }
        out.push(a);
    }
    out
}

/// The client state of one member.
#[derive(Debug)]
pub struct ClientCore {
    me: NodeInfo,
    seeds: Vec<SocketAddr>,
    max_masters: usize,
    registered: HashSet<SocketAddr>,
    /// Last member list and version heard from each server.
    heard: HashMap<SocketAddr, (u64, Vec<NodeInfo>)>,
    view: BTreeMap<NodeId, NodeInfo>,
    masters: Vec<SocketAddr>,
    silent_rounds: u32,
    /// Servers that said this round that they no longer hold this member's registration.
    lost: Vec<SocketAddr>,
    /// Servers whose table, this round, holds this member's entry (same life) with other
    /// contents than it announced: a forged or corrupted registration, repaired next round.
    misrecorded: Vec<SocketAddr>,
    /// Servers that answered a [`DiscRequest::Sync`] (they send changes, not the table).
    synced: HashSet<SocketAddr>,
    /// Servers that took a registration but not a `Sync` (an earlier release): plain
    /// heartbeats go to them.
    legacy: HashSet<SocketAddr>,
    /// The servers whose tables the view was last built from.
    answered: HashSet<SocketAddr>,
}

impl ClientCore {
    /// A member that knows only its seeds.
    pub fn new(me: NodeInfo, seeds: Vec<SocketAddr>, max_masters: usize) -> Self {
        ClientCore {
            me,
            seeds,
            max_masters: max_masters.max(1),
            registered: HashSet::new(),
            heard: HashMap::new(),
            view: BTreeMap::new(),
            masters: Vec::new(),
            silent_rounds: 0,
            lost: Vec::new(),
            misrecorded: Vec::new(),
            synced: HashSet::new(),
            legacy: HashSet::new(),
            answered: HashSet::new(),
        }
    }

    /// The servers that, in the last merged round, answered a heartbeat without holding this
    /// member's registration (they pruned or never had it; the next round registers again).
    pub fn lost_registrations(&self) -> &[SocketAddr] {
        &self.lost
    }

    /// This member.
    pub fn me(&self) -> &NodeInfo {
        &self.me
    }

    /// Current masters.
    pub fn masters(&self) -> &[SocketAddr] {
        &self.masters
    }

    /// Current members, sorted by id.
    pub fn members(&self) -> Vec<NodeInfo> {
        self.view.values().cloned().collect()
    }

    /// True once the view contains this member (a master has it registered).
    pub fn is_ready(&self) -> bool {
        self.view
            .get(&self.me.node)
            .is_some_and(|i| i.incarnation == self.me.incarnation)
    }

    /// Rounds in a row in which no server answered.
    pub fn silent_rounds(&self) -> u32 {
        self.silent_rounds
    }

    /// The servers that, in the last merged round, listed this member (in this life) with
    /// other endpoints or attributes than it announced — someone registered in its name. The
    /// next round registers its own entry there again.
    pub fn misrecorded(&self) -> &[SocketAddr] {
        &self.misrecorded
    }

    /// The requests of this round: every current master and every seed. After a round in
    /// which none of them answered (every master and seed died), also the next discovery
    /// servers this member knows, in master order, so survivors regroup before the dead
    /// masters' registrations even expire.
    pub fn round(&self) -> Vec<(SocketAddr, DiscRequest)> {
        let mut targets: Vec<SocketAddr> = self.masters.clone();
        for s in &self.seeds {
            if !targets.contains(s) {
                targets.push(*s);
            }
        }
        if self.silent_rounds > 0 {
            // Walk the other known servers a window at a time, one window per silent round,
            // so a member cut off from every master and seed finds a reachable server.
            let servers: HashSet<SocketAddr> = self.view.values().filter_map(|m| m.meta).collect();
            let others: Vec<SocketAddr> = choose_masters(&[], &servers, servers.len())
                .into_iter()
                .filter(|s| !targets.contains(s))
                .collect();
            if !others.is_empty() {
                // Windows double each silent round (6, 12, 24, … servers), so a member whose
                // whole neighbourhood in address order is cut off reaches the far side in
                // log₂(servers) rounds, not servers ÷ 6.
                let w0 = 2 * self.max_masters;
                let k = (self.silent_rounds - 1).min(20);
                let w = (w0 << k).min(others.len());
                let start = (w0 * ((1usize << k) - 1)) % others.len();
                targets.extend((0..w).map(|i| others[(start + i) % others.len()]));
            }
        }
        targets
            .into_iter()
            .map(|t| {
                let known_version = self.heard.get(&t).map_or(0, |h| h.0);
                let req = if self.registered.contains(&t) && !self.legacy.contains(&t) {
                    DiscRequest::Sync {
                        node: self.me.node.clone(),
                        incarnation: self.me.incarnation,
                        known_version,
                    }
                } else if self.registered.contains(&t) {
                    DiscRequest::Heartbeat {
                        node: self.me.node.clone(),
                        incarnation: self.me.incarnation,
                        known_version,
                    }
                } else {
                    DiscRequest::Register(self.me.clone())
                };
                (t, req)
            })
            .collect()
    }

    /// Forgets every master and seed (a crashed node sends nothing more).
    pub fn forget_masters(&mut self) {
        self.masters.clear();
        self.seeds.clear();
    }

    /// The requests of a clean shutdown.
    pub fn leave(&self) -> Vec<(SocketAddr, DiscRequest)> {
        let mut targets: Vec<SocketAddr> = self.masters.clone();
        targets.extend(self.seeds.iter().filter(|s| !self.masters.contains(s)));
        targets
            .into_iter()
            .map(|t| {
                (
                    t,
                    DiscRequest::Deregister {
                        node: self.me.node.clone(),
                        incarnation: self.me.incarnation,
                    },
                )
            })
            .collect()
    }

    /// Merges one round's answers (`None` = no answer). Returns what changed. When no server
    /// answered, the view is kept: a member cut off from every master does not declare
    /// everyone else dead.
    pub fn merge(&mut self, answers: Vec<(SocketAddr, Option<DiscReply>)>) -> Vec<Event> {
        let mut answered = HashSet::new();
        let mut dirty = false;
        self.lost.clear();
        self.misrecorded.clear();
        for (t, a) in answers {
            match a {
                None => {
                    // Registered, sent a Sync, never answered one: an earlier release that
                    // cannot decode it (or a server that just died; either way plain
                    // heartbeats are right).
                    if self.registered.contains(&t)
                        && !self.legacy.contains(&t)
                        && !self.synced.contains(&t)
                    {
                        self.legacy.insert(t);
                    }
                    self.registered.remove(&t);
                    dirty |= self.heard.remove(&t).is_some();
                }
                Some(DiscReply::Members { version, members }) => {
                    self.registered.insert(t);
                    dirty = true;
                    self.heard.insert(t, (version, members));
                    answered.insert(t);
                }
                Some(DiscReply::Heartbeat {
                    known,
                    version,
                    members,
                }) => {
                    if !self.legacy.contains(&t) {
                        self.synced.insert(t);
                    }
                    if known {
                        self.registered.insert(t);
                    } else if self.registered.remove(&t) {
                        self.lost.push(t);
                    }
                    if let Some(m) = members {
                        dirty = true;
                        self.heard.insert(t, (version, m));
                    }
                    if self.heard.contains_key(&t) {
                        answered.insert(t);
                    }
                }
                Some(DiscReply::Changes {
                    known,
                    since,
                    version,
                    upserted,
                    removed,
                }) => {
                    self.synced.insert(t);
                    if known {
                        self.registered.insert(t);
                    } else if self.registered.remove(&t) {
                        self.lost.push(t);
                    }
                    match self.heard.get_mut(&t) {
                        Some((v, list)) if *v == since => {
                            let gone: HashSet<&NodeId> = removed
                                .iter()
                                .chain(upserted.iter().map(|i| &i.node))
                                .collect();
                            list.retain(|m| !gone.contains(&m.node));
                            list.extend(upserted);
                            dirty = true;
                            *v = version;
                        }
                        // Not the base this client holds: ask for the table next round.
                        _ => {
                            dirty |= self.heard.remove(&t).is_some();
                        }
                    }
                    if self.heard.contains_key(&t) {
                        answered.insert(t);
                    }
                }
                Some(DiscReply::Ok) => {}
            }
        }
        // A table that lists this life of this member other than announced: register again
        // there (the member's own registration replaces the forged one).
        for t in &answered {
            let wrong = self.heard[t].1.iter().any(|m| {
                m.node == self.me.node && m.incarnation == self.me.incarnation && *m != self.me
            });
            if wrong && self.registered.remove(t) {
                self.misrecorded.push(*t);
            }
        }
        if answered.is_empty() {
            self.silent_rounds += 1;
            return Vec::new();
        }
        self.silent_rounds = 0;
        // Nothing heard changed and the same servers answered: the view stands (rebuilding it
        // clones every member once per answering server, each heartbeat).
        if !dirty && answered == self.answered {
            return Vec::new();
        }
        self.answered = answered.clone();
        let mut next: BTreeMap<NodeId, NodeInfo> = BTreeMap::new();
        for t in &answered {
            for m in &self.heard[t].1 {
                match next.get(&m.node) {
                    // Two servers disagree on a restarted node: the newer incarnation wins.
                    Some(cur) if cur.incarnation >= m.incarnation => {}
                    _ => {
                        next.insert(m.node.clone(), m.clone());
                    }
                }
            }
        }
        let mut events = Vec::new();
        for (id, old) in &self.view {
            match next.get(id) {
                None => events.push(Event::Left(old.clone())),
                Some(n) if n.incarnation != old.incarnation => {
                    events.push(Event::Left(old.clone()));
                    events.push(Event::Joined(n.clone()));
                }
                _ => {}
            }
        }
        for (id, n) in &next {
            if !self.view.contains_key(id) {
                events.push(Event::Joined(n.clone()));
            }
        }
        self.view = next;
        // The discovery servers: those the members announce, and those that just answered (a
        // server answers before its own host's member is in its table: a member that reached
        // only such fresh servers must keep them, or it would know too few servers, or none, to
        // find the rest).
        let mut servers: HashSet<SocketAddr> = self.view.values().filter_map(|m| m.meta).collect();
        servers.extend(answered.iter().copied());
        let masters = choose_masters(&self.seeds, &servers, self.max_masters);
        if masters != self.masters {
            self.masters = masters.clone();
            events.push(Event::MastersChanged(masters));
        }
        // Forget servers that are neither masters nor seeds.
        let keep: HashSet<SocketAddr> = self.masters.iter().chain(&self.seeds).copied().collect();
        self.heard.retain(|t, _| keep.contains(t));
        self.registered.retain(|t| keep.contains(t));
        self.synced.retain(|t| keep.contains(t));
        self.legacy.retain(|t| keep.contains(t));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn me() -> NodeInfo {
        NodeInfo {
            node: NodeId::new("me").unwrap(),
            incarnation: peercache_wire::Incarnation(1),
            host: "10.0.0.9".parse().unwrap(),
            meta: None,
            control: a("10.0.0.9:1"),
            data: vec![],
            role: "inference".into(),
            attrs: vec![],
        }
    }

    fn kinds(c: &ClientCore) -> Vec<&'static str> {
        c.round()
            .iter()
            .map(|(_, r)| match r {
                DiscRequest::Register(_) => "register",
                DiscRequest::Sync { .. } => "sync",
                DiscRequest::Heartbeat { .. } => "heartbeat",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn changes_apply_to_the_table_heard_and_an_earlier_release_gets_plain_heartbeats() {
        let seed = a("10.0.0.1:9");
        let mut c = ClientCore::new(me(), vec![seed], 3);
        let mut other = me();
        other.node = NodeId::new("other").unwrap();
        assert_eq!(kinds(&c), ["register"]);
        c.merge(vec![(
            seed,
            Some(DiscReply::Members {
                version: 5,
                members: vec![me()],
            }),
        )]);
        assert_eq!(kinds(&c), ["sync"]);
        // A change list from the version held: applied.
        let ev = c.merge(vec![(
            seed,
            Some(DiscReply::Changes {
                known: true,
                since: 5,
                version: 6,
                upserted: vec![other.clone()],
                removed: vec![],
            }),
        )]);
        assert_eq!(ev, vec![Event::Joined(other.clone())]);
        assert_eq!(c.members().len(), 2);
        let ev = c.merge(vec![(
            seed,
            Some(DiscReply::Changes {
                known: true,
                since: 6,
                version: 7,
                upserted: vec![],
                removed: vec![other.node.clone()],
            }),
        )]);
        assert_eq!(ev, vec![Event::Left(other.clone())]);
        // From another base: not applied, the table is asked for (known version 0).
        c.merge(vec![(
            seed,
            Some(DiscReply::Changes {
                known: true,
                since: 3,
                version: 9,
                upserted: vec![other.clone()],
                removed: vec![],
            }),
        )]);
        assert_eq!(c.members().len(), 1);
        match &c.round()[0].1 {
            DiscRequest::Sync {
                known_version: 0, ..
            } => {}
            r => panic!("{r:?}"),
        }

        // A server of the previous release: takes the registration, cannot decode a Sync (no
        // answer), and is then sent plain heartbeats.
        let old = a("10.0.0.2:9");
        let mut c = ClientCore::new(me(), vec![old], 3);
        c.merge(vec![(
            old,
            Some(DiscReply::Members {
                version: 2,
                members: vec![me()],
            }),
        )]);
        assert_eq!(kinds(&c), ["sync"]);
        c.merge(vec![(old, None)]);
        assert_eq!(kinds(&c), ["register"]);
        c.merge(vec![(
            old,
            Some(DiscReply::Members {
                version: 2,
                members: vec![me()],
            }),
        )]);
        assert_eq!(kinds(&c), ["heartbeat"]);
        assert!(c.is_ready());
    }

    #[test]
    fn masters_are_pinned_seeds_then_address_order() {
        let alive: HashSet<SocketAddr> = ["10.0.0.10:9", "10.0.0.2:9", "10.0.0.3:9", "10.0.0.1:9"]
            .iter()
            .map(|s| a(s))
            .collect();
        // Address order, not string order: .2 and .3 before .10.
        assert_eq!(
            choose_masters(&[], &alive, 3),
            vec![a("10.0.0.1:9"), a("10.0.0.2:9"), a("10.0.0.3:9")]
        );
        // A pinned head comes first while alive.
        assert_eq!(
            choose_masters(&[a("10.0.0.10:9")], &alive, 3),
            vec![a("10.0.0.10:9"), a("10.0.0.1:9"), a("10.0.0.2:9")]
        );
        // A dead seed is skipped.
        assert_eq!(
            choose_masters(&[a("10.0.0.99:9")], &alive, 2),
            vec![a("10.0.0.1:9"), a("10.0.0.2:9")]
        );
    }
}

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
                let w = (2 * self.max_masters).min(others.len());
                let start = ((self.silent_rounds as usize - 1) * w) % others.len();
                targets.extend((0..w).map(|i| others[(start + i) % others.len()]));
            }
        }
        targets
            .into_iter()
            .map(|t| {
                let req = if self.registered.contains(&t) {
                    DiscRequest::Heartbeat {
                        node: self.me.node.clone(),
                        incarnation: self.me.incarnation,
                        known_version: self.heard.get(&t).map_or(0, |h| h.0),
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
        self.lost.clear();
        for (t, a) in answers {
            match a {
                None => {
                    self.registered.remove(&t);
                    self.heard.remove(&t);
                }
                Some(DiscReply::Members { version, members }) => {
                    self.registered.insert(t);
                    self.heard.insert(t, (version, members));
                    answered.insert(t);
                }
                Some(DiscReply::Heartbeat {
                    known,
                    version,
                    members,
                }) => {
                    if known {
                        self.registered.insert(t);
                    } else if self.registered.remove(&t) {
                        self.lost.push(t);
                    }
                    if let Some(m) = members {
                        self.heard.insert(t, (version, m));
                    }
                    if self.heard.contains_key(&t) {
                        answered.insert(t);
                    }
                }
                Some(DiscReply::Ok) => {}
            }
        }
        if answered.is_empty() {
            self.silent_rounds += 1;
            return Vec::new();
        }
        self.silent_rounds = 0;
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
        let servers: HashSet<SocketAddr> = self.view.values().filter_map(|m| m.meta).collect();
        let masters = choose_masters(&self.seeds, &servers, self.max_masters);
        if masters != self.masters {
            self.masters = masters.clone();
            events.push(Event::MastersChanged(masters));
        }
        // Forget servers that are neither masters nor seeds.
        let keep: HashSet<SocketAddr> = self.masters.iter().chain(&self.seeds).copied().collect();
        self.heard.retain(|t, _| keep.contains(t));
        self.registered.retain(|t| keep.contains(t));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
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

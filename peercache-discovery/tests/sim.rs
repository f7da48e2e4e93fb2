//! The discovery protocol simulated: 256 members on 32 hosts in one process, a simulated
//! clock, no sockets. Kill the masters; partition and heal.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use peercache_discovery::{ClientCore, NodeInfo, ServerCore};
use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};

const HEARTBEAT: u64 = 1000;
const TTL: u64 = 3000;
const STEP: u64 = 50;
const HOSTS: usize = 32;
const RANKS: usize = 8;

fn meta(host: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(
            10,
            0,
            (host / 200) as u8,
            (host % 200 + 2) as u8,
        )),
        31998,
    )
}

struct Member {
    host: usize,
    core: ClientCore,
    next: u64,
    alive: bool,
}

struct Sim {
    now: u64,
    members: Vec<Member>,
    servers: HashMap<SocketAddr, ServerCore>,
    partition: Option<HashSet<usize>>,
}

impl Sim {
    fn new() -> Sim {
        let seeds = vec![meta(0), meta(1)];
        let mut members = Vec::new();
        let mut servers = HashMap::new();
        for h in 0..HOSTS {
            servers.insert(meta(h), ServerCore::new(TTL));
            for r in 0..RANKS {
                let i = h * RANKS + r;
                let info = NodeInfo {
                    node: NodeId::new(format!("h{h}-r{r}")).unwrap(),
                    incarnation: Incarnation(1),
                    host: meta(h).ip(),
                    meta: (r == 0).then(|| meta(h)),
                    control: SocketAddr::new(meta(h).ip(), 40000 + r as u16),
                    data: vec![],
                    role: "inference".into(),
                    attrs: vec![],
                };
                members.push(Member {
                    host: h,
                    core: ClientCore::new(info, seeds.clone(), 3),
                    next: (i as u64 * 37) % HEARTBEAT,
                    alive: true,
                });
            }
        }
        Sim {
            now: 0,
            members,
            servers,
            partition: None,
        }
    }

    fn reachable(&self, from_host: usize, to: SocketAddr) -> bool {
        let Some(to_host) = (0..HOSTS).find(|h| meta(*h) == to) else {
            return false;
        };
        match &self.partition {
            None => true,
            Some(side) => side.contains(&from_host) == side.contains(&to_host),
        }
    }

    fn step(&mut self) {
        self.now += STEP;
        for i in 0..self.members.len() {
            if !self.members[i].alive || self.members[i].next > self.now {
                continue;
            }
            let host = self.members[i].host;
            let round = self.members[i].core.round();
            let me = self.members[i].core.me();
            let from = Peer {
                node: Some(me.node.clone()),
                incarnation: me.incarnation,
                addr: "127.0.0.1:1".parse().unwrap(),
                authenticated: true,
            };
            let answers: Vec<_> = round
                .into_iter()
                .map(|(t, req)| {
                    let ok = self.reachable(host, t);
                    let reply = if ok {
                        self.servers
                            .get_mut(&t)
                            .and_then(|s| s.handle(&from, req, self.now).ok())
                    } else {
                        None
                    };
                    (t, reply)
                })
                .collect();
            self.members[i].core.merge(answers);
            self.members[i].next += HEARTBEAT;
        }
    }

    fn kill_host(&mut self, h: usize) {
        self.servers.remove(&meta(h));
        for m in self.members.iter_mut().filter(|m| m.host == h) {
            m.alive = false;
        }
    }

    /// True when every live member in `group` sees exactly the live members of `group` and
    /// all of them agree on the masters.
    fn converged(&self, group: &dyn Fn(usize) -> bool) -> bool {
        let expected: BTreeSet<NodeId> = self
            .members
            .iter()
            .filter(|m| m.alive && group(m.host))
            .map(|m| m.core.me().node.clone())
            .collect();
        let mut masters = None;
        for m in self.members.iter().filter(|m| m.alive && group(m.host)) {
            let seen: BTreeSet<NodeId> = m.core.members().into_iter().map(|i| i.node).collect();
            if seen != expected {
                return false;
            }
            match &masters {
                None => masters = Some(m.core.masters().to_vec()),
                Some(x) if *x != m.core.masters() => return false,
                _ => {}
            }
        }
        true
    }

    fn run_until(&mut self, limit_ms: u64, group: &dyn Fn(usize) -> bool) -> Option<u64> {
        let start = self.now;
        while self.now - start <= limit_ms {
            self.step();
            if self.converged(group) {
                return Some(self.now - start);
            }
        }
        None
    }

    fn masters_of_first_live(&self) -> Vec<SocketAddr> {
        self.members
            .iter()
            .find(|m| m.alive)
            .unwrap()
            .core
            .masters()
            .to_vec()
    }
}

#[test]
fn two_hundred_fifty_six_members_converge_and_survive_losing_every_master() {
    let mut sim = Sim::new();
    let t = sim
        .run_until(20_000, &|_| true)
        .expect("initial convergence");
    eprintln!("256 members converged after {t} ms");
    let masters = sim.masters_of_first_live();
    assert_eq!(
        masters,
        vec![meta(0), meta(1), meta(2)],
        "seeds pinned first, then address order"
    );
    // Kill every master host (servers and their 8 ranks each).
    for h in 0..3 {
        sim.kill_host(h);
    }
    let t = sim
        .run_until(TTL + 2 * HEARTBEAT, &|_| true)
        .expect("survivors must converge within TTL + 2 heartbeats");
    eprintln!("after killing all 3 masters (both seeds included): converged in {t} ms");
    assert_eq!(sim.masters_of_first_live(), vec![meta(3), meta(4), meta(5)]);
    assert_eq!(
        sim.members
            .iter()
            .find(|m| m.alive)
            .unwrap()
            .core
            .members()
            .len(),
        256 - 24
    );
}

#[test]
fn a_partition_splits_the_view_and_healing_merges_it() {
    let mut sim = Sim::new();
    sim.run_until(20_000, &|_| true)
        .expect("initial convergence");
    let side: HashSet<usize> = (0..HOSTS / 2).collect();
    sim.partition = Some(side.clone());
    let in_a = |h: usize| h < HOSTS / 2;
    let t = sim
        .run_until(TTL + 3 * HEARTBEAT, &|h| !in_a(h))
        .expect("the side without seeds regroups");
    eprintln!("partition: the seedless side converged on its own members in {t} ms");
    assert!(
        sim.run_until(TTL + 3 * HEARTBEAT, &in_a).is_some(),
        "the seed side sees only its half"
    );
    sim.partition = None;
    let t = sim
        .run_until(TTL + 3 * HEARTBEAT, &|_| true)
        .expect("healed cluster converges");
    eprintln!("heal: whole cluster converged in {t} ms");
    assert_eq!(
        sim.masters_of_first_live(),
        vec![meta(0), meta(1), meta(2)],
        "the pinned seeds lead again"
    );
}

#[test]
fn a_restarted_member_replaces_its_old_incarnation() {
    let mut sim = Sim::new();
    sim.run_until(20_000, &|_| true).unwrap();
    let i = 5 * RANKS + 3;
    let mut info = sim.members[i].core.me().clone();
    info.incarnation = Incarnation(2);
    sim.members[i].core = ClientCore::new(info, vec![meta(0), meta(1)], 3);
    for _ in 0..(3 * HEARTBEAT / STEP) {
        sim.step();
    }
    for m in sim.members.iter().filter(|m| m.alive) {
        let seen = m.core.members();
        let me = seen.iter().find(|m| m.node.as_str() == "h5-r3").unwrap();
        assert_eq!(
            me.incarnation,
            Incarnation(2),
            "{} still sees the old life",
            m.core.me().node
        );
    }
}

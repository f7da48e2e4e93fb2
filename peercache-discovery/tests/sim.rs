//! The discovery protocol simulated: 256 members on 32 hosts (and 1,024 on 128) in one
//! process, a simulated clock, no sockets. Kill the masters; partition and heal; count what
//! the masters send.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use peercache_discovery::{ClientCore, DiscReply, NodeInfo, ServerCore};
use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};

const HEARTBEAT: u64 = 1000;
const TTL: u64 = 3000;
const STEP: u64 = 50;
const HOSTS: usize = 32;
const RANKS: usize = 8;

/// Messages and encoded bytes (requests and replies) over a window of simulated time.
#[derive(Clone, Copy, Debug, Default)]
struct Traffic {
    messages: u64,
    bytes: u64,
    /// Replies that carried the whole member table.
    tables: u64,
}

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
    hosts: usize,
    members: Vec<Member>,
    servers: HashMap<SocketAddr, ServerCore>,
    partition: Option<HashSet<usize>>,
    traffic: Traffic,
    /// Count encoded bytes (encoding every table is most of the simulation's cost).
    count: bool,
}

impl Sim {
    fn new() -> Sim {
        Sim::with(HOSTS, RANKS)
    }

    fn with(hosts: usize, ranks: usize) -> Sim {
        let seeds = vec![meta(0), meta(1)];
        let mut members = Vec::new();
        let mut servers = HashMap::new();
        for h in 0..hosts {
            servers.insert(meta(h), ServerCore::new(TTL));
            for r in 0..ranks {
                let i = h * ranks + r;
                let info = NodeInfo {
                    node: NodeId::new(format!("h{h}-r{r}")).unwrap(),
                    incarnation: Incarnation(1),
                    host: meta(h).ip(),
                    meta: (r == 0).then(|| meta(h)),
                    control: SocketAddr::new(meta(h).ip(), 40000 + r as u16),
                    data: vec![SocketAddr::new(meta(h).ip(), 41000 + r as u16)],
                    role: "inference".into(),
                    attrs: vec![
                        ("tp_rank".into(), r.to_string()),
                        ("metrics".into(), format!("{}:{}", meta(h).ip(), 31997 + r)),
                    ],
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
            hosts,
            members,
            servers,
            partition: None,
            traffic: Traffic::default(),
            count: false,
        }
    }

    fn reachable(&self, from_host: usize, to: SocketAddr) -> bool {
        let Some(to_host) = (0..self.hosts).find(|h| meta(*h) == to) else {
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
                addr: SocketAddr::new(me.host, 1),
                authenticated: true,
                grant: peercache_wire::auth::Grant::Full,
                verified: false,
            };
            let answers: Vec<_> = round
                .into_iter()
                .map(|(t, req)| {
                    let ok = self.reachable(host, t);
                    self.traffic.messages += 1;
                    if self.count {
                        self.traffic.bytes += postcard::to_allocvec(&req).unwrap().len() as u64;
                    }
                    let reply = if ok {
                        self.servers
                            .get_mut(&t)
                            .and_then(|s| s.handle(&from, req, self.now).ok())
                    } else {
                        None
                    };
                    if let Some(r) = &reply {
                        self.traffic.messages += 1;
                        if self.count {
                            self.traffic.bytes += postcard::to_allocvec(r).unwrap().len() as u64;
                        }
                        if matches!(
                            r,
                            DiscReply::Members { .. }
                                | DiscReply::Heartbeat {
                                    members: Some(_),
                                    ..
                                }
                        ) {
                            self.traffic.tables += 1;
                        }
                    }
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
        // Cheap first: every view the right size (the full comparison is O(n²)).
        if self
            .members
            .iter()
            .filter(|m| m.alive && group(m.host))
            .any(|m| m.core.members().len() != expected.len())
        {
            return false;
        }
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
        // Checked every 250 ms of simulated time (the check clones every view).
        while self.now - start <= limit_ms {
            self.step();
            if (self.now - start).is_multiple_of(250) && self.converged(group) {
                return Some(self.now - start);
            }
        }
        None
    }

    /// How the live views differ: (view size, masters) → members holding it.
    fn spread(&self) -> std::collections::BTreeMap<(usize, Vec<SocketAddr>), usize> {
        let mut out = std::collections::BTreeMap::new();
        for m in self.members.iter().filter(|m| m.alive) {
            *out.entry((m.core.members().len(), m.core.masters().to_vec()))
                .or_insert(0) += 1;
        }
        out
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

/// Runs `sim` for `ms` of simulated time and returns what was sent meanwhile.
fn traffic_over(sim: &mut Sim, ms: u64) -> Traffic {
    sim.traffic = Traffic::default();
    for _ in 0..ms / STEP {
        sim.step();
    }
    sim.traffic
}

#[test]
fn a_thousand_members_on_128_hosts_converge_and_heartbeats_carry_no_tables() {
    let (hosts, ranks) = (128, 8);
    let n = (hosts * ranks) as u64;
    let mut sim = Sim::with(hosts, ranks);
    sim.count = true;
    let t = sim
        .run_until(TTL + 2 * HEARTBEAT, &|_| true)
        .expect("1,024 members converge within TTL + 2 heartbeats of starting");
    let start = sim.traffic;
    eprintln!(
        "1024 members: converged {t} ms after start; {} messages, {:.1} MB, {} full tables on the way",
        start.messages,
        start.bytes as f64 / 1e6,
        start.tables
    );

    // Members register with the third master once they learn it (one table each, on the
    // registration); then the steady state: a heartbeat and a short answer per (member,
    // master) each round.
    let settle = traffic_over(&mut sim, 3 * HEARTBEAT);
    eprintln!(
        "settling: {} tables (registrations with the masters learnt last)",
        settle.tables
    );
    let steady = traffic_over(&mut sim, 2 * HEARTBEAT);
    let per_round = steady.bytes / 2;
    eprintln!(
        "steady: {} messages and {} bytes per heartbeat round ({} B per member), {} tables",
        steady.messages / 2,
        per_round,
        per_round / n,
        steady.tables
    );
    assert_eq!(
        steady.tables, 0,
        "a steady heartbeat must not carry the table"
    );
    assert!(
        per_round / n <= 3 * 2 * 128,
        "{} B per member and round",
        per_round / n
    );

    // One member restarts: everyone learns it from a change list, not from a table.
    let i = 70 * ranks + 3;
    let mut info = sim.members[i].core.me().clone();
    info.incarnation = Incarnation(2);
    sim.members[i].core = ClientCore::new(info, vec![meta(0), meta(1)], 3);
    let churn = traffic_over(&mut sim, 3 * HEARTBEAT);
    eprintln!(
        "one restart: {} bytes over 3 rounds ({} B per member and round), {} tables",
        churn.bytes,
        churn.bytes / 3 / n,
        churn.tables
    );
    // The restarted member fetches tables (it registers anew); nobody else does.
    assert!(
        churn.tables <= 2 * 3,
        "{} tables for one restart",
        churn.tables
    );
    assert!(
        churn.bytes / 3 / n <= 3 * 2 * 512,
        "{} B",
        churn.bytes / 3 / n
    );

    // Every master host dies (both seeds among them).
    for h in 0..3 {
        sim.kill_host(h);
    }
    sim.traffic = Traffic::default();
    let t = sim
        .run_until(TTL + 2 * HEARTBEAT, &|_| true)
        .unwrap_or_else(|| {
            let odd: Vec<String> = sim
                .members
                .iter()
                .filter(|m| m.alive && m.core.masters().is_empty())
                .map(|m| {
                    format!(
                        "{} sees {:?}",
                        m.core.me().node,
                        m.core
                            .members()
                            .iter()
                            .map(|i| i.node.to_string())
                            .collect::<Vec<_>>()
                    )
                })
                .collect();
            panic!("survivors never converged: {:?} {odd:?}", sim.spread())
        });
    let failover = sim.traffic;
    eprintln!(
        "all masters killed: converged in {t} ms; {:.1} MB, {} tables",
        failover.bytes as f64 / 1e6,
        failover.tables
    );
    assert_eq!(sim.masters_of_first_live(), vec![meta(3), meta(4), meta(5)]);
    assert_eq!(
        sim.members
            .iter()
            .find(|m| m.alive)
            .unwrap()
            .core
            .members()
            .len() as u64,
        n - 24
    );
}

#[test]
fn a_thousand_members_heal_a_partition_within_ttl_and_two_heartbeats() {
    let (hosts, ranks) = (128, 8);
    let mut sim = Sim::with(hosts, ranks);
    sim.run_until(TTL + 2 * HEARTBEAT, &|_| true)
        .expect("initial convergence");
    let side: HashSet<usize> = (0..hosts / 2).collect();
    sim.partition = Some(side);
    let t = sim
        // Not bounded by the issue; measured 6 s (TTL + 3 heartbeats): the seedless side first
        // waits out the TTL of its lost masters' announcements.
        .run_until(TTL + 4 * HEARTBEAT, &|h| h >= hosts / 2)
        .unwrap_or_else(|| panic!("the side without seeds never regrouped: {:?}", sim.spread()));
    eprintln!("1024 members, partition: the seedless side converged in {t} ms");
    sim.partition = None;
    let t = sim
        .run_until(TTL + 2 * HEARTBEAT, &|_| true)
        .unwrap_or_else(|| panic!("not healed within TTL + 2 heartbeats: {:?}", sim.spread()));
    eprintln!("1024 members, heal: converged in {t} ms");
    assert_eq!(sim.masters_of_first_live(), vec![meta(0), meta(1), meta(2)]);
}

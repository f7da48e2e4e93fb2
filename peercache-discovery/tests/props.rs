//! Property tests of membership: the server's soft-state table against a model under random
//! register / heartbeat / deregister / clock sequences, and the master choice rules.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use peercache_discovery::{DiscReply, DiscRequest, NodeInfo, ServerCore, choose_masters};
use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};
use proptest::prelude::*;

const TTL: u64 = 1000;

#[derive(Clone, Debug)]
enum Op {
    Register(u8, u8),
    Heartbeat(u8, u8),
    Deregister(u8, u8),
    Advance(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..8, 0u8..3).prop_map(|(n, i)| Op::Register(n, i)),
        (0u8..8, 0u8..3).prop_map(|(n, i)| Op::Heartbeat(n, i)),
        (0u8..8, 0u8..3).prop_map(|(n, i)| Op::Deregister(n, i)),
        (0u16..1500).prop_map(Op::Advance),
    ]
}

fn info(n: u8, inc: u8) -> NodeInfo {
    let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, n + 1));
    NodeInfo {
        node: NodeId::new(format!("node-{n}")).unwrap(),
        incarnation: Incarnation(inc as u64),
        host: ip,
        meta: None,
        control: SocketAddr::new(ip, 7000),
        data: vec![SocketAddr::new(ip, 7001)],
        role: "inference".into(),
        attrs: vec![],
    }
}

/// The connection of `node-n` in incarnation `inc` from its own host, as its handshake
/// announced it.
fn peer(n: u8, inc: u8) -> Peer {
    let i = info(n, inc);
    Peer {
        node: Some(i.node),
        incarnation: Incarnation(inc as u64),
        addr: SocketAddr::new(i.host, 40000),
        authenticated: true,
        grant: peercache_wire::auth::Grant::Full,
        verified: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The table always equals the model: a member is live iff its last register or heartbeat
    /// of its current incarnation was less than TTL ago and it did not deregister; ids are
    /// unique and sorted; the version never goes back and moves whenever the set changes.
    #[test]
    fn server_table_matches_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        let mut core = ServerCore::new(TTL);
        // node -> (incarnation, expires)
        let mut model: BTreeMap<u8, (u8, u64)> = BTreeMap::new();
        let mut now = 0u64;
        let mut last_version = core.version();
        let mut last_set: Vec<(String, u64)> = Vec::new();
        for op in ops {
            model.retain(|_, (_, exp)| *exp > now);
            match op {
                Op::Register(n, i) => {
                    let reply = core.handle(&peer(n, i), DiscRequest::Register(info(n, i)), now).unwrap();
                    model.insert(n, (i, now + TTL));
                    let is_members = matches!(reply, DiscReply::Members { .. });
                    prop_assert!(is_members, "register answers with the members");
                }
                Op::Heartbeat(n, i) => {
                    let reply = core.handle(
                        &peer(n, i),
                        DiscRequest::Heartbeat {
                            node: info(n, i).node,
                            incarnation: Incarnation(i as u64),
                            known_version: 0,
                        },
                        now,
                    ).unwrap();
                    let expect_known = model.get(&n).is_some_and(|(inc, _)| *inc == i);
                    if expect_known {
                        model.insert(n, (i, now + TTL));
                    }
                    match reply {
                        DiscReply::Heartbeat { known, members, .. } => {
                            prop_assert_eq!(known, expect_known);
                            prop_assert!(members.is_some(), "a stale known_version gets members");
                        }
                        other => prop_assert!(false, "unexpected reply {:?}", other),
                    }
                }
                Op::Deregister(n, i) => {
                    core.handle(
                        &peer(n, i),
                        DiscRequest::Deregister {
                            node: info(n, i).node,
                            incarnation: Incarnation(i as u64),
                        },
                        now,
                    ).unwrap();
                    if model.get(&n).is_some_and(|(inc, _)| *inc == i) {
                        model.remove(&n);
                    }
                }
                Op::Advance(dt) => now += dt as u64,
            }
            model.retain(|_, (_, exp)| *exp > now);
            let live = core.members(now);
            let got: Vec<(String, u64)> = live
                .iter()
                .map(|m| (m.node.to_string(), m.incarnation.0))
                .collect();
            let want: Vec<(String, u64)> = model
                .iter()
                .map(|(n, (i, _))| (format!("node-{n}"), *i as u64))
                .collect();
            prop_assert_eq!(&got, &want);
            let ids: HashSet<&String> = got.iter().map(|(n, _)| n).collect();
            prop_assert_eq!(ids.len(), got.len(), "ids are unique");
            let v = core.version();
            prop_assert!(v >= last_version, "version went back");
            if got != last_set {
                prop_assert!(v > last_version, "the set changed but the version did not");
            }
            last_version = v;
            last_set = got;
        }
    }

    /// Masters: at most `max`, distinct, all alive; live seeds first in the given order; the
    /// rest in address order; the same answer whatever order the live set is given in.
    #[test]
    fn master_choice_rules(
        seeds in proptest::collection::vec(0u8..12, 0..5),
        alive in proptest::collection::hash_set(0u8..12, 0..10),
        max in 1usize..5,
    ) {
        let addr = |n: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n + 1)), 31998);
        let seeds: Vec<SocketAddr> = seeds.into_iter().map(addr).collect();
        let alive: HashSet<SocketAddr> = alive.into_iter().map(addr).collect();
        let m = choose_masters(&seeds, &alive, max);
        prop_assert!(m.len() <= max);
        prop_assert_eq!(m.len(), max.min(alive.len()));
        prop_assert_eq!(m.iter().collect::<HashSet<_>>().len(), m.len());
        prop_assert!(m.iter().all(|a| alive.contains(a)));
        let mut live_seeds: Vec<SocketAddr> = Vec::new();
        for s in &seeds {
            if alive.contains(s) && !live_seeds.contains(s) {
                live_seeds.push(*s);
            }
        }
        let k = live_seeds.len().min(max);
        prop_assert_eq!(&m[..k], &live_seeds[..k]);
        let rest = &m[k..];
        prop_assert!(rest.windows(2).all(|w| w[0].ip() < w[1].ip()));
        prop_assert!(rest.iter().all(|a| !live_seeds.contains(a)));
    }
}

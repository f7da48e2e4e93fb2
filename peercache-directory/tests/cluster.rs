//! Directory service and client over real loopback sockets, each node on its own 127.0.0.N.

mod common;

use std::time::{Duration, Instant};

use common::{key, loc};
use peercache_directory::testbed::TestNode;
use peercache_directory::{ClientConfig, DirError, Member, OwnerRef};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Incarnation, PageKey};

fn start(i: usize, cfg: ClientConfig) -> TestNode {
    TestNode::start(i, Incarnation(i as u64), cfg).expect("a node on loopback")
}

fn members(nodes: &[&TestNode]) -> Vec<Member> {
    nodes.iter().map(|n| n.member()).collect()
}

fn cluster(n: usize, cfg: ClientConfig) -> Vec<TestNode> {
    let nodes: Vec<TestNode> = (0..n).map(|i| start(i, cfg.clone())).collect();
    let m = members(&nodes.iter().collect::<Vec<_>>());
    for t in &nodes {
        t.client.apply_membership(&m);
    }
    nodes
}

#[test]
fn insert_on_one_node_is_found_from_every_node() {
    let nodes = cluster(3, ClientConfig::default());
    let entries: Vec<_> = (0..500)
        .map(|i| (key(i), loc(&nodes[0].id, i + 1)))
        .collect();
    let out = nodes[0].client.insert(&entries).unwrap();
    assert!(out.iter().all(|o| o.is_some_and(|o| o.new_owner)));
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    for n in &nodes {
        let found = n.client.lookup(&keys).unwrap();
        for (i, f) in found.iter().enumerate() {
            let owners = f
                .as_ref()
                .unwrap_or_else(|| panic!("key {i} missing from {}", n.id));
            assert_eq!(owners[0], entries[i].1);
        }
        assert!(n.client.exists(&keys).unwrap().iter().all(|&b| b));
    }
    // Each entry is on exactly two shards (replicas = 2).
    let total: usize = nodes
        .iter()
        .map(|n| n.service.with_shard(|s, _| s.len()))
        .sum();
    assert_eq!(total, 1000);
    assert!(nodes[1].client.stats().rpcs > 0 && nodes[1].client.stats().local_calls > 0);
}

#[test]
fn a_node_holds_every_entry_only_while_the_ring_has_no_more_members_than_replicas() {
    let nodes = cluster(3, ClientConfig::default());
    let keys: Vec<PageKey> = (0..64).map(key).collect();
    for n in &nodes {
        assert!(!n.client.holds_every_entry(), "3 members, 2 replicas");
    }
    let pair = [&nodes[0], &nodes[1]];
    for n in pair {
        n.client.apply_membership(&members(&pair));
        assert!(n.client.holds_every_entry(), "2 members, 2 replicas");
    }
    let entries: Vec<_> = keys
        .iter()
        .zip(1..)
        .map(|(k, i)| (*k, loc(&nodes[0].id, i)))
        .collect();
    nodes[0].client.insert(&entries).unwrap();
    for n in pair {
        // And then indeed no lookup of them leaves the node.
        let rpcs = n.client.stats().rpcs;
        let found = n.client.lookup(&keys).unwrap();
        assert!(found.iter().all(Option::is_some));
        assert_eq!(n.client.stats().rpcs, rpcs, "{} asked a peer", n.id);
    }
    // A node the ring does not name holds nothing.
    nodes[2].client.apply_membership(&members(&pair));
    assert!(!nodes[2].client.holds_every_entry());
}

#[test]
fn large_batches_are_split_not_rejected() {
    let cfg = ClientConfig {
        max_keys_per_request: 100,
        ..ClientConfig::default()
    };
    let nodes = cluster(3, cfg);
    let entries: Vec<_> = (0..2500).map(|i| (key(i), loc(&nodes[1].id, 1))).collect();
    nodes[1].client.insert(&entries).unwrap();
    let keys: Vec<PageKey> = (0..5000).map(key).collect();
    let present = nodes[2].client.exists(&keys).unwrap();
    assert_eq!(present.iter().filter(|&&b| b).count(), 2500);
    assert!(present[..2500].iter().all(|&b| b));
    assert!(
        nodes[2].client.stats().rpcs >= 30,
        "the 5000-key exists was split into many requests"
    );
}

#[test]
fn owner_conditional_remove_and_non_resident_reach_every_replica() {
    let nodes = cluster(3, ClientConfig::default());
    let k = key(42);
    nodes[0]
        .client
        .insert(&[(k, loc(&nodes[0].id, 3))])
        .unwrap();
    let r = |g| OwnerRef {
        key: k,
        node: nodes[0].id.clone(),
        generation: Some(g),
    };
    // Another member may neither mark nor remove node 0's copy.
    assert!(matches!(
        nodes[1].client.mark_nonresident(&[r(3)]),
        Err(DirError::NotYours { .. })
    ));
    assert!(matches!(
        nodes[2].client.remove(&[r(3)]),
        Err(DirError::NotYours { .. })
    ));
    assert!(
        nodes[0].client.lookup(&[k]).unwrap()[0].is_some(),
        "a foreign remove took the entry"
    );
    assert_eq!(
        nodes[0].client.mark_nonresident(&[r(3)]).unwrap(),
        2,
        "both replicas marked"
    );
    let owners = nodes[2].client.lookup(&[k]).unwrap()[0].clone().unwrap();
    assert!(!owners[0].resident);
    assert_eq!(
        nodes[0].client.remove(&[r(2)]).unwrap(),
        0,
        "wrong generation: nothing removed"
    );
    assert_eq!(nodes[0].client.remove(&[r(3)]).unwrap(), 2);
    assert_eq!(nodes[0].client.lookup(&[k]).unwrap()[0], None);
}

#[test]
fn reads_fall_back_to_a_replica_when_the_primary_is_down() {
    let mut nodes = cluster(
        3,
        ClientConfig {
            timeout: Duration::from_millis(500),
            ..ClientConfig::default()
        },
    );
    let entries: Vec<_> = (0..300).map(|i| (key(i), loc(&nodes[0].id, 1))).collect();
    nodes[0].client.insert(&entries).unwrap();
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    // The shard node 0 asks about the keys it does not own (the one it prefers of the two
    // others): the one whose answered requests grow.
    let answered = |n: &TestNode| n.server.counters().requests.get();
    let before: Vec<u64> = nodes.iter().map(answered).collect();
    nodes[0].client.lookup(&keys).unwrap();
    let asked: Vec<usize> = (1..3)
        .filter(|&i| answered(&nodes[i]) > before[i])
        .collect();
    assert_eq!(asked.len(), 1, "one remote shard asked: {asked:?}");
    let primary = asked[0];
    // Stop it without telling anyone (a crash before discovery notices).
    nodes[primary].server.shutdown();
    let t0 = Instant::now();
    let found = nodes[0].client.lookup(&keys).unwrap();
    assert!(
        found.iter().all(|f| f.is_some()),
        "every key still found through a replica"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert!(nodes[0].client.stats().fallbacks > 0);
    drop(nodes.remove(primary));
}

#[test]
fn a_node_that_joins_after_the_publish_finds_every_key() {
    let cfg = ClientConfig {
        drop_grace: Duration::ZERO,
        ..ClientConfig::default()
    };
    let mut nodes = cluster(3, cfg.clone());
    let entries: Vec<_> = (0..3000).map(|i| (key(i), loc(&nodes[0].id, 1))).collect();
    nodes[0].client.insert(&entries).unwrap();
    nodes.push(start(3, cfg));
    let m = members(&nodes.iter().collect::<Vec<_>>());
    let mut sent = 0;
    let mut dropped = 0;
    for n in &nodes {
        let r = n.client.apply_membership(&m);
        assert_eq!(r.failed, 0);
        sent += r.sent;
        dropped += r.dropped;
    }
    eprintln!("join over sockets: sent {sent}, dropped {dropped}");
    // The newcomer's share with two replicas is about 2 × 3000 / 4 entries.
    assert!(
        sent > 1000 && sent <= (1.3f64 * 1500.0) as usize,
        "sent {sent}"
    );
    assert_eq!(
        sent, dropped,
        "each entry moved once and its old copy was dropped"
    );
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    let found = nodes[3].client.lookup(&keys).unwrap();
    assert!(found.iter().all(|f| f.is_some()));
    let total: usize = nodes
        .iter()
        .map(|n| n.service.with_shard(|s, _| s.len()))
        .sum();
    assert_eq!(
        total, 6000,
        "still exactly two copies of every entry, none stale"
    );
}

#[test]
fn malformed_frames_close_only_that_connection() {
    let nodes = cluster(2, ClientConfig::default());
    let addr = nodes[1].server.local_addr();
    let c = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(9)),
        max_idle_per_peer: 2,
        max_frame: 1 << 20,
        auth: peercache_wire::Auth::none(),
    });
    // A directory-kind envelope whose body is garbage.
    let mut bad = peercache_wire::envelope::encode(
        &peercache_directory::DirRequest::Exists(vec![key(1)].into()),
        &[],
    )
    .unwrap();
    let n = bad.len();
    bad[n - 1] = 0xff;
    bad.truncate(n - 1);
    bad.extend_from_slice(&[0xff, 0xff, 0xff]);
    let reply = c.call(addr, &bad, Duration::from_secs(1)).unwrap();
    assert!(rpc::decode_reply::<peercache_directory::DirReply>(&reply).is_err());
    assert_eq!(nodes[1].server.counters().malformed.get(), 1);
    // The node still serves everyone else.
    nodes[0]
        .client
        .insert(&[(key(5), loc(&nodes[0].id, 1))])
        .unwrap();
    assert!(nodes[0].client.exists(&[key(5)]).unwrap()[0]);
}

#[test]
fn handed_off_entries_stay_on_the_old_owner_for_the_drop_grace() {
    let cfg = ClientConfig {
        drop_grace: Duration::from_millis(300),
        ..ClientConfig::default()
    };
    let mut nodes = cluster(3, cfg.clone());
    let entries: Vec<_> = (0..2000).map(|i| (key(i), loc(&nodes[0].id, 1))).collect();
    nodes[0].client.insert(&entries).unwrap();
    let before: usize = nodes
        .iter()
        .map(|n| n.service.with_shard(|s, _| s.len()))
        .sum();
    nodes.push(start(3, cfg));
    let m = members(&nodes.iter().collect::<Vec<_>>());
    let mut sent = 0;
    for n in &nodes {
        sent += n.client.apply_membership(&m).sent;
    }
    assert!(sent > 0);
    // Right after the hand-off the former owners still hold their copies (a reader whose view
    // lags still finds them) ...
    let during: usize = nodes
        .iter()
        .map(|n| n.service.with_shard(|s, _| s.len()))
        .sum();
    assert_eq!(during, before + sent);
    // ... and drop them once the grace has passed.
    let t0 = Instant::now();
    let mut dropped = 0;
    while dropped < sent {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "dropped {dropped} of {sent}"
        );
        dropped += nodes.iter().map(|n| n.client.drop_due()).sum::<usize>();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(t0.elapsed() >= Duration::from_millis(250));
    let after: usize = nodes
        .iter()
        .map(|n| n.service.with_shard(|s, _| s.len()))
        .sum();
    assert_eq!(after, 4000, "two copies of every entry, none stale");
}

/// A writer whose ring lags (it knows 2 of 4 members) puts every entry on those two; a reader
/// with the full ring asks owners that have nothing yet. Within the hand-off grace lookups and
/// `exists` ask every member once, so they still find every key; once the grace is over they
/// do not.
#[test]
fn a_lookup_right_after_a_ring_change_finds_entries_a_lagging_writer_placed() {
    let nodes: Vec<TestNode> = (0..4)
        .map(|i| start(20 + i, ClientConfig::default()))
        .collect();
    let all = members(&nodes.iter().collect::<Vec<_>>());
    let two = members(&[&nodes[0], &nodes[1]]);
    nodes[0].client.apply_membership(&two);
    nodes[1].client.apply_membership(&two);
    let entries: Vec<_> = (0..300)
        .map(|i| (key(9000 + i), loc(&nodes[0].id, i + 1)))
        .collect();
    assert!(
        nodes[0]
            .client
            .insert(&entries)
            .unwrap()
            .iter()
            .all(|o| o.is_some())
    );
    // The reader joins with the full ring: some keys' owners are nodes 2 and 3 only.
    nodes[3].client.apply_membership(&all);
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    let found = nodes[3].client.lookup(&keys).unwrap();
    let missing = found.iter().filter(|f| f.is_none()).count();
    assert_eq!(missing, 0, "{missing} keys not found within the grace");
    for (f, e) in found.iter().zip(&entries) {
        assert_eq!(f.as_ref().unwrap()[0], e.1);
    }
    // `exists` agrees with the lookup.
    assert!(nodes[3].client.exists(&keys).unwrap().iter().all(|&x| x));
    // Without a recent ring change (grace 0), the keys only nodes 2 and 3 own are misses.
    let strict = start(
        30,
        ClientConfig {
            handoff_grace: Duration::ZERO,
            ..ClientConfig::default()
        },
    );
    let mut with_strict = all.clone();
    with_strict.push(strict.member());
    strict.client.apply_membership(&with_strict);
    let found = strict.client.lookup(&keys).unwrap();
    assert!(
        found.iter().any(|f| f.is_none()),
        "some keys have no owner with them yet"
    );
    let present = strict.client.exists(&keys).unwrap();
    assert_eq!(
        present,
        found.iter().map(|f| f.is_some()).collect::<Vec<_>>(),
        "exists agrees with lookup outside the grace"
    );
}

#[test]
fn a_node_that_holds_a_copy_of_every_key_answers_lookups_without_a_round_trip() {
    // Two nodes, two copies: each shard holds every entry, so a reader asks its own shard
    // first even for keys whose first owner is the other node.
    let nodes = cluster(2, ClientConfig::default());
    let entries: Vec<_> = (0..500)
        .map(|i| (key(i), loc(&nodes[0].id, i + 1)))
        .collect();
    nodes[0].client.insert(&entries).unwrap();
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    let reader = &nodes[1].client;
    let before = reader.stats();
    let found = reader.lookup(&keys).unwrap();
    assert!(reader.exists(&keys).unwrap().iter().all(|&b| b));
    for (f, (_, want)) in found.iter().zip(&entries) {
        assert_eq!(f.as_ref().map(|o| &o[0]), Some(want));
    }
    let after = reader.stats();
    assert_eq!(after.rpcs, before.rpcs, "answered by the local shard");
    assert_eq!(after.local_calls, before.local_calls + 2);
    // With three nodes, only the keys this node holds no copy of go over the network.
    let nodes = cluster(3, ClientConfig::default());
    nodes[0].client.insert(&entries).unwrap();
    let ring = peercache_directory::Ring::new(nodes.iter().map(|n| n.id.clone()), 160);
    let remote = keys
        .iter()
        .filter(|k| !ring.owners(**k, 2).contains(&nodes[2].id))
        .count();
    assert!(remote > 0 && remote < keys.len(), "{remote}");
    let before = nodes[2].client.stats();
    let found = nodes[2].client.lookup(&keys).unwrap();
    assert!(found.iter().all(Option::is_some));
    let after = nodes[2].client.stats();
    assert!(
        after.rpcs - before.rpcs <= 2,
        "at most one request per other node, for the {remote} keys this one holds no copy of"
    );
    assert_eq!(after.local_calls, before.local_calls + 1);
}

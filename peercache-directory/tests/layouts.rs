//! Page layout fingerprints in the directory, over real loopback sockets (nodes on
//! 127.0.0.81–84): each copy's layout travels with its insert, its lookup answer and its
//! hand-off, is kept once per owner record (not per entry), and a frame whose layout runs do
//! not cover its locations is refused with a typed error.

mod common;

use std::time::Duration;

use common::{key, loc};
use peercache_directory::msg::{EXT_LAYOUTS, LayoutRuns};
use peercache_directory::testbed::TestNode;
use peercache_directory::{ClientConfig, DirReply, DirRequest, Location, Member};
use peercache_wire::envelope::{self, Extension};
use peercache_wire::rpc::{self, RpcError};
use peercache_wire::{Incarnation, Layout, PageKey, WireError};

fn start(i: usize, cfg: ClientConfig) -> TestNode {
    TestNode::start(i, Incarnation(1), cfg).expect("a node on loopback")
}

fn join(nodes: &[TestNode]) -> usize {
    let m: Vec<Member> = nodes.iter().map(|n| n.member()).collect();
    nodes
        .iter()
        .map(|n| {
            let r = n.client.apply_membership(&m);
            assert_eq!(r.failed, 0);
            r.sent
        })
        .sum()
}

/// Page `i`'s layout: runs of bf16 and fp8 with a few pages of no layout between them.
fn layout_of(i: u64) -> Layout {
    match i % 10 {
        0..=3 => Layout::from_canonical(b"model=m;dtype=bfloat16"),
        4..=8 => Layout::from_canonical(b"model=m;dtype=float8_e4m3fn"),
        _ => Layout::NONE,
    }
}

fn entry(owner: &TestNode, i: u64) -> (PageKey, Location) {
    let mut l = loc(&owner.id, i + 1);
    l.layout = layout_of(i);
    (key(i), l)
}

#[test]
fn layouts_travel_with_inserts_lookups_and_hand_offs_and_are_kept_per_owner() {
    let cfg = ClientConfig {
        drop_grace: Duration::ZERO,
        ..ClientConfig::default()
    };
    let mut nodes: Vec<TestNode> = (80..83).map(|i| start(i, cfg.clone())).collect();
    join(&nodes);
    let entries: Vec<_> = (0..600).map(|i| entry(&nodes[0], i)).collect();
    assert!(
        nodes[0]
            .client
            .insert(&entries)
            .unwrap()
            .iter()
            .all(Option::is_some)
    );
    let keys: Vec<PageKey> = entries.iter().map(|e| e.0).collect();
    let check = |nodes: &[TestNode]| {
        for n in nodes {
            let found = n.client.lookup(&keys).unwrap();
            for (i, f) in found.iter().enumerate() {
                let owners = f.as_ref().unwrap_or_else(|| panic!("key {i} missing"));
                assert_eq!(owners[..], [entries[i].1.clone()], "key {i} from {}", n.id);
            }
        }
    };
    // Every node's answer (most keys from another node's shard, over the wire) carries the
    // layout each page was published with.
    check(&nodes);
    assert!(nodes[1].client.stats().rpcs > 0);
    // One owner, one incarnation, one rail: a record per layout, not per entry.
    for n in &nodes {
        let records = n.service.with_shard(|s, _| s.owner_records());
        assert!(records <= 3, "{} has {records} owner records", n.id);
    }

    // A member joins: the entries handed to it keep their layouts.
    nodes.push(start(83, cfg));
    let sent = join(&nodes);
    assert!(sent > 0, "the newcomer was handed entries");
    let held: Vec<(usize, Location)> = nodes[3].service.with_shard(|s, _| {
        keys.iter()
            .enumerate()
            .filter_map(|(i, k)| s.peek(*k).map(|o| (i, o[0].clone())))
            .collect()
    });
    assert!(!held.is_empty());
    for (i, l) in &held {
        assert_eq!(l.layout, layout_of(*i as u64), "handed-off key {i}");
    }
    assert!(held.iter().any(|(_, l)| !l.layout.is_none()));
    check(&nodes);
}

#[test]
fn layout_runs_that_do_not_cover_the_locations_are_refused_typed() {
    let nodes: Vec<TestNode> = (84..86)
        .map(|i| start(i, ClientConfig::default()))
        .collect();
    join(&nodes);
    let addr = nodes[1].server.local_addr();
    let t = Duration::from_secs(2);
    let insert = DirRequest::Insert(vec![entry(&nodes[0], 0)].into());
    // Runs covering five locations for a request that carries one.
    let runs = LayoutRuns {
        runs: vec![(5, layout_of(0))],
    };
    let frame = envelope::encode(&insert, &[Extension::of(EXT_LAYOUTS, &runs).unwrap()]).unwrap();
    match nodes[0].client.rpc().call(addr, &frame, t) {
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_MALFORMED);
            assert!(message.contains("layout runs"), "{message}");
        }
        Ok(f) => match rpc::decode_reply::<DirReply>(&f) {
            Err(WireError::Remote { code, message }) => {
                assert_eq!(code, RpcError::CODE_MALFORMED);
                assert!(message.contains("layout runs"), "{message}");
            }
            other => panic!("uncovered layout runs must be refused: {other:?}"),
        },
        Err(e) => panic!("a typed refusal was expected: {e}"),
    }
    assert!(
        nodes[1].service.with_shard(|s, _| s.is_empty()),
        "nothing of the refused request was applied"
    );
    // The same request with its layouts right is taken, and the node serves on.
    let out = nodes[0].client.insert(&[entry(&nodes[0], 0)]).unwrap();
    assert!(out[0].is_some());
    let found = nodes[1].client.lookup(&[key(0)]).unwrap();
    assert_eq!(found[0].as_ref().unwrap()[0].layout, layout_of(0));
}

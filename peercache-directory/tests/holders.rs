//! The holders query (a router's prefix question) over real loopback sockets: it names every
//! copy a full lookup does, and reads shards of a release before it, which answer with full
//! owners.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{key, loc};
use peercache_directory::testbed::TestNode;
use peercache_directory::{
    ClientConfig, DirectoryClient, DirectoryService, Holding, Member, OwnerRef, ShardConfig,
};
use peercache_wire::envelope::Envelope;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcServer, ServerConfig};
use peercache_wire::{Auth, Incarnation, NodeId, PageKey};

fn cluster(n: usize) -> Vec<TestNode> {
    let nodes: Vec<TestNode> = (0..n)
        .map(|i| TestNode::start(i, Incarnation(i as u64 + 1), ClientConfig::default()).unwrap())
        .collect();
    let m: Vec<Member> = nodes.iter().map(|n| n.member()).collect();
    for t in &nodes {
        t.client.apply_membership(&m);
    }
    nodes
}

/// (node, resident) pairs of a key, as a set.
fn set_of(h: &Holding) -> BTreeSet<(String, bool)> {
    h.iter().map(|(n, r)| (n.to_string(), *r)).collect()
}

#[test]
fn holders_name_every_copy_a_full_lookup_does() {
    let nodes = cluster(3);
    // Node 0 holds keys 0..300, node 1 keys 0..150 (the first 50 only on disk); 300..400
    // nobody.
    let mine: Vec<_> = (0..300)
        .map(|i| (key(i), loc(&nodes[0].id, i + 1)))
        .collect();
    nodes[0].client.insert(&mine).unwrap();
    let theirs: Vec<_> = (0..150)
        .map(|i| (key(i), loc(&nodes[1].id, i + 1)))
        .collect();
    nodes[1].client.insert(&theirs).unwrap();
    let demoted: Vec<OwnerRef> = (0..50)
        .map(|i| OwnerRef {
            key: key(i),
            node: nodes[1].id.clone(),
            generation: None,
        })
        .collect();
    assert_eq!(nodes[1].client.mark_nonresident(&demoted).unwrap(), 100);
    let keys: Vec<PageKey> = (0..400).map(key).collect();
    for n in &nodes {
        let rpcs = n.client.stats().rpcs;
        let holders = n.client.holders(&keys).unwrap();
        assert!(n.client.stats().rpcs > rpcs, "remote shards were asked");
        let found = n.client.lookup(&keys).unwrap();
        assert_eq!(holders.len(), keys.len());
        for (i, (h, f)) in holders.iter().zip(&found).enumerate() {
            let want: BTreeSet<(String, bool)> = f
                .iter()
                .flatten()
                .map(|l| (l.node.to_string(), l.resident))
                .collect();
            assert_eq!(set_of(h), want, "key {i} asked from {}", n.id);
        }
        let i = |k: usize| set_of(&holders[k]);
        let (a, b) = (nodes[0].id.to_string(), nodes[1].id.to_string());
        assert_eq!(
            i(10),
            BTreeSet::from([(a.clone(), true), (b.clone(), false)])
        );
        assert_eq!(i(100), BTreeSet::from([(a.clone(), true), (b, true)]));
        assert_eq!(i(200), BTreeSet::from([(a, true)]));
        assert!(holders[350].is_empty());
        // The compact form: one node table for every shard's answer, each node in it once,
        // and per key the same copies.
        let compact = n.client.key_holders(&keys).unwrap();
        assert_eq!(compact.len(), keys.len());
        let table: BTreeSet<&str> = compact.nodes.iter().map(|n| n.as_str()).collect();
        assert_eq!(
            table.len(),
            compact.nodes.len(),
            "each node once in the table"
        );
        for (i, h) in holders.iter().enumerate() {
            let copies: BTreeSet<(String, bool)> = compact
                .copies(i)
                .iter()
                .map(|&c| (compact.nodes[(c >> 1) as usize].to_string(), c & 1 == 1))
                .collect();
            assert_eq!(copies, set_of(h), "key {i}");
        }
    }
}

#[test]
fn a_member_asks_one_remote_shard_for_the_keys_two_can_answer() {
    // Three members, two replicas: a key the asking member does not own is owned by both
    // others, so one request to the member it prefers answers all of them.
    let nodes = cluster(3);
    let entries: Vec<_> = (0..400)
        .map(|i| (key(i), loc(&nodes[(i % 3) as usize].id, i + 1)))
        .collect();
    for n in &nodes {
        let mine: Vec<_> = entries
            .iter()
            .filter(|(_, l)| l.node == n.id)
            .cloned()
            .collect();
        n.client.insert(&mine).unwrap();
    }
    let keys: Vec<PageKey> = (0..400).map(key).collect();
    for n in &nodes {
        let before = n.client.stats();
        let holders = n.client.holders(&keys).unwrap();
        let after = n.client.stats();
        assert_eq!(
            after.rpcs - before.rpcs,
            1,
            "one remote shard asked by {}",
            n.id
        );
        assert_eq!(after.fallbacks, before.fallbacks, "no key fell back");
        for (i, h) in holders.iter().enumerate() {
            let owner = entries[i].1.node.to_string();
            assert_eq!(set_of(h), BTreeSet::from([(owner, true)]), "key {i}");
        }
    }
    // A shard gone (the one some member prefers): its keys fall back to their other owner.
    let mut nodes = nodes;
    let gone = nodes.remove(2);
    drop(gone);
    for n in &nodes {
        let found = n.client.holders(&keys).unwrap();
        let named = found.iter().filter(|h| !h.is_empty()).count();
        assert_eq!(named, keys.len(), "every key answered from {}", n.id);
    }
}

#[test]
fn a_shard_of_a_release_before_holders_is_read_from_its_full_owners() {
    // One replica: each key lives on one of the two shards only.
    let cfg = ClientConfig {
        replicas: 1,
        ..ClientConfig::default()
    };
    let new = TestNode::start(0, Incarnation(1), cfg.clone()).unwrap();
    // The older shard: the same service, but it never sees the holders extension (a release
    // before it ignores an extension it does not know) and so answers `Found`.
    let old_id = NodeId::new("node-old").unwrap();
    let old_service = Arc::new(DirectoryService::new(ShardConfig::default()));
    let handler = old_service.clone();
    let old_shard = old_service.clone();
    let old_server = RpcServer::start(
        ServerConfig {
            bind: "127.0.0.2:0".parse().unwrap(),
            planes: vec![Plane::Control],
            node: Some(old_id.clone()),
            incarnation: Incarnation(2),
            max_frame: 16 << 20,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 16,
            offload: &[],
            workers: 1,
            name: "dir-old",
            auth: Auth::none(),
            shares: Default::default(),
        },
        Arc::new(move |peer, env: Envelope<'_>| {
            let plain = Envelope { ext: &[], ..env };
            handler
                .handle(peer, plain)
                .expect("only directory requests are sent here")
        }),
    )
    .unwrap();
    let old_client = DirectoryClient::new(
        old_id.clone(),
        old_service,
        RpcClient::new(rpc::ClientConfig {
            hello: Hello::new(Plane::Control, Some(old_id.clone()), Incarnation(2)),
            max_idle_per_peer: 2,
            max_frame: 16 << 20,
            auth: Auth::none(),
        }),
        cfg,
    );
    let members = vec![
        new.member(),
        Member {
            node: old_id.clone(),
            control: old_server.local_addr(),
            incarnation: Incarnation(2),
        },
    ];
    new.client.apply_membership(&members);
    old_client.apply_membership(&members);
    let entries: Vec<_> = (0..64).map(|i| (key(i), loc(&old_id, i + 1))).collect();
    old_client.insert(&entries).unwrap();
    let on_old = old_shard.with_shard(|s, _| s.len());
    assert!(
        on_old > 0 && on_old < 64,
        "the keys are split between the shards: {on_old} old"
    );
    let keys: Vec<PageKey> = (0..80).map(key).collect();
    let holders = new.client.holders(&keys).unwrap();
    for (i, h) in holders.iter().enumerate() {
        if i < 64 {
            assert_eq!(
                set_of(h),
                BTreeSet::from([(old_id.to_string(), true)]),
                "key {i}"
            );
        } else {
            assert!(h.is_empty(), "key {i}");
        }
    }
}

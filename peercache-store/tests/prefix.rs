//! Prefix location on three loopback nodes: for any request's keys, each node's leading run
//! equals a scan of what that node published, through the store API and the client API alike,
//! and a node that leaves disappears from the answers.

use std::time::Duration;

use peercache_store::client::Client;
use peercache_wire::Auth;
use serde_json::json;

mod common;

const N: usize = 100_000;

/// Which keys each node publishes: a all, b runs of 700 in every 1000, c the first half
/// except every seventh.
fn holds(node: usize, i: usize) -> bool {
    match node {
        0 => true,
        1 => i % 1000 < 700,
        _ => i < N / 2 && i % 7 != 3,
    }
}

/// The leading run of `node` from key `start`, `len` keys: the definition, key by key.
fn scan(node: usize, start: usize, len: usize) -> usize {
    (start..start + len).take_while(|&i| holds(node, i)).count()
}

#[test]
fn prefix_runs_equal_a_scan_of_what_each_node_published_over_100k_keys() {
    let nodes = common::cluster(
        &[66, 67, 68],
        json!({"global_segment_size": "64mb", "client_enabled": true, "member_ttl": 30.0}),
    );
    let keys: Vec<String> = (0..N).map(|i| format!("prefix/{i}")).collect();
    let page = [7u8; 64];
    for (n, node) in nodes.iter().enumerate() {
        let mine: Vec<&String> = keys
            .iter()
            .enumerate()
            .filter(|(i, _)| holds(n, *i))
            .map(|(_, k)| k)
            .collect();
        for chunk in mine.chunks(4096) {
            let pages = vec![&page[..]; chunk.len()];
            assert!(node.batch_set(chunk, &pages).unwrap().iter().all(|s| *s));
        }
    }
    let ids: Vec<String> = nodes.iter().map(|s| s.node_id().to_string()).collect();
    let check = |runs: &[peercache_store::PrefixRun], start: usize, len: usize| {
        for (n, id) in ids.iter().enumerate() {
            let want = scan(n, start, len);
            let got = runs.iter().find(|r| r.node.as_str() == id);
            match got {
                Some(r) => {
                    assert_eq!((r.leading, r.resident), (want, want), "{id} from {start}")
                }
                None => assert_eq!(want, 0, "{id} from {start}: missing from the answer"),
            }
        }
    };
    // Requests of 64 keys at 300 offsets across the keyspace, asked of every node in turn.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for q in 0..300 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let start = (x as usize) % (N - 64);
        let runs = nodes[q % 3]
            .prefix_locations(&keys[start..start + 64])
            .unwrap();
        check(&runs, start, 64);
    }
    // One request of every key.
    check(&nodes[1].prefix_locations(&keys).unwrap(), 0, N);
    // The client API gives the same answer.
    let client = Client::new(
        nodes[2].client_endpoint().unwrap(),
        Auth::from_secret(common::secret().as_bytes()).unwrap(),
        Duration::from_secs(10),
    );
    let start = 699;
    assert_eq!(
        client.prefix_locations(&keys[start..start + 64]).unwrap(),
        nodes[0].prefix_locations(&keys[start..start + 64]).unwrap()
    );
    // A node that leaves takes its runs with it.
    nodes[2].shutdown();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nodes[0]
        .prefix_locations(&keys[..64])
        .unwrap()
        .iter()
        .any(|r| r.node.as_str() == ids[2])
    {
        assert!(
            std::time::Instant::now() < deadline,
            "c never left the answers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for n in &nodes[..2] {
        n.shutdown();
    }
}

//! Prefix location on three loopback nodes: for any request's keys, each node's leading run
//! equals a scan of what that node published, through the store API, the client API and the
//! HTTP port's `POST /prefix` alike, and a node that leaves disappears from the answers; who
//! may ask over HTTP, and what bad queries get.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
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

/// `POST /prefix` with `body` (and `Authorization: Bearer <token>` when given): status, body.
fn post_prefix(addr: SocketAddr, body: &str, token: Option<&str>) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let headers = format!("{auth}Content-Type: application/json\r\n");
    common::http(addr, "POST", "/prefix", &headers, body)
}

/// A token file readable by its owner only.
fn token_file(dir: &tempfile::TempDir, token: &str) -> String {
    let path = dir.path().join("http-token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.display().to_string()
}

const TOKEN: &str = "a-router-token-of-this-test-0001";

#[test]
fn prefix_runs_equal_a_scan_of_what_each_node_published_over_100k_keys() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = common::cluster(
        &[66, 67, 68],
        json!({"global_segment_size": "64mb", "client_enabled": true, "member_ttl": 30.0,
               "metrics_enabled": true, "metrics_port": 0,
               "http_token_file": token_file(&dir, TOKEN)}),
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
    // Past one request's key limit the client asks with `Locate` and folds the owners itself.
    let long = peercache_store::client::MAX_CLIENT_KEYS + 100;
    assert_eq!(
        client.prefix_locations(&keys[..long]).unwrap(),
        nodes[0].prefix_locations(&keys[..long]).unwrap()
    );
    check(&client.prefix_locations(&keys[..long]).unwrap(), 0, long);
    // So does the HTTP port, with the token, in the `locate --prefix --json` shape.
    let http = nodes[1].metrics_endpoint().unwrap();
    for start in [0, 699, 51_234, N - 64] {
        let q = json!({"keys": &keys[start..start + 64]}).to_string();
        let (status, body) = post_prefix(http, &q, Some(TOKEN));
        assert_eq!(status, 200, "{body}");
        let got: serde_json::Value = serde_json::from_str(&body).unwrap();
        let want = nodes[0].prefix_locations(&keys[start..start + 64]).unwrap();
        assert_eq!(got["keys"], 64, "{body}");
        assert_eq!(got["nodes"], peercache_store::prefix_json(&want), "{body}");
        check(&want, start, 64);
    }
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

#[test]
fn the_http_prefix_query_needs_the_token_and_refuses_bad_queries_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let http_extra = json!({"metrics_enabled": true, "metrics_port": 0});
    // A cluster with a secret and no token file: nobody may ask.
    let open = common::cluster(&[69], http_extra.clone());
    let (status, body) = post_prefix(
        open[0].metrics_endpoint().unwrap(),
        r#"{"keys":["a"]}"#,
        None,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("http_token_file"), "{body}");
    open[0].shutdown();

    let mut extra = http_extra;
    extra["http_token_file"] = token_file(&dir, TOKEN).into();
    let node = common::cluster(&[70], extra);
    let http = node[0].metrics_endpoint().unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("tok/{i}")).collect();
    assert!(
        node[0]
            .batch_set(&keys[..5], &[&[1u8; 64][..]; 5])
            .unwrap()
            .iter()
            .all(|s| *s)
    );
    let q = json!({"keys": keys}).to_string();
    // Strangers: no token, a wrong one.
    for token in [None, Some("a-router-token-of-this-test-0002")] {
        let (status, body) = post_prefix(http, &q, token);
        assert_eq!(status, 401, "{token:?}: {body}");
        assert!(!body.contains(node[0].node_id().as_str()), "{body}");
    }
    let (status, body) = post_prefix(http, &q, Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    let got: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        got,
        json!({"keys": 8, "nodes": [{"node": node[0].node_id().as_str(), "leading": 5, "resident": 5}]})
    );
    // Bad queries: a reason each, and the port keeps serving.
    let too_many = json!({"keys": vec!["k"; 4097]}).to_string();
    let huge = format!(r#"{{"keys":["{}"]}}"#, "x".repeat(6 << 20));
    for (q, want) in [
        ("not json", 400),
        (r#"{"keys": "a"}"#, 400),
        (r#"{"keys": [1, 2]}"#, 400),
        (r#"{"keys": [], "more": 1}"#, 400),
        (too_many.as_str(), 413),
        (huge.as_str(), 413),
    ] {
        let (status, body) = post_prefix(http, q, Some(TOKEN));
        assert_eq!(status, want, "{}: {body}", &q[..q.len().min(40)]);
    }
    let (status, body) = post_prefix(http, r#"{"keys": []}"#, Some(TOKEN));
    assert_eq!((status, body.as_str()), (200, r#"{"keys":0,"nodes":[]}"#));
    node[0].shutdown();
}

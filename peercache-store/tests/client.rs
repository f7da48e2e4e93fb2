//! The client API on loopback: pages put through one node are read back byte-exact through
//! another (a remote read), bad requests get typed refusals, the API is off unless enabled,
//! the cluster secret guards it, and `peercache-node drive` (a real process) verifies a cluster.

use std::time::Duration;

use peercache_store::StoreError;
use peercache_store::client::{Client, ClientRequest, MAX_CLIENT_KEYS};
use peercache_store::layout::page::{LayoutSpec, PoolShape};
use peercache_wire::rpc::{self, RpcClient, RpcError};
use peercache_wire::{Auth, Incarnation, WireError, envelope};
use serde_json::json;

mod common;

fn auth() -> Auth {
    Auth::from_secret(common::secret().as_bytes()).unwrap()
}

#[test]
fn put_on_one_node_get_through_another_and_bad_requests_are_refused() {
    let nodes = common::cluster(
        &[40, 41],
        json!({"client_enabled": true, "cluster_secret": common::secret()}),
    );
    let (a, b) = (&nodes[0], &nodes[1]);
    let timeout = Duration::from_secs(5);
    let ca = Client::new(a.client_endpoint().unwrap(), auth(), timeout);
    let cb = Client::new(b.client_endpoint().unwrap(), auth(), timeout);
    // Both nodes run one deployment: its layout fingerprint travels with each location.
    let spec = LayoutSpec {
        model: "client-api".into(),
        kv_dtype: "bfloat16".into(),
        pp_rank: 0,
        tp: None,
        pools: vec![PoolShape {
            name: "kv".into(),
            tokens_per_page: 64,
            host_layout: "layer_first".into(),
            bytes_per_page: 48 << 10,
        }],
    };
    a.set_layout(&spec);
    b.set_layout(&spec);
    // The endpoints are advertised in discovery.
    let attrs: Vec<_> = b.members().into_iter().flat_map(|m| m.attrs).collect();
    assert!(
        attrs
            .iter()
            .any(|(k, v)| k == "client" && *v == ca.node().to_string())
    );

    // 300 pages of 48 KiB: more than one frame each way.
    let len = 48 << 10;
    let keys: Vec<String> = (0..300).map(|i| format!("client/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..300).map(|i| common::page(i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    assert!(ca.put(&keys, &refs).unwrap().iter().all(|s| *s));
    let read_before = b.stats().transport_read_bytes;
    let got = cb.get(&keys, len).unwrap();
    assert_eq!(got.len(), 300);
    for (g, want) in got.iter().zip(&pages) {
        let g = g.as_ref().expect("every page found");
        assert_eq!(g.valid as usize, len);
        assert!(g.bytes == *want, "a page read back differs");
    }
    assert!(
        b.stats().transport_read_bytes - read_before >= 300 * len as u64,
        "the pages came from a's pool over the data plane"
    );
    // A miss among hits keeps its place.
    let mixed = ["client/0", "never-written", "client/2"];
    let got = cb.get(&mixed, len).unwrap();
    assert!(got[0].is_some() && got[1].is_none() && got[2].is_some());
    assert_eq!(got[2].as_ref().unwrap().bytes, pages[2]);
    assert_eq!(cb.exists(&mixed).unwrap(), vec![true, false, true]);
    // Where the directory says they live: on a, resident, one owner per key here.
    let located = cb.locate(&mixed).unwrap();
    assert_eq!(located[0].len(), 1);
    assert_eq!(located[0][0].node, *a.node_id());
    assert!(located[0][0].resident);
    assert_eq!(located[0][0].len as usize, len);
    assert_eq!(located[0][0].layout, spec.fingerprint());
    assert!(located[1].is_empty(), "an unknown key has no owner");

    // Bad input: typed errors, never a panic or a truncated page.
    assert!(matches!(cb.get(&keys, 0), Err(StoreError::BadRequest(_))));
    let uneven: Vec<&[u8]> = vec![&pages[0], &pages[1][..100]];
    assert!(matches!(
        ca.put(&keys[..2], &uneven),
        Err(StoreError::BadRequest(_))
    ));
    assert!(matches!(
        ca.put(&keys[..1], &refs[..2]),
        Err(StoreError::BadRequest(_))
    ));
    let short = cb.get(&keys[..1], 1024).unwrap();
    assert!(
        short[0].is_none(),
        "a buffer smaller than the page must miss, not truncate"
    );
    // A hand-made request whose data does not match its page count is refused by the node.
    let raw = RpcClient::new(rpc::ClientConfig {
        hello: peercache_wire::handshake::Hello::new(
            peercache_wire::handshake::Plane::Control,
            None,
            Incarnation::fresh(),
        ),
        max_idle_per_peer: 1,
        max_frame: 64 << 20,
        auth: auth(),
    });
    let bad = ClientRequest::Put {
        keys: vec!["x".into(), "y".into()],
        page_bytes: 4096,
        data: serde_bytes::ByteBuf::from(vec![0u8; 4097]),
    };
    let reply = raw
        .call(
            a.client_endpoint().unwrap(),
            &envelope::encode(&bad, &[]).unwrap(),
            timeout,
        )
        .unwrap();
    let err: RpcError = envelope::decode(&reply).unwrap();
    assert_eq!(err.code, RpcError::CODE_REFUSED);
    assert!(err.message.contains("4097 data bytes"), "{}", err.message);
    let many = ClientRequest::Exists {
        keys: vec!["k".into(); MAX_CLIENT_KEYS + 1],
    };
    let reply = raw
        .call(
            a.client_endpoint().unwrap(),
            &envelope::encode(&many, &[]).unwrap(),
            timeout,
        )
        .unwrap();
    let err: RpcError = envelope::decode(&reply).unwrap();
    assert_eq!(err.code, RpcError::CODE_REFUSED);

    // Without the secret: no connection at all.
    let stranger = Client::new(a.client_endpoint().unwrap(), Auth::none(), timeout);
    match stranger.exists(&["client/0"]) {
        Err(StoreError::Wire(WireError::Unauthenticated(_))) => {}
        other => panic!("a client without the secret got {other:?}"),
    }
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn the_client_api_is_off_unless_enabled() {
    let nodes = common::cluster(&[42], json!({}));
    assert!(nodes[0].client_endpoint().is_none());
    assert!(
        nodes[0]
            .members()
            .iter()
            .all(|m| m.attrs.iter().all(|(k, _)| k != "client"))
    );
    nodes[0].shutdown();
}

#[test]
fn the_read_only_token_reads_and_looks_up_on_the_client_api_and_writes_nothing() {
    let nodes = common::cluster(&[43, 44], json!({"client_enabled": true}));
    let (a, b) = (&nodes[0], &nodes[1]);
    let keys: Vec<String> = (0..16).map(|i| format!("ro/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..16).map(|i| common::page(i, 4096)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|s| *s));
    // The operator's tool prints the token of the secret (from the environment here).
    let token = node_tool_ok(&["read-only-token"]).trim().to_string();
    assert_eq!(
        token,
        peercache_wire::auth::read_only_token(common::secret().as_bytes()).unwrap()
    );
    let ro = Client::new(
        b.client_endpoint().unwrap(),
        Auth::from_secret(token.as_bytes()).unwrap(),
        Duration::from_secs(5),
    );
    // Reads, presence, locations and prefix runs: served.
    let got = ro.get(&keys, 4096).unwrap();
    assert!(
        got.iter()
            .zip(&pages)
            .all(|(g, want)| g.as_ref().is_some_and(|g| g.bytes == *want))
    );
    assert!(ro.exists(&keys).unwrap().iter().all(|p| *p));
    assert!(ro.locate(&keys).unwrap().iter().all(|o| !o.is_empty()));
    assert_eq!(ro.prefix_locations(&keys).unwrap()[0].leading, 16);
    // Writes: refused, typed, and nothing is stored.
    let fresh = ["ro/new".to_string()];
    match ro.put(&fresh, &[&pages[0][..]]) {
        Err(StoreError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_FORBIDDEN, "{message}");
            assert!(message.contains("read-only"), "{message}");
        }
        other => panic!("a read-only client's put: {other:?}"),
    }
    assert_eq!(
        b.batch_exists(&fresh).unwrap(),
        0,
        "the refused page is nowhere"
    );
    // The same connection still reads after the refusal.
    assert!(ro.exists(&keys[..1]).unwrap()[0]);
    // The token is no cluster secret: the control port (a node's plane) refuses it.
    let control = RpcClient::new(rpc::ClientConfig {
        hello: peercache_wire::handshake::Hello::new(
            peercache_wire::handshake::Plane::Control,
            None,
            Incarnation(9),
        ),
        max_idle_per_peer: 1,
        max_frame: 1 << 20,
        auth: Auth::from_secret(token.as_bytes()).unwrap(),
    });
    let frame = envelope::encode(
        &ClientRequest::Exists {
            keys: vec!["ro/0".into()],
        },
        &[],
    )
    .unwrap();
    let ep = b.control_endpoint();
    match control.call(ep, &frame, Duration::from_secs(5)) {
        Err(WireError::Unauthenticated(_)) => {}
        other => panic!("the token on the control port: {other:?}"),
    }
    for n in &nodes {
        n.shutdown();
    }
}

/// Runs the `peercache-node` binary with `args` and the test nodes' secret in its
/// environment (`PEERCACHE_CLUSTER_SECRET`, as an operator's tool would have it).
fn node_tool(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_peercache-node"))
        .args(args)
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .output()
        .unwrap()
}

/// [`node_tool`], which must succeed; its standard output.
fn node_tool_ok(args: &[&str]) -> String {
    let out = node_tool(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_drive_tool_writes_on_one_node_and_verifies_reads_on_the_others() {
    let port = common::free_port();
    let extra = json!({"client_enabled": true, "metrics_enabled": true, "metrics_port": 0});
    let nodes: Vec<_> = [43u8, 44, 45]
        .iter()
        .map(|&n| common::node(n, 43, port, extra.clone()))
        .collect();
    for n in &nodes {
        assert!(n.wait_members(3, Duration::from_secs(10)));
        n.sync_membership();
    }
    let seed = format!("127.0.0.43:{port}");
    let writer = nodes[0].node_id().to_string();
    let stdout = node_tool_ok(&[
        "drive",
        "--discovery-addr",
        &seed,
        "--write-on",
        &writer,
        "--members",
        "3",
        "--pages",
        "64",
        "--page-size",
        "16kb",
        "--wait",
        "10",
    ]);
    assert!(stdout.contains("stored=64/64"), "{stdout}");
    for n in &nodes[1..] {
        let line = format!("READ {} hits=64/64 wrong=0 remote_hits=+64", n.node_id());
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }
    // locate: the pages the driver wrote live on the writer.
    let stdout = node_tool_ok(&[
        "locate",
        "--discovery-addr",
        &seed,
        "drive/0",
        "drive/63",
        "no-such-key",
    ]);
    assert!(
        stdout.contains(&format!("drive/0: {writer} resident Retained")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("drive/63: {writer} resident")),
        "{stdout}"
    );
    assert!(
        stdout.contains("no-such-key: not in the directory"),
        "{stdout}"
    );
    // The same keys as one request's pages: the writer holds the first two, then a miss.
    let stdout = node_tool_ok(&[
        "locate",
        "--discovery-addr",
        &seed,
        "--prefix",
        "drive/0",
        "drive/1",
        "no-such-key",
        "drive/2",
    ]);
    assert!(
        stdout.contains(&format!("{writer}: 2 of 4 leading pages (2 in memory)")),
        "{stdout}"
    );
    // A reader that does not exist: a clear failure, not a hang.
    let out = node_tool(&[
        "drive",
        "--discovery-addr",
        &seed,
        "--write-on",
        &writer,
        "--read-on",
        "nobody",
        "--wait",
        "0.5",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("client_enabled"));
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn a_node_in_another_process_on_this_host_is_read_through_shared_memory() {
    let port = common::free_port();
    let reader = common::node(46, 46, port, json!({"cluster_secret": common::secret()}));
    let client_port = common::free_port();
    let exe = env!("CARGO_BIN_EXE_peercache-node");
    let seed = format!("127.0.0.46:{port}");
    let mut owner = common::node_process(
        exe,
        &["--discovery-addr", &seed, "--host", "127.0.0.47"],
        &[
            "node_id=shm-owner",
            "protocol=tcp",
            "global_segment_size=64mb",
            "heartbeat_interval=0.2",
            "member_ttl=0.6",
        ],
        client_port,
    );
    assert!(reader.wait_members(2, Duration::from_secs(15)));
    reader.sync_membership();
    let c = Client::new(
        format!("127.0.0.47:{client_port}").parse().unwrap(),
        auth(),
        Duration::from_secs(5),
    );
    let len = 80 << 10;
    let keys: Vec<String> = (0..64).map(|i| format!("xproc/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..64).map(|i| common::page(900 + i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    assert!(c.put(&keys, &refs).unwrap().iter().all(|s| *s));

    // The pages live in the other process's pool. The first read goes over TCP and attaches;
    // then this node copies them out of the owner's memory file. (Readable once the owner's
    // ring lists the reader, a heartbeat at most: its shard hands the entries over then.)
    common::wait_until(
        "the owner's pages readable",
        Duration::from_secs(10),
        || common::get(&reader, &keys, len).0.iter().all(|&h| h),
    );
    let (hits, got) = common::get(&reader, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == pages);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while reader.cluster_view()["transport"]["local_peers"] != 1 {
        assert!(std::time::Instant::now() < until, "never attached");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (hits, got) = common::get(&reader, &keys, len);
    assert!(hits.iter().all(|&h| h), "{hits:?}");
    assert!(got == pages, "a page read through shared memory differs");
    let local = reader.stats().transport_local_read_bytes;
    assert!(local >= 64 * len as u64, "local bytes {local}");

    // The owner dies: the kernel closes its lease, the reader drops the mapping (and with it
    // the dead process's memory) without reading again, and no page is served from it.
    owner.0.kill().unwrap();
    owner.0.wait().unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while reader.cluster_view()["transport"]["local_peers"] != 0 {
        assert!(
            std::time::Instant::now() < until,
            "mapping kept after the owner died"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (hits, _) = common::get(&reader, &keys, len);
    assert!(hits.iter().all(|&h| !h), "{hits:?}");
    assert_eq!(reader.stats().transport_local_read_bytes, local);
    reader.shutdown();
}

#[test]
fn a_client_cannot_replace_a_page_another_node_holds_with_other_bytes() {
    let port = common::free_port();
    let extra = json!({"client_enabled": true, "cluster_secret": common::secret()});
    let a = common::node(48, 48, port, extra);
    let (client_port, metrics_port) = (common::free_port(), common::free_port());
    let _c = common::Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_peercache-node"))
            .args(["--discovery-addr", &format!("127.0.0.48:{port}")])
            .args(["--host", "127.0.0.49", "--set", "node_id=forger"])
            .args(["--set", "protocol=tcp", "--set", "global_segment_size=64mb"])
            .args(["--set", "client_enabled=true"])
            .args(["--set", &format!("client_port={client_port}")])
            .args(["--set", &format!("metrics_port={metrics_port}")])
            .args(["--set", "log_level=warn"])
            .env("PEERCACHE_CLUSTER_SECRET", common::secret())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(a.wait_members(2, Duration::from_secs(15)));
    a.sync_membership();
    let timeout = Duration::from_secs(5);
    let ca = Client::new(a.client_endpoint().unwrap(), auth(), timeout);
    let cc = Client::new(
        format!("127.0.0.49:{client_port}").parse().unwrap(),
        auth(),
        timeout,
    );
    let len = 16 << 10;
    let keys: Vec<String> = (0..3).map(|i| format!("owned/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..3).map(|i| common::page(700 + i, len)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    assert!(ca.put(&keys, &refs).unwrap().iter().all(|s| *s));
    // The other process sees a's copies (a condition, not a sleep).
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while cc
        .locate(&keys)
        .map_or(true, |l| l.iter().any(|o| o.is_empty()))
    {
        assert!(std::time::Instant::now() < until, "c never saw a's pages");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Through c: two forged pages, the same bytes again, and a new key.
    let forged: Vec<Vec<u8>> = (0..2).map(|i| common::page(800 + i, len)).collect();
    let fresh = common::page(900, len);
    let batch = ["owned/0", "owned/1", "owned/2", "fresh/0"];
    let bodies: Vec<&[u8]> = vec![&forged[0], &forged[1], &pages[2], &fresh];
    assert_eq!(
        cc.put(&batch, &bodies).unwrap(),
        vec![false, false, true, true],
        "the forged pages are refused, the same bytes and a new key stored"
    );
    // Every reader, through either node, gets the original bytes. The new key is readable
    // through a once c's ring lists a (a heartbeat at most): c's shard hands it over then.
    for client in [&ca, &cc] {
        common::wait_until("every page readable", Duration::from_secs(10), || {
            client
                .get(&batch, len)
                .is_ok_and(|g| g.iter().all(Option::is_some))
        });
    }
    for (who, client) in [("a", &ca), ("c", &cc)] {
        let got = client.get(&batch, len).unwrap();
        for (i, want) in [&pages[0], &pages[1], &pages[2], &fresh]
            .into_iter()
            .enumerate()
        {
            let g = got[i]
                .as_ref()
                .unwrap_or_else(|| panic!("{who}: {} missing", batch[i]));
            assert!(
                g.bytes == *want,
                "{who}: {} is not the page first written",
                batch[i]
            );
        }
    }
    let (hits, got) = common::get(&a, &keys, len);
    assert!(hits.iter().all(|&h| h) && got == pages);
    // Counted on the node that refused them, once each.
    let text = common::scrape(&format!("127.0.0.49:{metrics_port}"));
    assert_eq!(
        common::sample_of(&text, "peercache_client_overwrites_refused_total"),
        2.0
    );
    a.shutdown();
}

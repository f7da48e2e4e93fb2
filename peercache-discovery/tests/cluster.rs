//! Discovery over real sockets: five nodes, each on its own 127.0.0.N, sharing one meta port.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use peercache_discovery::{
    DiscoveryClient, DiscoveryConfig, DiscoveryError, DiscoveryServer, Hosting, NodeInfo,
};
use peercache_wire::{Incarnation, NodeId};

const HB: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_millis(600);

/// A port free on 127.0.0.1 (and, in practice, on the other loopback addresses).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ip(n: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, n])
}

struct Node {
    server: Option<DiscoveryServer>,
    client: DiscoveryClient,
    id: NodeId,
}

fn start_node(n: u8, port: u16, seeds: &[u8], incarnation: u64) -> Node {
    let meta = SocketAddr::new(ip(n), port);
    let server =
        match DiscoveryServer::try_host(meta, TTL, None, peercache_wire::Auth::none()).unwrap() {
            Hosting::Hosting(s) => Some(s),
            Hosting::PortTaken => None,
        };
    let id = NodeId::new(format!("node-{n}")).unwrap();
    let info = NodeInfo {
        node: id.clone(),
        incarnation: Incarnation(incarnation),
        host: ip(n),
        meta: server.as_ref().map(|s| s.local_addr()),
        control: SocketAddr::new(ip(n), 1000 + n as u16),
        data: vec![SocketAddr::new(ip(n), 2000 + n as u16)],
        role: "inference".into(),
        attrs: vec![],
    };
    let client = DiscoveryClient::start(
        info,
        DiscoveryConfig {
            seeds: seeds
                .iter()
                .map(|s| SocketAddr::new(ip(*s), port))
                .collect(),
            heartbeat: HB,
            max_masters: 3,
            rpc_timeout: Duration::from_millis(300),
            auth: peercache_wire::Auth::none(),
        },
    )
    .unwrap();
    Node { server, client, id }
}

fn ids(c: &DiscoveryClient) -> Vec<String> {
    c.members().iter().map(|m| m.node.to_string()).collect()
}

fn all_see(nodes: &[&Node], n: usize, within: Duration) -> bool {
    nodes
        .iter()
        .all(|x| x.client.wait_for(within, |m| m.len() == n))
}

#[test]
fn five_nodes_converge_then_survive_a_master_crash() {
    let port = free_port();
    let nodes: Vec<Node> = (2..=6).map(|n| start_node(n, port, &[2], 1)).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        all_see(&refs, 5, Duration::from_secs(5)),
        "{:?}",
        ids(&nodes[0].client)
    );
    let m = |n: u8| SocketAddr::new(ip(n), port);
    let agree = |nodes: &[&Node], want: &[SocketAddr]| {
        nodes.iter().all(|x| {
            let deadline = Instant::now() + Duration::from_secs(3);
            while x.client.masters() != want && Instant::now() < deadline {
                x.client.wait_for(HB, |_| false);
            }
            x.client.masters() == want
        })
    };
    assert!(agree(&refs, &[m(2), m(3), m(4)]));
    // Crash the master on .3: its server stops, its client goes silent without deregistering.
    let mut nodes = nodes;
    let mut crashed = nodes.remove(1);
    let t0 = Instant::now();
    crashed.client.abandon();
    crashed.server.as_mut().unwrap().shutdown();
    let survivors: Vec<&Node> = nodes.iter().collect();
    assert!(
        all_see(&survivors, 4, TTL + 4 * HB),
        "crash not detected in time"
    );
    let detect = t0.elapsed();
    assert!(agree(&survivors, &[m(2), m(4), m(5)]));
    let converge = t0.elapsed();
    eprintln!(
        "master crash: dropped by every survivor after {detect:?}, masters re-derived after {converge:?} (TTL {TTL:?}, heartbeat {HB:?})"
    );
    assert!(
        detect <= TTL + 2 * HB + Duration::from_millis(300),
        "{detect:?}"
    );
}

#[test]
fn a_clean_stop_is_seen_within_about_one_heartbeat() {
    let port = free_port();
    let nodes: Vec<Node> = (2..=5).map(|n| start_node(n, port, &[2], 1)).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(all_see(&refs, 4, Duration::from_secs(5)));
    let t0 = Instant::now();
    nodes[3].client.shutdown();
    let rest: Vec<&Node> = nodes[..3].iter().collect();
    assert!(all_see(&rest, 3, 3 * HB));
    let took = t0.elapsed();
    eprintln!("clean stop: dropped by every peer after {took:?} (heartbeat {HB:?})");
    // Goal: one heartbeat; the bound leaves room for a loaded 2-core CI machine.
    assert!(took <= 3 * HB + Duration::from_millis(300), "{took:?}");
}

#[test]
fn a_node_started_before_any_meta_joins_once_one_appears() {
    let port = free_port();
    // Node .8 knows only the seed .7, where nothing runs yet; its own server is not a seed.
    let early = start_node(8, port, &[7], 1);
    let err = early
        .client
        .wait_ready(Some(Duration::from_millis(400)))
        .unwrap_err();
    assert!(matches!(err, DiscoveryError::NotReady { .. }), "{err}");
    assert!(!early.client.is_ready());
    let seed = start_node(7, port, &[7], 1);
    early
        .client
        .wait_ready(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(all_see(&[&early, &seed], 2, Duration::from_secs(5)));
}

#[test]
fn a_pinned_head_leads_even_with_the_highest_address() {
    let port = free_port();
    let nodes: Vec<Node> = [12u8, 10, 11, 13]
        .iter()
        .map(|&n| start_node(n, port, &[13], 1))
        .collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(all_see(&refs, 4, Duration::from_secs(5)));
    let want = vec![
        SocketAddr::new(ip(13), port),
        SocketAddr::new(ip(10), port),
        SocketAddr::new(ip(11), port),
    ];
    for n in &nodes {
        assert!(
            n.client
                .wait_for(Duration::from_secs(3), |_| n.client.masters() == want)
                || n.client.masters() == want
        );
    }
}

#[test]
fn a_restart_with_the_same_id_is_a_new_incarnation() {
    let port = free_port();
    let a = start_node(20, port, &[20], 1);
    let mut b = start_node(21, port, &[20], 1);
    assert!(all_see(&[&a, &b], 2, Duration::from_secs(5)));
    b.client.abandon();
    b.server.as_mut().unwrap().shutdown();
    drop(b);
    let b2 = start_node(21, port, &[20], 2);
    let seen_new = a.client.wait_for(Duration::from_secs(5), |m| {
        m.iter()
            .any(|i| i.node.as_str() == "node-21" && i.incarnation == Incarnation(2))
    });
    assert!(seen_new, "{:?}", a.client.members());
    assert_eq!(b2.id.as_str(), "node-21");
}

#[test]
fn a_second_rank_on_the_same_host_is_a_client_only() {
    let port = free_port();
    let a = start_node(30, port, &[30], 1);
    let meta = SocketAddr::new(ip(30), port);
    assert!(a.server.is_some());
    assert!(matches!(
        DiscoveryServer::try_host(meta, TTL, None, peercache_wire::Auth::none()).unwrap(),
        Hosting::PortTaken
    ));
}

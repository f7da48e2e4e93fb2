//! Membership through a real etcd (Debian's `etcd` binary, see `scripts/etcd.sh`): members
//! join, a crashed one leaves when its lease expires, a clean stop leaves at once, an etcd
//! restart keeps the membership (stale meanwhile) and resumes it, etcd's authentication is
//! used, and entries no member could have written are refused.
#![cfg(feature = "etcd")]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use peercache_discovery::{DiscoveryError, EtcdClient, EtcdConfig, NodeInfo};
use peercache_wire::testkit::etcd::EtcdServer;
use peercache_wire::{Incarnation, NodeId};

fn info(n: u8) -> NodeInfo {
    let host = IpAddr::from([127, 0, 0, n]);
    NodeInfo {
        node: NodeId::new(format!("etcd-node-{n}")).unwrap(),
        incarnation: Incarnation::fresh(),
        host,
        meta: None,
        control: SocketAddr::new(host, 7000),
        data: vec![SocketAddr::new(host, 7001)],
        role: "inference".into(),
        attrs: vec![("tp_rank".into(), "0".into())],
    }
}

fn cfg(etcd: &EtcdServer, prefix: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![etcd.url()],
        prefix: prefix.into(),
        lease_ttl: Duration::from_secs(2),
        heartbeat: Duration::from_millis(300),
        rpc_timeout: Duration::from_secs(1),
        ..EtcdConfig::default()
    }
}

fn names(c: &EtcdClient) -> Vec<String> {
    c.members()
        .iter()
        .map(|m| m.node.as_str().to_string())
        .collect()
}

#[test]
fn members_join_and_a_clean_stop_leaves_at_once() {
    let etcd = EtcdServer::start("127.0.0.1");
    let members: Vec<EtcdClient> = (1..=3)
        .map(|n| EtcdClient::start(info(n), cfg(&etcd, "/t1")).unwrap())
        .collect();
    for m in &members {
        m.wait_ready(Some(Duration::from_secs(10))).unwrap();
    }
    for m in &members {
        assert!(
            m.wait_for(Duration::from_secs(10), |v| v.len() == 3),
            "{:?}",
            names(m)
        );
    }
    // What a member announced is what the others see, field for field.
    let seen = members[0].members();
    let two = seen.iter().find(|m| m.host == info(2).host).unwrap();
    assert_eq!(two.control, info(2).control);
    assert_eq!(two.data, info(2).data);

    let events = members[0].subscribe();
    let t0 = Instant::now();
    members[2].shutdown();
    assert!(members[0].wait_for(Duration::from_secs(5), |v| v.len() == 2));
    // Revoked, not expired: well inside the 2 s lease.
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    let left = events.recv_timeout(Duration::from_secs(1)).unwrap();
    assert!(
        matches!(left, peercache_discovery::Event::Left(ref i) if i.host == info(3).host),
        "{left:?}"
    );
    // A separate prefix is a separate cluster.
    let other = EtcdClient::start(info(9), cfg(&etcd, "/t1-other")).unwrap();
    other.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(names(&other), vec!["etcd-node-9"]);
    assert_eq!(members[0].members().len(), 2);
}

#[test]
fn a_crashed_member_leaves_when_its_lease_expires() {
    let etcd = EtcdServer::start("127.0.0.1");
    let a = EtcdClient::start(info(1), cfg(&etcd, "/t2")).unwrap();
    let b = EtcdClient::start(info(2), cfg(&etcd, "/t2")).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 2));
    let t0 = Instant::now();
    b.abandon(); // no revoke: the key stays until the lease runs out
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 1));
    let took = t0.elapsed();
    // Gone within the TTL (2 s) plus one watch round, and not before the lease could expire.
    assert!(took < Duration::from_secs(4), "left after {took:?}");
    assert!(took > Duration::from_millis(900), "left after {took:?}");
}

#[test]
fn an_etcd_restart_keeps_the_membership_stale_then_resumes_it() {
    let mut etcd = EtcdServer::start("127.0.0.1");
    let a = EtcdClient::start(info(1), cfg(&etcd, "/t3")).unwrap();
    let b = EtcdClient::start(info(2), cfg(&etcd, "/t3")).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 2));
    let before = a.members();

    etcd.kill();
    let until = Instant::now() + Duration::from_secs(10);
    while !(a.is_stale() && b.is_stale()) {
        assert!(Instant::now() < until, "never marked stale");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The last membership is kept while etcd is away.
    assert_eq!(a.members(), before);

    etcd.restart();
    let until = Instant::now() + Duration::from_secs(15);
    while a.is_stale() || b.is_stale() {
        assert!(Instant::now() < until, "never resumed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(a.wait_for(Duration::from_secs(5), |v| v.len() == 2));
    // The same lives: nobody left and came back.
    let after = a.members();
    assert_eq!(
        after.iter().map(|m| m.incarnation).collect::<Vec<_>>(),
        before.iter().map(|m| m.incarnation).collect::<Vec<_>>()
    );
    // And the watch works again: a newcomer is seen.
    let c = EtcdClient::start(info(3), cfg(&etcd, "/t3")).unwrap();
    c.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 3));
}

#[test]
fn etcd_authentication_is_used_and_a_wrong_password_is_a_typed_error() {
    let etcd = EtcdServer::start("127.0.0.1");
    etcd.enable_auth("root-pw-1", "pc", "pc-pw-1", "/t4/");
    let with = |user: Option<(&str, &str)>| EtcdConfig {
        user: user.map(|(u, p)| (u.to_string(), p.to_string())),
        rpc_timeout: Duration::from_millis(500),
        ..cfg(&etcd, "/t4")
    };
    let a = EtcdClient::start(info(1), with(Some(("pc", "pc-pw-1")))).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    let b = EtcdClient::start(info(2), with(Some(("pc", "pc-pw-1")))).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 2));

    for user in [Some(("pc", "wrong")), None] {
        let t0 = Instant::now();
        let c = EtcdClient::start(info(3), with(user)).unwrap();
        let err = c.wait_ready(Some(Duration::from_secs(2))).unwrap_err();
        assert!(matches!(err, DiscoveryError::EtcdNotReady { .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(4));
        drop(c);
    }
    assert_eq!(a.members().len(), 2);
}

#[test]
fn entries_no_member_could_have_written_are_refused() {
    let etcd = EtcdServer::start("127.0.0.1");
    let a = EtcdClient::start(info(1), cfg(&etcd, "/t5")).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    // Garbage, another member's announcement under a third key, and a sibling key outside
    // the members range: none of it becomes a member, and the watch goes on.
    etcd.put_raw(b"/t5/members/garbage", b"\x00\xffnot json", None);
    let mut forged = info(2);
    forged.node = NodeId::new("etcd-node-1").unwrap();
    etcd.put_raw(
        b"/t5/members/etcd-node-7",
        &serde_json::to_vec(&forged).unwrap(),
        None,
    );
    etcd.put_raw(b"/t5/other", &serde_json::to_vec(&info(4)).unwrap(), None);
    let b = EtcdClient::start(info(2), cfg(&etcd, "/t5")).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 2));
    assert_eq!(names(&a), vec!["etcd-node-1", "etcd-node-2"]);
    assert_eq!(names(&b), vec!["etcd-node-1", "etcd-node-2"]);
    // a's own entry was not replaced by the forged one.
    assert_eq!(a.members()[0].host, info(1).host);
}

#[test]
fn tls_to_etcd_with_a_client_certificate() {
    let etcd = EtcdServer::start_tls("127.0.0.1");
    let files = etcd.tls().unwrap().clone();
    let with = |tls: Option<peercache_discovery::EtcdTls>| EtcdConfig {
        tls,
        rpc_timeout: Duration::from_millis(500),
        ..cfg(&etcd, "/t6")
    };
    let full = peercache_discovery::EtcdTls {
        ca_file: files.ca.clone(),
        cert_file: Some(files.client_cert.clone()),
        key_file: Some(files.client_key.clone()),
        domain: None,
    };
    let a = EtcdClient::start(info(1), with(Some(full.clone()))).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    let b = EtcdClient::start(info(2), with(Some(full.clone()))).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    assert!(a.wait_for(Duration::from_secs(10), |v| v.len() == 2));

    // Without a client certificate etcd refuses the connection: never ready, a typed error.
    let no_cert = peercache_discovery::EtcdTls {
        cert_file: None,
        key_file: None,
        ..full.clone()
    };
    let c = EtcdClient::start(info(3), with(Some(no_cert))).unwrap();
    assert!(matches!(
        c.wait_ready(Some(Duration::from_secs(2))),
        Err(DiscoveryError::EtcdNotReady { .. })
    ));
    drop(c);
    // A CA that did not sign etcd's certificate: the server is not trusted.
    let wrong_ca = peercache_discovery::EtcdTls {
        ca_file: files.client_cert.clone(),
        ..full.clone()
    };
    let d = EtcdClient::start(info(4), with(Some(wrong_ca))).unwrap();
    assert!(d.wait_ready(Some(Duration::from_secs(2))).is_err());
    drop(d);
    // A file that cannot be read is an error at start, naming the file.
    let missing = peercache_discovery::EtcdTls {
        ca_file: "/nonexistent/ca.pem".into(),
        ..full
    };
    let err = EtcdClient::start(info(5), with(Some(missing))).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    assert_eq!(a.members().len(), 2);
}

//! An authenticated cluster on loopback: nodes with the secret work together; a process with
//! a wrong (or no) secret can neither join, read, write nor query the directory; and even an
//! authenticated peer cannot write into published memory.

use std::net::SocketAddr;
use std::time::Duration;

use peercache_directory::DirRequest;
use peercache_store::{PeerCacheConfig, Store, StoreError};
use peercache_transport::{Access, Transport, TransportConfig, TransportError};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Auth, Incarnation, WireError, envelope};
use serde_json::json;

const SECRET: &str = "correct horse battery staple 42";

mod common;
use common::free_port;

/// A node on 127.0.0.`n` seeded by 127.0.0.20, with `secret` (or none).
fn cfg(n: u8, port: u16, secret: Option<&str>) -> PeerCacheConfig {
    let extra = match secret {
        Some(s) => json!({ "cluster_secret": s }),
        // Explicitly open (the shared helper would give every node the test secret).
        None => json!({ "cluster_secret": "" }),
    };
    common::config(&format!("127.0.0.{n}"), "127.0.0.20", port, extra)
}

fn transport(auth: Auth) -> Transport {
    Transport::start(
        TransportConfig {
            op_timeout: Duration::from_secs(1),
            auth,
            ..TransportConfig::default()
        },
        None,
    )
    .unwrap()
}

fn unauthenticated(e: &TransportError) -> bool {
    matches!(
        e,
        TransportError::Connect {
            source: WireError::Unauthenticated(_),
            ..
        }
    )
}

#[test]
fn only_holders_of_the_secret_join_read_write_and_query() {
    let port = free_port();
    let a = Store::start(cfg(20, port, Some(SECRET))).unwrap();
    let b = Store::start(cfg(21, port, Some(SECRET))).unwrap();
    a.wait_ready(Some(Duration::from_secs(10))).unwrap();
    b.wait_ready(Some(Duration::from_secs(10))).unwrap();
    // Both views, not only A's: B reads through its own ring.
    common::settle(&[&a, &b]);

    // The secret holders work together.
    let keys: Vec<String> = (0..8).map(|i| format!("auth-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i ^ 0x5a; 16 << 10]).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    common::assert_reads_back(&b, &keys, &pages);

    // A node with the wrong secret never joins: discovery refuses it.
    let mallory = Store::start(cfg(22, port, Some("a different secret, same length"))).unwrap();
    let joined = mallory.wait_ready(Some(Duration::from_millis(1500)));
    assert!(
        matches!(joined, Err(StoreError::Discovery(_))),
        "{joined:?}"
    );
    assert_eq!(a.members().len(), 2, "the stranger must not be a member");
    mallory.shutdown();
    // Nor does a node with no secret at all.
    let open = Store::start(cfg(23, port, None)).unwrap();
    assert!(open.wait_ready(Some(Duration::from_millis(1500))).is_err());
    open.shutdown();

    // Where the page lives, as the cluster knows it.
    let loc = a.locate(&keys[..1]).unwrap()[0].clone().expect("located");
    let loc = &loc[0];
    let rail = loc.rails[0];
    let len = 64 + loc.len;
    // One op: the page's slot (header + payload) and the start of `h`.
    let the_page =
        |h: &peercache_transport::RegionHandle| common::one_op(rail.region, loc.addr, len, h);
    let read = |t: &Transport, into: &mut Vec<u8>| {
        // SAFETY: the buffer outlives the handle, which is dropped before it.
        let h = unsafe { t.register(into.as_mut_ptr(), into.len(), Access::LocalOnly) }.unwrap();
        let batch = the_page(&h);
        t.read_batch(rail.endpoint, &batch)
    };

    // Data plane: the right secret reads the page (header + payload) one-sided ...
    let friend = transport(Auth::from_secret(SECRET.as_bytes()).unwrap());
    let mut buf = vec![0u8; len as usize];
    let r = read(&friend, &mut buf).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(&buf[64..], pages[0].as_slice());
    // ... but may not write into the published pool (remote-read only).
    // SAFETY: the buffer outlives the handle, which is dropped before it.
    let h = unsafe { friend.register(buf.as_mut_ptr(), buf.len(), Access::LocalOnly) }.unwrap();
    let w = the_page(&h);
    let wr = friend.write_batch(rail.endpoint, &w).unwrap();
    assert!(
        matches!(wr[0], Err(peercache_transport::OpError::AccessDenied(_))),
        "{wr:?}"
    );
    drop(h);

    // Strangers: wrong secret and no secret fail in the handshake, typed.
    for auth in [
        Auth::from_secret(b"a different secret, same length").unwrap(),
        Auth::none(),
    ] {
        let t = transport(auth.clone());
        let mut buf = vec![0u8; len as usize];
        let e = read(&t, &mut buf).unwrap_err();
        assert!(unauthenticated(&e), "{e:?}");
        assert!(buf.iter().all(|&b| b == 0), "no byte may reach a stranger");
        // SAFETY: the buffer outlives the handle, which is dropped before it.
        let h = unsafe { t.register(buf.as_mut_ptr(), buf.len(), Access::LocalOnly) }.unwrap();
        let w = the_page(&h);
        let e = t.write_batch(rail.endpoint, &w).unwrap_err();
        assert!(unauthenticated(&e), "{e:?}");
        drop(h);

        // Control plane: the directory does not answer.
        let client = RpcClient::new(rpc::ClientConfig {
            hello: Hello::new(Plane::Control, None, Incarnation::fresh()),
            max_idle_per_peer: 1,
            max_frame: 1 << 20,
            auth,
        });
        let req = envelope::encode(
            &DirRequest::Lookup(std::borrow::Cow::Owned(vec![
                peercache_wire::PageKey::from_key("x"),
            ])),
            &[],
        )
        .unwrap();
        let control: SocketAddr = a.control_endpoint();
        let e = client
            .call(control, &req, Duration::from_secs(1))
            .unwrap_err();
        assert!(matches!(e, WireError::Unauthenticated(_)), "{e:?}");
    }

    // The members still serve each other after the attempts.
    let mut out2 = vec![0u8; 16 << 10];
    assert!(b.batch_get(&keys[1..2], &mut [&mut out2[..]]).unwrap()[0]);
    assert_eq!(out2, pages[1]);
    b.shutdown();
    a.shutdown();
}

#[test]
fn secret_from_a_file_and_weak_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("secret");
    std::fs::write(&f, format!("{SECRET}\n")).unwrap();
    let port = free_port();
    let mut c = cfg(24, port, None);
    c.cluster_secret_file = f.display().to_string();
    assert!(c.cluster_auth().unwrap().is_enabled());
    c.cluster_secret_file = dir.path().join("missing").display().to_string();
    assert!(c.cluster_auth().is_err());
    let m = json!({"discovery_addr": "127.0.0.1:1", "cluster_secret": "short"});
    let e = PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap_err();
    assert!(e.to_string().contains("cluster_secret"), "{e}");
    assert!(
        !e.to_string().contains("short"),
        "errors must not echo the secret: {e}"
    );
    let (full, _) = PeerCacheConfig::from_map(
        json!({"discovery_addr": "127.0.0.1:1", "cluster_secret": SECRET})
            .as_object()
            .unwrap(),
    )
    .unwrap();
    assert!(!format!("{full:?}").contains("battery"));
}

/// A tool whose handshake the cluster refuses says so, and how to fix it — at once, not after
/// its wait: `status` and `drive` without the secret (real `peercache-node` processes of the
/// tool, against a node that has one).
#[test]
fn a_tool_without_the_secret_is_told_it_is_not_authenticated_and_how_to_fix_it() {
    let port = free_port();
    // Its own address: the other tests of this file run beside it on 127.0.0.20–22.
    let node = Store::start(common::config(
        "127.0.0.23",
        "127.0.0.23",
        port,
        json!({ "cluster_secret": SECRET }),
    ))
    .unwrap();
    node.wait_ready(Some(Duration::from_secs(10))).unwrap();
    let seed = format!("127.0.0.23:{port}");
    // The library call: a typed refusal.
    let seeds: Vec<SocketAddr> = vec![seed.parse().unwrap()];
    let e = peercache_store::tools::status::members(&seeds, Duration::from_secs(2), Auth::none())
        .unwrap_err();
    assert!(e.is::<peercache_store::tools::status::Refused>(), "{e:#}");
    // The binaries: a clear line on stderr, a failing exit code, no long wait.
    for args in [
        vec![
            "status",
            "--discovery-addr",
            seed.as_str(),
            "--timeout",
            "2",
        ],
        vec![
            "drive",
            "--discovery-addr",
            seed.as_str(),
            "--write-on",
            "n23",
            "--wait",
            "30",
        ],
        vec![
            "locate",
            "--discovery-addr",
            seed.as_str(),
            "--timeout",
            "2",
            "some-key",
        ],
    ] {
        let t0 = std::time::Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_peercache-node"))
            .args(&args)
            .env_remove("PEERCACHE_CLUSTER_SECRET")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains("not authenticated"), "{args:?}: {err}");
        assert!(err.contains("PEERCACHE_CLUSTER_SECRET"), "{args:?}: {err}");
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "{args:?} took {:?}",
            t0.elapsed()
        );
    }
    node.shutdown();
}

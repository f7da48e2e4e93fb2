//! Per-node credentials in a real cluster: keys and certificates made by the real
//! `peercache-node cert` tool; nodes that require certificates join and serve each other; a
//! secret holder with a certificate of its own cannot open a connection that names another
//! member; a node whose certificate does not cover its id does not start.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use peercache_discovery::{DiscReply, DiscRequest};
use peercache_store::{Store, StoreError};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::identity::{Identity, NodeCert, SigningKey, public_key_from_text};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Auth, Incarnation, NodeId, WireError, envelope};
use serde_json::json;

mod common;
use common::free_port;

fn cert_tool(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_peercache-node"))
        .arg("cert")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The key, certificate and cluster public key files of `name` under `dir`, as config keys.
fn files(dir: &Path, name: &str) -> serde_json::Value {
    json!({
        "node_key_file": dir.join(format!("{name}.key")).display().to_string(),
        "node_cert_file": dir.join(format!("{name}.cert")).display().to_string(),
        "cluster_ca_file": dir.join("cluster.pub").display().to_string(),
        "require_node_certificates": true,
        "node_id": name,
        "host_local": false,
    })
}

/// A discovery connection whose Hello names `claim`, proving `identity` (if any).
fn member(claim: &str, auth: Auth) -> RpcClient {
    RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(
            Plane::Discovery,
            Some(NodeId::new(claim).unwrap()),
            Incarnation(9),
        ),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth,
    })
}

fn members_via(c: &RpcClient, at: std::net::SocketAddr) -> Result<DiscReply, WireError> {
    let f = envelope::encode(&DiscRequest::Members, &[]).unwrap();
    rpc::decode_reply::<DiscReply>(&c.call(at, &f, Duration::from_secs(3))?)
}

#[test]
fn members_prove_their_ids_and_none_can_speak_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ds = d.display().to_string();
    cert_tool(&["init", "--out", &ds]);
    for name in ["cert-a", "cert-b", "cert-m"] {
        cert_tool(&[
            "issue",
            "--cluster-key",
            &d.join("cluster.key").display().to_string(),
            "--subject",
            name,
            "--out",
            &ds,
            "--name",
            name,
        ]);
    }
    // The cluster key is private to its owner; it is never given to a node.
    let mode = std::fs::metadata(d.join("cluster.key"))
        .unwrap()
        .permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077, 0);

    let port = free_port();
    let a = common::node(183, 183, port, files(d, "cert-a"));
    let b = common::node(184, 183, port, files(d, "cert-b"));
    assert!(
        a.wait_members(2, Duration::from_secs(10)) && b.wait_members(2, Duration::from_secs(10))
    );
    let keys: Vec<String> = (0..8).map(|i| format!("cert-page-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8u64)
        .map(|i| peercache_wire::testkit::pattern(i, 32 << 10))
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    common::assert_reads_back(&b, &keys, &pages);

    // Mallory holds the secret and a certificate of this cluster, for cert-m.
    let read = |f: &str| std::fs::read_to_string(d.join(f)).unwrap();
    let cluster = public_key_from_text(&read("cluster.pub")).unwrap();
    let mallory_id = || {
        Identity::new(
            Some((
                SigningKey::from_text(&read("cert-m.key")).unwrap(),
                NodeCert::from_text(&read("cert-m.cert")).unwrap(),
            )),
            cluster,
            false,
        )
        .unwrap()
    };
    let secret = Auth::from_secret(common::secret().as_bytes()).unwrap();
    let meta: std::net::SocketAddr = format!("127.0.0.183:{port}").parse().unwrap();
    // As herself she is served.
    assert!(members_via(&member("cert-m", secret.with_identity(mallory_id())), meta).is_ok());
    // Naming cert-b with her own certificate: refused at the handshake.
    let e = members_via(&member("cert-b", secret.with_identity(mallory_id())), meta).unwrap_err();
    assert!(
        matches!(e, WireError::Unauthenticated(ref r) if r.contains("does not cover")),
        "{e:?}"
    );
    // Naming cert-b with no certificate: refused too.
    let e = members_via(&member("cert-b", secret.clone()), meta).unwrap_err();
    assert!(matches!(e, WireError::Unauthenticated(_)), "{e:?}");
    // cert-b's entry is still cert-b's own.
    assert!(a.members().iter().any(|m| m.node.as_str() == "cert-b"));

    // A node whose certificate does not cover its id does not start, and says why.
    let mut wrong = files(d, "cert-m");
    wrong["node_id"] = "cert-z".into();
    let cfg = common::config("127.0.0.185", "127.0.0.183", port, wrong);
    match Store::start(cfg) {
        Err(StoreError::Config(e)) => assert!(e.to_string().contains("node_cert_file"), "{e}"),
        other => panic!("expected a config error, got {:?}", other.map(|_| ())),
    }
    b.shutdown();
    a.shutdown();
}

//! The authentication and encryption rules a config must meet before a node starts.

use super::*;

#[test]
fn a_node_without_a_secret_starts_only_on_loopback_or_when_declared_insecure() {
    let cfg = |extra: serde_json::Value| {
        let mut m = serde_json::json!({"discovery_addr": "127.0.0.1:7000"});
        for (k, v) in extra.as_object().unwrap() {
            m[k] = v.clone();
        }
        PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap().0
    };
    let check = |c: &PeerCacheConfig| c.check_authentication(&c.cluster_auth().unwrap());
    let loopback = serde_json::json!({
        "local_hostname": "127.0.0.2", "rdma_bind_host": "127.0.0.2",
        "control_bind_host": "127.0.0.2", "meta_bind_host": "localhost",
    });
    // Loopback only: starts, with one warning.
    let w = check(&cfg(loopback.clone())).unwrap().unwrap();
    assert!(w.contains("loopback only"), "{w}");
    // The default wildcard binds reach every interface: refused, naming the fix.
    let e = check(&cfg(serde_json::json!({}))).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, ConfigError::Unauthenticated { .. }));
    assert!(
        msg.contains("cluster_secret") && msg.contains("insecure = true"),
        "{msg}"
    );
    assert!(msg.contains("rdma_bind_host = 0.0.0.0"), "{msg}");
    // A seed on another host counts too.
    let mut remote_seed = loopback.clone();
    remote_seed["discovery_addr"] = "127.0.0.1:7000,10.1.2.3:7000".into();
    assert!(check(&cfg(remote_seed)).is_err());
    // The explicit opt-out starts, and says so.
    let w = check(&cfg(serde_json::json!({"insecure": true})))
        .unwrap()
        .unwrap();
    assert!(w.contains("insecure = true"), "{w}");
    // An accepted secret without a secret of its own would be an open node: refused.
    let mut accept_only = loopback.clone();
    accept_only["cluster_secret_accept"] = "sixteen-byte-secret!".into();
    let e = check(&cfg(accept_only)).unwrap_err();
    assert!(e.to_string().contains("cluster_secret_accept"), "{e}");
    // With a secret: nothing to say, wherever it listens.
    let c = cfg(serde_json::json!({"cluster_secret": "sixteen-byte-secret!"}));
    assert_eq!(check(&c).unwrap(), None);
}

#[test]
fn encryption_in_transit_needs_a_secret_and_the_client_port_requires_it_too() {
    use peercache_wire::seal::Sealing;
    let cfg = |mut j: Value| {
        j["discovery_addr"] = "127.0.0.1:7000".into();
        PeerCacheConfig::from_map(&map(j)).unwrap().0
    };
    let e = cfg(serde_json::json!({"encrypt_in_transit": true}))
        .cluster_auth()
        .unwrap_err();
    assert!(e.to_string().contains("encrypt_in_transit"), "{e}");
    let on = cfg(serde_json::json!({
        "encrypt_in_transit": true, "cluster_secret": "sixteen-byte-secret!",
    }));
    assert!(on.cluster_auth().unwrap().seals());
    assert!(on.client_auth().unwrap().seals());
    let off = cfg(serde_json::json!({
        "cluster_secret": "sixteen-byte-secret!", "encrypt_in_transit": "off",
    }));
    assert_eq!(off.cluster_auth().unwrap().sealing(), Sealing::Offer);
    // `auto` (the default): sealed with every peer that can when reachable beyond loopback,
    // only on request on loopback; without a secret it is no error.
    let beyond = cfg(serde_json::json!({"cluster_secret": "sixteen-byte-secret!"}));
    assert_eq!(beyond.cluster_auth().unwrap().sealing(), Sealing::Prefer);
    let loopback = cfg(serde_json::json!({
        "cluster_secret": "sixteen-byte-secret!", "local_hostname": "127.0.0.2",
        "rdma_bind_host": "127.0.0.2", "control_bind_host": "127.0.0.2",
        "meta_bind_host": "127.0.0.2",
    }));
    assert_eq!(loopback.cluster_auth().unwrap().sealing(), Sealing::Offer);
    assert!(
        !cfg(serde_json::json!({}))
            .cluster_auth()
            .unwrap()
            .is_enabled()
    );
    let e = PeerCacheConfig::from_map(&map(serde_json::json!({
        "discovery_addr": "127.0.0.1:7000", "encrypt_in_transit": "sometimes",
    })))
    .unwrap_err();
    assert!(e.to_string().contains("encrypt_in_transit"), "{e}");
}

#[test]
fn node_certificates_need_their_files_together_a_cluster_key_and_a_secret() {
    let cfg = |mut j: Value| {
        j["discovery_addr"] = "127.0.0.1:7000".into();
        PeerCacheConfig::from_map(&map(j)).unwrap().0
    };
    let secret = "sixteen-byte-secret!";
    let err = |j: Value| cfg(j).cluster_auth().unwrap_err().to_string();
    let e = err(serde_json::json!({"require_node_certificates": true}));
    assert!(e.contains("cluster_secret"), "{e}");
    let e = err(serde_json::json!({"cluster_secret": secret, "require_node_certificates": true}));
    assert!(e.contains("cluster_ca_file"), "{e}");
    let e = err(serde_json::json!({"cluster_secret": secret, "node_key_file": "/k"}));
    assert!(e.contains("node_cert_file"), "{e}");
    let e = err(serde_json::json!({
        "cluster_secret": secret, "cluster_ca_file": "/nonexistent/cluster.pub",
    }));
    assert!(e.contains("cluster_ca_file"), "{e}");
    // A cluster key file that is not one: a typed error naming the key.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("cluster.pub");
    std::fs::write(&bad, "not a key").unwrap();
    let e = err(serde_json::json!({
        "cluster_secret": secret, "cluster_ca_file": bad.display().to_string(),
    }));
    assert!(e.contains("cluster_ca_file"), "{e}");
    // With the cluster's public key alone a node checks others and proves nothing itself.
    let pk = peercache_wire::identity::SigningKey::generate()
        .unwrap()
        .public_key();
    std::fs::write(&bad, peercache_wire::identity::public_key_to_text(&pk)).unwrap();
    let auth = cfg(serde_json::json!({
        "cluster_secret": secret, "cluster_ca_file": bad.display().to_string(),
        "require_node_certificates": true,
    }))
    .cluster_auth()
    .unwrap();
    let id = auth.identity().expect("an identity");
    assert!(id.requires() && id.cert().is_none());
}

//! Encryption in transit in a real cluster: nodes that require it and a node that only offers
//! it join, publish and read each other's pages byte-exact, and a client reads through the
//! client API, every connection sealed. (What the path sees is tested where a proxy can sit
//! in the middle: `peercache-wire/tests/sealed.rs`, `peercache-transport/tests/sealed.rs`.)

use std::time::Duration;

use peercache_store::client::Client;
use peercache_wire::Auth;
use serde_json::json;

mod common;
use common::free_port;

#[test]
fn a_cluster_that_requires_encryption_joins_publishes_and_reads_byte_exact() {
    let port = free_port();
    // The reads cross TCP as between hosts (not the same-host shared memory).
    let sealed = json!({ "encrypt_in_transit": true, "client_enabled": true, "host_local": false });
    let a = common::node(180, 180, port, sealed.clone());
    // B only offers sealing: every connection to or from A and C is sealed anyway.
    let b = common::node(181, 180, port, json!({ "host_local": false }));
    let c = common::node(182, 180, port, sealed);
    for n in [&a, &b, &c] {
        assert!(n.wait_members(3, Duration::from_secs(10)));
    }

    let page = 64 << 10;
    let keys: Vec<String> = (0..24).map(|i| format!("sealed-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..24u64)
        .map(|i| peercache_wire::testkit::pattern(i + 100, page))
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(
        a.batch_set(&keys[..12], &refs[..12])
            .unwrap()
            .iter()
            .all(|&x| x)
    );
    assert!(
        b.batch_set(&keys[12..], &refs[12..])
            .unwrap()
            .iter()
            .all(|&x| x)
    );
    for reader in [&a, &b, &c] {
        common::assert_reads_back(reader, &keys, &pages);
    }
    assert!(c.stats().transport_local_read_bytes == 0 && c.stats().transport_read_bytes > 0);

    // The client API of a node that requires sealing: a client that only offers it is
    // answered, sealed.
    let client = Client::new(
        a.client_endpoint().expect("client API on"),
        Auth::from_secret(common::secret().as_bytes()).unwrap(),
        Duration::from_secs(2),
    );
    let got = client.get(&keys, page).unwrap();
    for (g, p) in got.iter().zip(&pages) {
        assert_eq!(&g.as_ref().expect("found").bytes, p);
    }
    // A client that requires sealing is answered too; one without the secret is not.
    let strict = Client::new(
        a.client_endpoint().unwrap(),
        Auth::from_secret(common::secret().as_bytes())
            .unwrap()
            .requiring_encryption(true),
        Duration::from_secs(2),
    );
    assert_eq!(
        strict.get(&keys[..1], page).unwrap()[0]
            .as_ref()
            .unwrap()
            .bytes,
        pages[0]
    );
    let stranger = Client::new(
        a.client_endpoint().unwrap(),
        Auth::none(),
        Duration::from_secs(2),
    );
    assert!(stranger.get(&keys[..1], page).is_err());
    for n in [c, b, a] {
        n.shutdown();
    }
}

//! Two nodes in one process on loopback: publish pages on one, find and read them on the
//! other, byte-exact. Run with `cargo run --release -p peercache-store --example two_nodes`.

use std::time::Duration;

use anyhow::{Result, ensure};
use peercache_store::{PeerCacheConfig, Store};

/// The cluster secret both nodes prove (generated per run; in production, one value from
/// `openssl rand -hex 32` given to every node).
fn secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| peercache_wire::auth::generate_secret().expect("the OS random source"))
}

fn node(ip: &str, seed: &str) -> Result<Store> {
    let cfg = serde_json::json!({
        "discovery_addr": seed,
        "cluster_secret": secret(),
        "protocol": "tcp",
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb",
        "metrics_enabled": false,
    });
    let (cfg, _) = PeerCacheConfig::from_map(cfg.as_object().expect("an object"))?;
    let store = Store::start(cfg)?;
    store.wait_ready(Some(Duration::from_secs(10)))?;
    Ok(store)
}

fn main() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.0.1:{port}");
    let a = node("127.0.0.1", &seed)?;
    let b = node("127.0.0.2", &seed)?;
    ensure!(
        a.wait_members(2, Duration::from_secs(10)) && b.wait_members(2, Duration::from_secs(10)),
        "nodes did not meet"
    );

    let keys: Vec<String> = (0..8).map(|i| format!("example-page-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 128 << 10]).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    let stored = a.batch_set(&keys, &refs)?;
    println!(
        "{} stored {} of {} pages",
        a.node_id(),
        stored.iter().filter(|x| **x).count(),
        keys.len()
    );

    let present = b.batch_exists(&keys)?;
    let mut bufs = vec![vec![0u8; 128 << 10]; keys.len()];
    let mut dst: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
    let got = b.batch_get(&keys, &mut dst)?;
    ensure!(bufs == pages, "pages differ");
    println!(
        "{} found {present} leading pages and read {} byte-exact ({} bytes over the transport)",
        b.node_id(),
        got.iter().filter(|x| **x).count(),
        b.stats().transport_read_bytes
    );
    a.shutdown();
    b.shutdown();
    Ok(())
}

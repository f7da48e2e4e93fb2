//! A node configured the way an operator configures one: a TOML file (`examples/node.toml` by
//! default, or the path given as the first argument), then `PEERCACHE_*` environment variables,
//! then overrides — here the overrides point it at loopback so the example runs anywhere.
//! It starts, publishes a page, reads it back, prints what it resolved, and stops.
//!
//! `cargo run --release -p peercache-store --example node_from_config [-- path/to/node.toml]`

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use peercache_store::{PeerCacheConfig, Store};
use serde_json::{Map, Value, json};

fn main() -> Result<()> {
    let file = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/node.toml").to_string()
    });
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    // Loopback instead of the file's 10.0.0.x seeds, and a small pool, so it runs on a laptop.
    let overrides: Map<String, Value> = json!({
        "discovery_addr": format!("127.0.0.1:{port}"),
        "local_hostname": "127.0.0.1", "rdma_bind_host": "127.0.0.1",
        "control_bind_host": "127.0.0.1", "meta_bind_host": "127.0.0.1",
        "global_segment_size": "64mb", "metrics_port": 0,
    })
    .as_object()
    .cloned()
    .expect("an object");
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("PEERCACHE_"))
        .collect();
    let (cfg, warnings) =
        PeerCacheConfig::from_sources(None, Some(std::path::Path::new(&file)), &env, &overrides)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "from {file}: protocol {:?}, {} directory replicas, heartbeat {} s, op_timeout {} s",
        cfg.protocol, cfg.directory_replicas, cfg.heartbeat_interval, cfg.op_timeout
    );
    let store = Store::start(cfg)?;
    store.wait_ready(Some(Duration::from_secs(10)))?;
    let page: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    ensure!(
        store.batch_set(&["example-page"], &[&page[..]])?[0],
        "publish failed"
    );
    let mut back = vec![0u8; page.len()];
    ensure!(
        store.batch_get(&["example-page"], &mut [&mut back[..]])?[0],
        "read failed"
    );
    ensure!(back == page, "bytes differ");
    println!(
        "node {} published and read back a 64 KiB page; metrics at {:?}",
        store.node_id(),
        store.metrics_endpoint()
    );
    store.shutdown();
    Ok(())
}

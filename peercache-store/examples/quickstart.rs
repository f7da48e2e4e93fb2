//! One node on loopback: it hosts its own discovery server, stores a page, finds it and reads
//! it back byte-exact. docs/getting-started.md shows this file as its "From Rust" program.
//!
//! `cargo run --release -p peercache-store --example quickstart`

use std::time::Duration;

use peercache_store::{PeerCacheConfig, Store};

fn main() -> anyhow::Result<()> {
    // Every listener on loopback (the default binds 0.0.0.0) and a 64 MiB pool (the default
    // 4 GiB warms in the background after start, taking memory and cores for seconds).
    let settings = serde_json::json!({
        "discovery_addr": "127.0.0.1:31998", // this node hosts the discovery server here
        "protocol": "tcp",
        "local_hostname": "127.0.0.1",
        "rdma_bind_host": "127.0.0.1",
        "control_bind_host": "127.0.0.1",
        "meta_bind_host": "127.0.0.1",
        "metrics_bind_host": "127.0.0.1",
        "global_segment_size": "64mb",
    });
    let (cfg, warnings) = PeerCacheConfig::from_map(settings.as_object().expect("an object"))?;
    for w in warnings {
        eprintln!("config: {w}");
    }
    let store = Store::start(cfg)?;
    store.wait_ready(Some(Duration::from_secs(10)))?;

    let page = vec![42u8; 128 << 10]; // one 128 KiB KV page
    let stored = store.batch_set(&["page-0"], &[&page[..]])?;
    let present = store.batch_exists(&["page-0"])?; // leading pages present
    let mut buf = vec![0u8; page.len()];
    let read = store.batch_get(&["page-0"], &mut [&mut buf[..]])?;
    anyhow::ensure!(read[0] && buf == page, "the page read back differs");
    println!(
        "stored={} present={present} read={} byte-exact",
        stored[0], read[0]
    );
    store.shutdown();
    Ok(())
}

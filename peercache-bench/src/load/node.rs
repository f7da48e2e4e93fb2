//! Starting an embedded bench node and waiting for the steady state it is measured in.

use std::time::Duration;

use anyhow::{Context, Result};
use peercache_store::{PeerCacheConfig, Store};

/// Starts an embedded node from the settings `cfg` with `overrides` on top, and returns once it
/// joined (within 20 s) and its pool is warm whole (no faulting threads beside the run).
pub fn start_warm(
    mut cfg: serde_json::Value,
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> Result<Store> {
    for (k, v) in overrides {
        cfg[k] = v.clone();
    }
    let (cfg, _) = PeerCacheConfig::from_map(cfg.as_object().context("config object")?)?;
    let s = Store::start(cfg)?;
    s.wait_ready(Some(Duration::from_secs(20)))?;
    s.wait_pool_ready(Duration::from_secs(300));
    Ok(s)
}

/// A discovery seed on loopback: `127.0.0.1` and a port free now (the first node hosts it).
pub fn loopback_seed() -> Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("127.0.0.1:{port}"))
}

/// A pool setting for `pages` pages of `page_bytes`: twice their bytes, at least 64 MiB.
pub fn pool_for(pages: u64, page_bytes: u64) -> String {
    format!("{}mb", (pages * page_bytes * 2 / (1 << 20)).max(64))
}

//! `peercache-bench serve`: one node process that publishes a known set of pages and then
//! serves until it is stopped — the building block of multi-process runs (the fault suite,
//! multi-node demos). Keys are `<node_id>/<i>`; each page's bytes are a function of its key
//! ([`page_for`]), so any reader can check every byte it gets.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{Context, Result};
use peercache_store::Store;
use peercache_store::cli::{NodeArgs, node_config};

/// Options of `serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Node options, as for `peercache-node` (`--discovery-addr`, `--host`, `--set k=v`…).
    #[command(flatten)]
    pub node: ServeNode,
    /// Pages to publish after joining.
    #[arg(long, default_value_t = 0)]
    pub preload: usize,
    /// Bytes per page.
    #[arg(long, default_value_t = 65536)]
    pub page_bytes: usize,
}

/// The node part of [`ServeArgs`] (the flags of `peercache-node`).
#[derive(Debug, clap::Args)]
pub struct ServeNode {
    /// TOML config file.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Seed list host:port[,host:port…].
    #[arg(long)]
    pub discovery_addr: Option<String>,
    /// Bind and advertise this host for every listener.
    #[arg(long)]
    pub host: Option<String>,
    /// Any config key: `--set key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// The key of page `i` published by `node`.
pub fn key_for(node: &str, i: usize) -> String {
    format!("{node}/{i}")
}

/// The bytes of the page stored under `key`: xorshift from the key's hash.
pub fn page_for(key: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_page(key, &mut out);
    out
}

/// Fills `out` with the bytes of the page stored under `key`.
pub fn fill_page(key: &str, out: &mut [u8]) {
    let mut x = xxhash_rust::xxh3::xxh3_64(key.as_bytes()) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Runs the node: join, publish, print `READY <node_id> <published>`, serve until SIGTERM,
/// SIGINT or end of standard input.
pub fn run(args: &ServeArgs) -> Result<()> {
    peercache_store::cli::block_signals();
    let node = NodeArgs {
        command: None,
        config: args.node.config.clone(),
        discovery_addr: args.node.discovery_addr.clone(),
        host: args.node.host.clone(),
        set: args.node.set.clone(),
    };
    let cfg = node_config(&node, peercache_store::Role::Inference)?;
    let startup = cfg.startup_timeout;
    let store = Store::start(cfg).context("starting the node")?;
    store
        .wait_ready(Some(Duration::from_secs_f64(startup.max(1.0))))
        .context("joining the cluster")?;
    let id = store.node_id().to_string();
    let mut ok = 0;
    for start in (0..args.preload).step_by(64) {
        let end = (start + 64).min(args.preload);
        let keys: Vec<String> = (start..end).map(|i| key_for(&id, i)).collect();
        let pages: Vec<Vec<u8>> = keys.iter().map(|k| page_for(k, args.page_bytes)).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
        ok += store
            .batch_set(&keys, &refs)?
            .iter()
            .filter(|&&b| b)
            .count();
    }
    store.flush_disk();
    println!("READY {id} {ok}");
    std::io::stdout().flush()?;
    // Stop on a signal or when the parent closes our stdin (it died or is done with us).
    std::thread::spawn(|| {
        let mut line = String::new();
        let mut stdin = std::io::stdin().lock();
        while stdin.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            line.clear();
        }
        // SAFETY: raising a signal at our own process.
        unsafe { libc::raise(libc::SIGTERM) };
    });
    peercache_store::cli::wait_for_signal();
    store.shutdown();
    Ok(())
}

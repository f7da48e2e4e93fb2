//! `peercache-bench serve`: one node process that publishes a known set of pages and then
//! serves until it is stopped — the building block of multi-process runs (the fault suite,
//! multi-node demos). Keys are `<node_id>/<i>`; each page's bytes are a function of its key
//! ([`page_for`]), so any reader can check every byte it gets.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::Store;
use peercache_store::tools::cli::{NodeArgs, node_config};

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
    #[arg(long, visible_alias = "page-size", default_value_t = 65536)]
    pub page_bytes: usize,
    /// Before publishing, wait until this many other members have joined (0.8.4's flag: the
    /// readers of a two-host run), at most `--connect-timeout` seconds.
    #[arg(long, default_value_t = 0)]
    pub readers: usize,
    /// Seconds to wait for `--readers` to join and for `--read-from`'s pages to appear.
    #[arg(long, default_value_t = 30.0, value_parser = peercache_store::tools::secs::seconds)]
    pub connect_timeout: f64,
    /// After joining, read the pages another node published (`<node_id>/<i>`, i < `--preload`
    /// of that node = `--read-count`), check every byte, print `READ <node> hits=H/N wrong=W`.
    #[arg(long)]
    pub read_from: Option<String>,
    /// Pages of `--read-from` to read.
    #[arg(long, default_value_t = 0)]
    pub read_count: usize,
    /// Also stop when standard input closes (for a parent process that may die first).
    #[arg(long)]
    pub stop_on_stdin_eof: bool,
    /// Also serve the bare `raw-tcp` baseline from this process (64 pages of `--page-bytes`)
    /// and print `RAW <address>` before `READY`: the request/response floor of the same
    /// process layout (`latency --owner-process`).
    #[arg(long)]
    pub raw_tcp: bool,
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
    #[arg(long, visible_alias = "local-host")]
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

/// Reads `count` pages published by `from` (waiting up to `wait` for that node to be a member
/// and its pages to be found) and checks every byte. Returns (hits, wrong pages).
fn read_pages(
    store: &Store,
    from: &str,
    count: usize,
    len: usize,
    wait: Duration,
) -> Result<(usize, usize)> {
    let keys: Vec<String> = (0..count).map(|i| key_for(from, i)).collect();
    let deadline = std::time::Instant::now() + wait;
    while store.batch_exists(&keys)? < count && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut hits, mut wrong) = (0, 0);
    let mut bufs = vec![vec![0u8; len]; 64.min(count.max(1))];
    for chunk in keys.chunks(64) {
        let mut dst: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let got = store.batch_get(chunk, &mut dst[..chunk.len()])?;
        for ((k, g), b) in chunk.iter().zip(got).zip(&bufs) {
            if g {
                hits += 1;
                if *b != page_for(k, len) {
                    wrong += 1;
                }
            }
        }
    }
    Ok((hits, wrong))
}

/// Runs the node: join, publish, print `READY <node_id> <published>`, optionally read another
/// node's pages, then serve until SIGTERM or SIGINT (or end of standard input, if asked).
pub fn run(args: &ServeArgs) -> Result<()> {
    peercache_store::tools::cli::block_signals();
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
    let wait = Duration::from_secs_f64(args.connect_timeout.max(0.0));
    if args.readers > 0 && !store.wait_members(args.readers + 1, wait) {
        bail!(
            "--readers {}: {} other member(s) joined within --connect-timeout {} s",
            args.readers,
            store.members().len().saturating_sub(1),
            args.connect_timeout
        );
    }
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
    if args.raw_tcp {
        let host = args.node.host.as_deref().unwrap_or("127.0.0.1");
        let listener = std::net::TcpListener::bind((host, 0)).context("the raw-tcp listener")?;
        println!("RAW {}", listener.local_addr()?);
        let buf = std::sync::Arc::new(crate::load::rawtcp::prefaulted(
            64 * args.page_bytes.max(64),
            7,
        ));
        std::thread::spawn(move || crate::load::rawtcp::serve(listener, buf));
    }
    println!("READY {id} {ok}");
    std::io::stdout().flush()?;
    if let Some(from) = &args.read_from {
        let (hits, wrong) = read_pages(&store, from, args.read_count, args.page_bytes, wait)?;
        println!("READ {from} hits={hits}/{} wrong={wrong}", args.read_count);
        std::io::stdout().flush()?;
    }
    // Stop on a signal, or when the parent closes our stdin (it died or is done with us).
    if args.stop_on_stdin_eof {
        std::thread::spawn(|| {
            let mut line = String::new();
            let mut stdin = std::io::stdin().lock();
            while stdin.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                line.clear();
            }
            // SAFETY: sending SIGTERM to our own process (process-directed, so the thread that
            // waits for signals receives it).
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        });
    }
    peercache_store::tools::cli::wait_for_signal();
    store.shutdown();
    Ok(())
}

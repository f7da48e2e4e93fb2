//! `peercache-node drive`: a driver for a running cluster. It writes pages on one node through
//! that node's client API, reads them back through the others, checks every byte, and shows
//! from each reader's metrics that the pages crossed nodes.
//!
//! The nodes must run with `client_enabled = true`; the driver finds their client endpoints
//! (and metrics endpoints) through discovery, so it needs only the seed list.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use peercache_discovery::NodeInfo;

use crate::client::{CLIENT_ATTR, Client};
use crate::tools::status::endpoint_attr as attr;

/// Options of `peercache-node drive`.
#[derive(Debug, Clone, clap::Args)]
pub struct DriveArgs {
    /// Seed list host:port[,host:port…].
    #[arg(long)]
    pub discovery_addr: String,
    /// The node that publishes the pages (its `node_id`).
    #[arg(long)]
    pub write_on: String,
    /// Nodes that read them back, comma-separated (default: every other node).
    #[arg(long, value_delimiter = ',')]
    pub read_on: Vec<String>,
    /// Pages to write.
    #[arg(long, default_value_t = 256)]
    pub pages: usize,
    /// Bytes per page (suffixes: kb, mb).
    #[arg(long, default_value = "64kb", value_parser = parse_page_size)]
    pub page_size: usize,
    /// Key prefix: keys are `<prefix>/<i>`.
    #[arg(long, default_value = "drive")]
    pub key_prefix: String,
    /// Wait until this many members serve the client API (0: the writer and readers named).
    #[arg(long, default_value_t = 0)]
    pub members: usize,
    /// Seconds to wait for the members.
    #[arg(long, default_value_t = 30.0, value_parser = crate::tools::secs::seconds)]
    pub wait: f64,
    /// Seconds each request may take.
    #[arg(long, default_value_t = 10.0, value_parser = crate::tools::secs::positive_seconds)]
    pub timeout: f64,
    /// File holding the cluster secret (else `PEERCACHE_CLUSTER_SECRET`).
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// File holding the bearer token of nodes started with `http_token_file` (the driver
    /// reads their `/cluster` to wait for settled rings).
    #[arg(long)]
    pub http_token_file: Option<std::path::PathBuf>,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

fn parse_page_size(s: &str) -> Result<usize, String> {
    match crate::config::parse_size(s) {
        Some(n) if n > 0 && n <= crate::client::MAX_CLIENT_BYTES as u64 => Ok(n as usize),
        Some(n) => Err(format!(
            "{n} bytes: a page must be 1..={} bytes",
            crate::client::MAX_CLIENT_BYTES
        )),
        None => Err(format!("{s:?} is not a size such as 64kb or 65536")),
    }
}

/// The bytes of the page stored under `key`: a function of the key alone, so a reader checks
/// them without having seen the write.
pub fn page_bytes_of(key: &str, len: usize) -> Vec<u8> {
    let mut x = xxhash_rust::xxh3::xxh3_64(key.as_bytes()) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The value of counter `name` of node `node` in a Prometheus text page (0 if absent).
fn counter(text: &str, name: &str, node: &str) -> f64 {
    let label = format!("node=\"{node}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{') && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .next()
        .unwrap_or(0.0)
}

fn remote_hits(m: &NodeInfo, timeout: Duration) -> Option<f64> {
    let text = crate::tools::status::http_get(attr(m, "metrics")?, "/metrics", timeout, None)?;
    Some(counter(
        &text,
        crate::observe::series::READ_REMOTE_HITS,
        m.node.as_str(),
    ))
}

/// Waits until the members the run needs are visible and serve the client API.
fn wait_members(
    args: &DriveArgs,
    seeds: &[SocketAddr],
    auth: &peercache_wire::Auth,
) -> Result<Vec<NodeInfo>> {
    let deadline = Instant::now() + Duration::from_secs_f64(args.wait);
    let step = Duration::from_secs_f64(args.timeout.min(2.0));
    loop {
        let members = match crate::tools::status::members(seeds, step, auth.clone()) {
            Ok(m) => m,
            // A refused handshake will not cure itself: say so now, not after `--wait`.
            Err(e) if e.is::<crate::tools::status::Refused>() => return Err(e),
            Err(_) => Vec::new(),
        };
        let serving = members
            .iter()
            .filter(|m| attr(m, CLIENT_ATTR).is_some())
            .count();
        let named = std::iter::once(&args.write_on)
            .chain(&args.read_on)
            .all(|n| {
                members
                    .iter()
                    .any(|m| m.node.as_str() == n && attr(m, CLIENT_ATTR).is_some())
            });
        if named && serving >= args.members.max(1) {
            return Ok(members);
        }
        if Instant::now() >= deadline {
            bail!(
                "after {:.0} s: {} members, {serving} serving the client API (want {} and \
                 {:?}); start the nodes with --set client_enabled=true",
                args.wait,
                members.len(),
                args.members,
                std::iter::once(&args.write_on)
                    .chain(&args.read_on)
                    .collect::<Vec<_>>()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long every involved node's directory ring must have been unchanged before the driver
/// writes: long enough for re-announcements after the last join to have landed.
const RING_SETTLE_MS: u64 = 1000;

/// Waits until each node's directory ring holds `members` nodes and has not changed for
/// [`RING_SETTLE_MS`] (read from its `/cluster`): pages written while rings still disagree
/// can miss for a moment after a join, which is not what this smoke test measures. Nodes
/// without a metrics endpoint are not checked.
fn wait_rings(nodes: &[&NodeInfo], members: usize, args: &DriveArgs) -> Result<()> {
    let token = crate::tools::tool::tool_http_token(args.http_token_file.as_deref())?;
    let deadline = Instant::now() + Duration::from_secs_f64(args.wait);
    let step = Duration::from_secs_f64(args.timeout.min(2.0));
    loop {
        let mut waiting = Vec::new();
        for m in nodes {
            let Some(ep) = attr(m, "metrics") else {
                continue;
            };
            let view = crate::tools::status::http_get(ep, "/cluster", step, token.as_deref())
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok());
            let ring = view.as_ref().map(|v| &v["ring"]);
            let settled = ring.is_some_and(|r| {
                r["members"].as_u64() == Some(members as u64)
                    && r["changed_ms_ago"].as_u64().unwrap_or(0) >= RING_SETTLE_MS
            });
            if !settled {
                waiting.push(m.node.to_string());
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "after {:.0} s the directory rings of {waiting:?} still disagree with the {members} \
                 members (or their /cluster is not readable: nodes started with http_token_file \
                 need --http-token-file)",
                args.wait
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs the driver; fails if any page is missing or wrong.
pub fn run(args: DriveArgs) -> Result<()> {
    let seeds = peercache_discovery::parse_seeds(&args.discovery_addr)
        .context("parsing --discovery-addr")?;
    let auth = crate::tools::tool::tool_auth(args.cluster_secret_file.as_deref())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let members = wait_members(&args, &seeds, &auth)?;
    let find = |name: &str| members.iter().find(|m| m.node.as_str() == name);
    let writer = find(&args.write_on).context("the writer is not a member")?;
    let readers: Vec<&NodeInfo> = if args.read_on.is_empty() {
        members
            .iter()
            .filter(|m| m.node != writer.node && attr(m, CLIENT_ATTR).is_some())
            .collect()
    } else {
        args.read_on.iter().filter_map(|n| find(n)).collect()
    };
    if readers.is_empty() {
        bail!("no reader: name one with --read-on or start another node");
    }
    let involved: Vec<&NodeInfo> = std::iter::once(writer)
        .chain(readers.iter().copied())
        .collect();
    wait_rings(&involved, members.len(), &args)?;
    let keys: Vec<String> = (0..args.pages)
        .map(|i| format!("{}/{i}", args.key_prefix))
        .collect();
    let pages: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| page_bytes_of(k, args.page_size))
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();

    let client_of = |m: &NodeInfo| -> Result<Client> {
        let addr = attr(m, CLIENT_ATTR).context("no client endpoint")?;
        Ok(Client::new(addr, auth.clone(), timeout))
    };
    let t0 = Instant::now();
    let stored = client_of(writer)?
        .put(&keys, &refs)
        .with_context(|| format!("writing on {}", writer.node))?;
    let write_ms = t0.elapsed().as_secs_f64() * 1e3;
    let stored = stored.iter().filter(|s| **s).count();
    let mut report = vec![serde_json::json!({
        "node": writer.node.as_str(), "op": "put", "pages": args.pages, "stored": stored,
        "page_bytes": args.page_size, "ms": write_ms,
    })];
    if !args.json {
        println!(
            "WROTE {} stored={stored}/{} page_bytes={} in {write_ms:.1} ms",
            writer.node, args.pages, args.page_size
        );
    }
    let mut ok = stored == args.pages;
    for r in readers {
        let before = remote_hits(r, timeout);
        let t0 = Instant::now();
        let got = client_of(r)?
            .get(&keys, args.page_size)
            .with_context(|| format!("reading through {}", r.node))?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let hits = got.iter().filter(|p| p.is_some()).count();
        let wrong = got
            .iter()
            .zip(&pages)
            .filter(|(g, want)| g.as_ref().is_some_and(|g| &g.bytes != *want))
            .count();
        let remote = before.zip(remote_hits(r, timeout)).map(|(b, a)| a - b);
        ok &= hits == args.pages && wrong == 0;
        if !args.json {
            let remote = remote
                .map(|x| format!("+{x:.0}"))
                .unwrap_or_else(|| "?".into());
            println!(
                "READ {} hits={hits}/{} wrong={wrong} remote_hits={remote} in {ms:.1} ms",
                r.node, args.pages
            );
        }
        report.push(serde_json::json!({
            "node": r.node.as_str(), "op": "get", "pages": args.pages, "hits": hits,
            "wrong": wrong, "remote_hits": remote, "ms": ms,
        }));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if !ok {
        bail!("some pages were not stored, not found or wrong");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_depend_on_the_key_only() {
        assert_eq!(page_bytes_of("a/1", 100), page_bytes_of("a/1", 100));
        assert_ne!(page_bytes_of("a/1", 100), page_bytes_of("a/2", 100));
        assert_eq!(page_bytes_of("a/1", 13).len(), 13);
    }

    #[test]
    fn counters_are_read_from_prometheus_text() {
        let text = "# TYPE x counter\npeercache_read_remote_hits_total{node=\"m\"} 7\n\
                    peercache_read_remote_hits_total{node=\"n\"} 256\n\
                    peercache_read_remote_hits_total_other{node=\"n\"} 9\n";
        assert_eq!(
            counter(text, "peercache_read_remote_hits_total", "n"),
            256.0
        );
        assert_eq!(counter(text, "peercache_read_remote_hits_total", "m"), 7.0);
        assert_eq!(counter(text, "missing", "n"), 0.0);
    }

    #[test]
    fn page_sizes_are_checked() {
        assert_eq!(parse_page_size("64kb").unwrap(), 65536);
        assert!(parse_page_size("0").is_err());
        assert!(parse_page_size("1gb").is_err());
        assert!(parse_page_size("lots").is_err());
    }
}

//! `peercache-node status`: the cluster as discovery sees it, one row per member, with each
//! member's pool and shard figures from its `/cluster` endpoint when reachable.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_discovery::{DiscReply, DiscRequest, NodeInfo, choose_masters};
use peercache_wire::Incarnation;
use peercache_wire::envelope;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};

/// Options of `peercache-node status`.
#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// Seed list host:port[,host:port…].
    #[arg(long)]
    pub discovery_addr: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Seconds to wait for each answer.
    #[arg(long, default_value_t = 2.0, value_parser = crate::tools::secs::positive_seconds)]
    pub timeout: f64,
    /// File holding the cluster secret (else `PEERCACHE_CLUSTER_SECRET`).
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// File holding the bearer token of nodes started with `http_token_file` (their
    /// `/cluster` answers only with it).
    #[arg(long)]
    pub http_token_file: Option<std::path::PathBuf>,
}

/// The address a member advertises under attribute `key` (`metrics`, `client`), if any.
pub(crate) fn endpoint_attr(m: &NodeInfo, key: &str) -> Option<SocketAddr> {
    m.attrs
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
}

/// A discovery server refused this tool's handshake: no (or another) cluster secret, or another
/// release's handshake. Waiting does not help, so callers stop at once and say how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{seed} refused this tool: {cause}{hint}")]
pub struct Refused {
    /// The discovery server.
    pub seed: SocketAddr,
    /// The handshake error.
    pub cause: peercache_wire::WireError,
    /// What to do about it.
    hint: &'static str,
}

impl Refused {
    /// `Some` when `e` is a refusal that retrying cannot cure.
    pub fn of(seed: SocketAddr, e: peercache_wire::WireError) -> Option<Refused> {
        use peercache_wire::WireError as W;
        let hint = match e {
            W::Unauthenticated(_) => {
                " — pass --cluster-secret-file FILE or set PEERCACHE_CLUSTER_SECRET to the \
                 cluster's secret"
            }
            W::HandshakeVersion { .. } => "",
            _ => return None,
        };
        Some(Refused {
            seed,
            cause: e,
            hint,
        })
    }
}

/// Asks the seeds for the members (the union of their answers). Fails with [`Refused`] when
/// every seed that answered refused the handshake.
pub fn members(
    seeds: &[SocketAddr],
    timeout: Duration,
    auth: peercache_wire::Auth,
) -> Result<Vec<NodeInfo>> {
    let client = RpcClient::new(rpc::ClientConfig {
        hello: Hello::new(Plane::Discovery, None, Incarnation::fresh()),
        max_idle_per_peer: 1,
        max_frame: 8 << 20,
        auth,
    });
    let req = envelope::encode(&DiscRequest::Members, &[])?;
    let calls: Vec<(SocketAddr, &[u8])> = seeds.iter().map(|s| (*s, req.as_slice())).collect();
    let mut all: std::collections::BTreeMap<String, NodeInfo> = Default::default();
    let mut answered = 0;
    let mut refused = None;
    for (seed, r) in seeds.iter().zip(client.call_many(&calls, timeout)) {
        match r.and_then(|f| rpc::decode_reply::<DiscReply>(&f)) {
            Ok(DiscReply::Members { members, .. }) => {
                answered += 1;
                for m in members {
                    all.insert(m.node.to_string(), m);
                }
            }
            Err(e) => {
                if refused.is_none() {
                    refused = Refused::of(*seed, e);
                }
            }
            Ok(_) => {}
        }
    }
    if answered == 0 {
        if let Some(r) = refused {
            return Err(r.into());
        }
        bail!("no discovery server answered at {seeds:?}");
    }
    Ok(all.into_values().collect())
}

/// GET `path` of a node's metrics endpoint, with the bearer `token` if given: the body, or
/// None (best effort).
pub(crate) fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    token: Option<&str>,
) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n").ok()?;
    let mut out = Vec::new();
    s.take(16 << 20).read_to_end(&mut out).ok()?;
    let text = String::from_utf8(out).ok()?;
    let (_, body) = text.split_once("\r\n\r\n")?;
    Some(body.to_string())
}

/// GET `/cluster` of a node's metrics endpoint (best effort).
fn cluster_of(
    addr: SocketAddr,
    timeout: Duration,
    token: Option<&str>,
) -> Option<serde_json::Value> {
    serde_json::from_str(&http_get(addr, "/cluster", timeout, token)?).ok()
}

/// Prints the cluster view.
pub fn run(args: StatusArgs) -> Result<()> {
    let seeds = peercache_discovery::parse_seeds(&args.discovery_addr)
        .context("parsing --discovery-addr")?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let auth = crate::tools::tool::tool_auth(args.cluster_secret_file.as_deref())?;
    let token = crate::tools::tool::tool_http_token(args.http_token_file.as_deref())?;
    let members = members(&seeds, timeout, auth)?;
    let servers = members.iter().filter_map(|m| m.meta).collect();
    let masters = choose_masters(&seeds, &servers, 3);
    let rows: Vec<serde_json::Value> = members
        .iter()
        .map(|m| {
            let metrics = endpoint_attr(m, "metrics");
            let view = metrics.and_then(|a| cluster_of(a, timeout, token.as_deref()));
            serde_json::json!({
                "node": m.node.as_str(), "incarnation": m.incarnation.0, "role": m.role,
                "control": m.control.to_string(), "data": m.data.first().map(|d| d.to_string()),
                "meta": m.meta.map(|a| a.to_string()), "master": m.meta.is_some_and(|a| masters.contains(&a)),
                "metrics": metrics.map(|a| a.to_string()),
                "client": endpoint_attr(m, crate::client::CLIENT_ATTR).map(|a| a.to_string()),
                "pool_used": view.as_ref().map(|v| v["pool"]["bytes_used"].clone()),
                "pool_capacity": view.as_ref().map(|v| v["pool"]["capacity"].clone()),
                "pool_ready_bytes": view.as_ref().map(|v| v["pool"]["ready_bytes"].clone()),
                "pool_ready": view.as_ref().map(|v| v["pool"]["ready"].clone()),
                "disk_recovering": view.as_ref().map(|v| v["disk"]["recovering"].clone()),
                "rdma_registered_bytes": view.as_ref().map(|v| v["rdma"]["registered_bytes"].clone()),
                "rdma_registering_bytes": view.as_ref().map(|v| v["rdma"]["registering_bytes"].clone()),
                "shard_entries": view.as_ref().map(|v| v["shard_entries"].clone()),
                "verify_rejects": view.as_ref().map(|v| v["pool"]["verify_rejects"].clone()),
            })
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"masters": masters, "members": rows})
            )?
        );
        return Ok(());
    }
    let noun = if rows.len() == 1 { "member" } else { "members" };
    println!("{} {noun}, masters {:?}", rows.len(), masters);
    println!(
        "{:<36} {:<9} {:<22} {:<22} {:>7} {:>22} {:>10}",
        "node", "role", "control", "data", "master", "pool used", "shard"
    );
    for r in &rows {
        let pool = match (r["pool_used"].as_u64(), r["pool_capacity"].as_u64()) {
            (Some(u), Some(c)) if c > 0 => format!("{:.1}%", 100.0 * u as f64 / c as f64),
            _ => "-".into(),
        };
        // A pool still faulting in says how much of it is ready.
        let warming = r["pool_ready"].as_bool() == Some(false);
        let pool = match (r["pool_ready_bytes"].as_u64(), r["pool_capacity"].as_u64()) {
            (Some(ready), Some(c)) if c > 0 && warming => {
                format!("{pool} (warm {:.0}%)", 100.0 * ready as f64 / c as f64)
            }
            _ => pool,
        };
        // A pool still being registered with the NIC in chunks says how much peers can read
        // over RDMA yet (the rest they read over TCP).
        let pool = match (
            r["rdma_registered_bytes"].as_u64(),
            r["rdma_registering_bytes"].as_u64(),
        ) {
            (Some(done), Some(left)) if left > 0 => {
                let pct = 100.0 * done as f64 / (done + left) as f64;
                format!("{pool} (rdma reg {pct:.0}%)")
            }
            _ => pool,
        };
        // A disk tier still scanning a previous run's pages says so (they come back after it).
        let pool = if r["disk_recovering"].as_bool() == Some(true) {
            format!("{pool} (disk scan)")
        } else {
            pool
        };
        let shard = r["shard_entries"]
            .as_u64()
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<36} {:<9} {:<22} {:<22} {:>7} {:>22} {:>10}",
            r["node"].as_str().unwrap_or("?"),
            r["role"].as_str().unwrap_or("?"),
            r["control"].as_str().unwrap_or("?"),
            r["data"].as_str().unwrap_or("-"),
            if r["master"].as_bool() == Some(true) {
                "yes"
            } else {
                ""
            },
            pool,
            shard
        );
    }
    Ok(())
}

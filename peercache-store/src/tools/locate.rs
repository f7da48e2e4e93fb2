//! `peercache-node locate`: where the directory says keys live — every owner, its copy class,
//! whether the page is resident or only on the owner's disk, its generation and lengths. Asks
//! one node (`--via`, default: the first that serves the client API) through its client API.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::client::{CLIENT_ATTR, Client};

/// Options of `peercache-node locate`.
#[derive(Debug, Clone, clap::Args)]
pub struct LocateArgs {
    /// Seed list host:port[,host:port…].
    #[arg(long)]
    pub discovery_addr: String,
    /// The node to ask (its `node_id`); default: the first member serving the client API.
    #[arg(long)]
    pub via: Option<String>,
    /// Seconds each answer may take.
    #[arg(long, default_value_t = 5.0, value_parser = crate::tools::secs::positive_seconds)]
    pub timeout: f64,
    /// File holding the cluster secret (else `PEERCACHE_CLUSTER_SECRET`).
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub json: bool,
    /// Treat the keys as one request's pages, in order, and print each node's leading run of
    /// them (and its part in memory), longest first: where a router should send the request.
    #[arg(long)]
    pub prefix: bool,
    /// The keys, as the application passed them (the node applies its `prefix`).
    #[arg(required = true)]
    pub keys: Vec<String>,
}

/// One owner's entry as JSON: node, resident, class, generation, lengths, data endpoint and
/// page layout fingerprint (`null` when the owner declared none).
pub fn location_json(l: &peercache_directory::Location) -> serde_json::Value {
    serde_json::json!({
        "node": l.node.as_str(), "resident": l.resident,
        "class": format!("{:?}", l.class).to_lowercase(),
        "generation": l.generation, "len": l.len, "valid_len": l.valid_len,
        "data": l.rails.first().map(|r| r.endpoint.to_string()),
        "layout": (!l.layout.is_none()).then(|| l.layout.to_string()),
    })
}

/// Prints where each key lives.
pub fn run(args: LocateArgs) -> Result<()> {
    let seeds = peercache_discovery::parse_seeds(&args.discovery_addr)
        .context("parsing --discovery-addr")?;
    let auth = crate::tools::tool::tool_auth(args.cluster_secret_file.as_deref())?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let members = crate::tools::status::members(&seeds, timeout, auth.clone())?;
    let via = members
        .iter()
        .filter(|m| args.via.as_deref().is_none_or(|v| m.node.as_str() == v))
        .find_map(|m| {
            crate::tools::status::endpoint_attr(m, CLIENT_ATTR).map(|e| (m.node.clone(), e))
        });
    let Some((node, ep)) = via else {
        bail!(
            "no member {}serves the client API (start nodes with --set client_enabled=true)",
            args.via
                .as_deref()
                .map(|v| format!("named {v:?} "))
                .unwrap_or_default()
        );
    };
    let found = Client::new(ep, auth, timeout)
        .locate(&args.keys)
        .with_context(|| format!("asking {node}"))?;
    if args.prefix {
        return print_prefix(&args, &found);
    }
    if args.json {
        let rows: Vec<serde_json::Value> = args
            .keys
            .iter()
            .zip(&found)
            .map(|(k, owners)| {
                serde_json::json!({
                    "key": k,
                    "owners": owners.iter().map(location_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for (k, owners) in args.keys.iter().zip(&found) {
        if owners.is_empty() {
            println!("{k}: not in the directory");
            continue;
        }
        for l in owners {
            println!(
                "{k}: {} {} {:?} generation={} len={} valid={} layout={}",
                l.node,
                if l.resident { "resident" } else { "disk-only" },
                l.class,
                l.generation,
                l.len,
                l.valid_len,
                if l.layout.is_none() {
                    "none".to_string()
                } else {
                    l.layout.to_string()
                }
            );
        }
    }
    Ok(())
}

/// `--prefix`: each node's leading run of the keys.
fn print_prefix(args: &LocateArgs, found: &[Vec<peercache_directory::Location>]) -> Result<()> {
    let runs = crate::prefix_runs(found);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "keys": args.keys.len(), "nodes": crate::prefix_json(&runs),
            }))?
        );
        return Ok(());
    }
    if runs.is_empty() {
        println!("no node holds the first of {} keys", args.keys.len());
    }
    for r in &runs {
        println!(
            "{}: {} of {} leading pages ({} in memory)",
            r.node,
            r.leading,
            args.keys.len(),
            r.resident
        );
    }
    Ok(())
}

//! `peercache-bench replicas`: what `replicate_on_read` does to a hot-key read workload, and
//! what reading pages that live only on another node's disk tier costs.
//!
//! * `hot-get/off` and `hot-get/on`: one owner holds a hot set; three reader nodes, one caller
//!   thread each, read it in batches — without replication every read goes to the owner; with
//!   `replicate_on_read` each reader keeps a copy after its first read and later reads are
//!   local (or spread over the other readers' copies).
//! * `get-disk-only`: the owner's pool is tiny and its disk tier on, so the pages a reader
//!   asks for live only on the owner's disk: each batch costs a promote RPC (the owner reads
//!   the records back into its pool and answers with fresh locations) plus the one-sided read.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::{PeerCacheConfig, Store};
use serde_json::json;

use crate::load::rawtcp;
use crate::load::sweep::Sweep;
use crate::report::{self, Host, Report};

/// Options of `replicas`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaArgs {
    /// Page size in bytes.
    #[arg(long, default_value_t = 131072)]
    pub page_bytes: u64,
    /// Pages per batch.
    #[arg(long, visible_alias = "batch-size", default_value_t = 32)]
    pub batch: u64,
    /// Pages in the hot set.
    #[arg(long, default_value_t = 64)]
    pub hot_pages: u64,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

fn start(ip: &str, seed: &str, extra: serde_json::Value) -> Result<Store> {
    let mut cfg = json!({
        "discovery_addr": seed, "protocol": "tcp", "node_id": format!("rep-{ip}"),
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "128mb", "heartbeat_interval": 0.5, "member_ttl": 1.5,
        "metrics_enabled": false,
        // Bench nodes stand in for separate hosts: reads take the network path.
        "host_local": false,
        "cluster_secret": crate::load::secret::generated(),
    });
    for (k, v) in extra.as_object().context("extra")? {
        cfg[k] = v.clone();
    }
    let (cfg, _) = PeerCacheConfig::from_map(cfg.as_object().context("config")?)?;
    let s = Store::start(cfg)?;
    s.wait_ready(Some(Duration::from_secs(20)))?;
    Ok(s)
}

fn settle(nodes: &[Store]) -> Result<()> {
    for s in nodes {
        if !s.wait_members(nodes.len(), Duration::from_secs(20)) {
            bail!("the nodes did not see each other");
        }
        s.sync_membership();
    }
    Ok(())
}

/// Runs the replica and disk-promote rows.
pub fn run(args: &ReplicaArgs) -> Result<Report> {
    let page = args.page_bytes as usize;
    let batch = args.batch as usize;
    // Three readers hit the hot keys; one reads the disk-only pages.
    let sweep = |label: &str, threads: u64| {
        Sweep::of(
            label,
            args.run.rounds,
            &[threads],
            args.page_bytes,
            args.batch,
            args.run.secs,
        )
    };
    let src = rawtcp::prefaulted(page * batch, 41);
    let mut rows = Vec::new();
    // Two clusters on their own addresses: replication off and on.
    let mut clusters = Vec::new();
    for (v, on) in [(0u8, false), (1u8, true)] {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let ip = |i: u8| format!("127.0.{}.{i}", 40 + v);
        let seed = format!("{}:{port}", ip(1));
        let owner = start(&ip(1), &seed, json!({}))?;
        let mut nodes = vec![owner.clone()];
        for r in 2..5 {
            nodes.push(start(&ip(r), &seed, json!({"replicate_on_read": on}))?);
        }
        settle(&nodes)?;
        let keys: Arc<Vec<String>> =
            Arc::new((0..args.hot_pages).map(|i| format!("hot/{i}")).collect());
        crate::load::workload::publish(&owner, &keys, &src, page, batch)?;
        clusters.push((if on { "on" } else { "off" }, nodes, keys));
    }
    sweep("replicas: hot keys", 3)?.run(&mut rows, |cell| {
        for (variant, nodes, keys) in &clusters {
            cell.row(&format!("hot-get/{variant}"), |t| {
                crate::load::workload::get_caller(
                    nodes[1 + t].clone(),
                    keys.clone(),
                    page,
                    batch,
                    t as u64 * 7,
                )
            });
        }
        Ok(())
    })?;
    let served_by_owner: Vec<u64> = clusters
        .iter()
        .map(|(_, nodes, _)| {
            nodes[0].cluster_view()["transport"]["served_bytes"]
                .as_u64()
                .unwrap_or(0)
        })
        .collect();
    for (_, nodes, _) in clusters {
        for s in nodes {
            s.shutdown();
        }
    }

    // Disk-only pages on another node: promote RPC + read.
    let disk_dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let seed = format!("127.0.42.1:{port}");
    let owner = start(
        "127.0.42.1",
        &seed,
        json!({"global_segment_size": "16mb", "disk_enabled": true,
               "disk_path": disk_dir.path().to_str().context("path")?, "disk_size": "1gb"}),
    )?;
    let reader = start("127.0.42.2", &seed, json!({}))?;
    settle(&[owner.clone(), reader.clone()])?;
    let cold: Arc<Vec<String>> = Arc::new((0..512u64).map(|i| format!("cold/{i}")).collect());
    crate::load::workload::publish(&owner, &cold, &src, page, batch)?;
    owner.flush_disk();
    owner.flush_evictions(Duration::from_secs(10));
    sweep("replicas: disk-only pages", 1)?.run(&mut rows, |cell| {
        let round = cell.round;
        cell.row("get-disk-only", |_| {
            crate::load::workload::get_caller(reader.clone(), cold.clone(), page, batch, round * 97)
        });
        Ok(())
    })?;
    reader.shutdown();
    owner.shutdown();

    let med = |name: &str| report::median_of(&rows, name, |r| r.pages_per_s);
    let p50 = |name: &str| report::median_of(&rows, name, |r| r.p50_us);
    Ok(Report {
        bench: "replicas".into(),
        host: Host::detect(),
        config: json!({
            "page_bytes": args.page_bytes, "batch": args.batch, "hot_pages": args.hot_pages,
            "readers": 3, "rounds": args.run.rounds, "secs": args.run.secs,
            "disk_only": "owner pool 16 MiB, 512 pages (64 MiB) on its disk tier",
        }),
        summary: json!({
            "hot_get_pages_per_s_off": med("hot-get/off").round(),
            "hot_get_pages_per_s_on": med("hot-get/on").round(),
            "replicate_on_read_speedup": ((med("hot-get/on") / med("hot-get/off")) * 100.0).round() / 100.0,
            "owner_served_bytes_off": served_by_owner[0],
            "owner_served_bytes_on": served_by_owner[1],
            "disk_only_batch_p50_us": p50("get-disk-only").round(),
            "disk_only_pages_per_s": med("get-disk-only").round(),
        }),
        results: rows,
    })
}

//! `directory`: shard lookups in-process, and lookup / exists / insert over loopback RPC,
//! plus the hand-off measurement (10 shards, 100k entries, one join).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use peercache_directory::{
    ClientConfig, CopyClass, DirectoryClient, DirectoryService, Location, Member, Rail, Ring,
    Shard, ShardConfig, handoff,
};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcServer, ServerConfig};
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::load::runner::time_calls;
use crate::load::sweep::Rounds;
use crate::report::{self, Host, Report, Row};

/// Options of the `directory` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct DirArgs {
    /// Entries loaded into the serving shard.
    #[arg(long, default_value_t = 100_000)]
    pub entries: u64,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

fn key(i: u64) -> PageKey {
    PageKey::from_bytes(&i.to_le_bytes())
}

fn location(node: &NodeId, i: u64) -> Location {
    Location {
        node: node.clone(),
        incarnation: Incarnation(1),
        rails: smallvec::smallvec![Rail {
            endpoint: "127.0.0.1:1".parse().expect("literal address"),
            region: 1,
        }],
        addr: i * 4160,
        len: 131072,
        valid_len: 131072,
        generation: i,
        checksum: i,
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

fn timed(
    name: &str,
    keys_per_call: u64,
    round: u64,
    dur: Duration,
    mut f: impl FnMut() -> bool,
) -> Row {
    let (h, calls, errors, secs) = time_calls(dur, || u64::from(!f()));
    Row {
        errors,
        round,
        ..Row::measured(name, 0, keys_per_call, calls * keys_per_call, secs, &h)
    }
}

/// Runs the `directory` subcommand.
pub fn run(args: &DirArgs) -> Result<Report> {
    let owner = NodeId::new("bench-server")?;
    let service = Arc::new(DirectoryService::new(ShardConfig::default()));
    let server = RpcServer::start(
        ServerConfig {
            bind: "127.0.0.1:0".parse()?,
            planes: vec![Plane::Control],
            node: Some(owner.clone()),
            incarnation: Incarnation(1),
            max_frame: 16 << 20,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 64,
            offload: &[],
            workers: 1,
            name: "bench-dir",
            auth: peercache_wire::Auth::none(),
            shares: Default::default(),
        },
        service.into_handler(),
    )?;
    let me = NodeId::new("bench-client")?;
    let writer = me.clone();
    let client = DirectoryClient::new(
        me.clone(),
        Arc::new(DirectoryService::new(ShardConfig::default())),
        RpcClient::new(rpc::ClientConfig {
            hello: Hello::new(Plane::Control, Some(me), Incarnation(2)),
            max_idle_per_peer: 4,
            max_frame: 16 << 20,
            auth: peercache_wire::Auth::none(),
        }),
        ClientConfig {
            replicas: 1,
            ..ClientConfig::default()
        },
    );
    // Only the server is a member: every key is remote.
    client.apply_membership(&[Member {
        node: owner.clone(),
        control: server.local_addr(),
        incarnation: Incarnation(1),
    }]);
    // The client publishes its own pages (a node inserts only its own copies); the entries
    // live on the server's shard.
    let entries: Vec<_> = (0..args.entries)
        .map(|i| (key(i), location(&writer, i)))
        .collect();
    for chunk in entries.chunks(10_000) {
        client.insert(chunk)?;
    }
    let mut local = Shard::new(ShardConfig::default());
    for (k, l) in &entries {
        local.insert(*k, l.clone(), 0);
    }
    let dur = Duration::from_secs_f64(args.run.secs);
    let n = args.entries;
    let mut rows = Vec::new();
    Rounds::new("directory", args.run.rounds).run(&mut rows, |cell| {
        let round = cell.round;
        let mut i = 0u64;
        let mut keys32: Vec<PageKey> = Vec::with_capacity(32);
        cell.push(timed("shard-lookup", 32, round, dur, || {
            let mut hits = 0;
            for _ in 0..32 {
                i = (i + 7919) % n;
                hits += local.lookup(key(i), 1).is_some() as usize;
            }
            hits == 32
        }));
        cell.push(timed("lookup", 32, round, dur, || {
            keys32.clear();
            for _ in 0..32 {
                i = (i + 7919) % n;
                keys32.push(key(i));
            }
            client
                .lookup(&keys32)
                .is_ok_and(|v| v.iter().all(|o| o.is_some()))
        }));
        cell.push(timed("lookup-1", 1, round, dur, || {
            i = (i + 7919) % n;
            client.lookup(&[key(i)]).is_ok_and(|v| v[0].is_some())
        }));
        let keys2000: Vec<PageKey> = (0..2000).map(|j| key((j * 13 + round) % n)).collect();
        cell.push(timed("exists", 2000, round, dur, || {
            client.exists(&keys2000).is_ok_and(|v| v.iter().all(|&b| b))
        }));
        let mut next = n;
        let mut batch: Vec<(PageKey, Location)> = Vec::with_capacity(32);
        cell.push(timed("insert", 32, round, dur, || {
            batch.clear();
            for _ in 0..32 {
                batch.push((key(next), location(&writer, next)));
                next += 1;
            }
            client
                .insert(&batch)
                .is_ok_and(|v| v.iter().all(|o| o.is_some()))
        }));
        Ok(())
    })?;
    let handoff = measure_handoff();
    let med = |name: &str, f: fn(&Row) -> f64| report::median_of(&rows, name, f);
    Ok(Report {
        bench: "directory".into(),
        host: Host::detect(),
        config: serde_json::json!({"entries": args.entries, "rounds": args.run.rounds, "secs": args.run.secs, "transport": "loopback rpc"}),
        summary: serde_json::json!({
            "lookup32_p50_us": med("lookup", |r| r.p50_us),
            "exists2000_p50_us": med("exists", |r| r.p50_us),
            "shard_lookups_per_s": med("shard-lookup", |r| r.pages_per_s),
            "insert32_p50_us": med("insert", |r| r.p50_us),
            "handoff_10_nodes_100k_entries_join": handoff,
        }),
        results: rows,
    })
}

/// Ten shards with 100k entries (two replicas); an eleventh node joins.
fn measure_handoff() -> serde_json::Value {
    const R: usize = 2;
    let members: Vec<NodeId> = (0..10)
        .filter_map(|i| NodeId::new(format!("node-{i}")).ok())
        .collect();
    let old = Ring::new(members.clone(), 160);
    let mut shards: HashMap<NodeId, Shard> = members
        .iter()
        .map(|m| (m.clone(), Shard::new(ShardConfig::default())))
        .collect();
    for i in 0..100_000u64 {
        for o in old.owners(key(i), R) {
            if let Some(s) = shards.get_mut(&o) {
                s.insert(key(i), location(&o, i), 0);
            }
        }
    }
    let Ok(newcomer) = NodeId::new("node-10") else {
        return serde_json::Value::Null;
    };
    let mut all = members.clone();
    all.push(newcomer.clone());
    let new = Ring::new(all, 160);
    shards.insert(newcomer.clone(), Shard::new(ShardConfig::default()));
    let t0 = Instant::now();
    let plans: Vec<_> = shards
        .iter()
        .map(|(m, s)| handoff::plan(s, m, &old, &new, R))
        .collect();
    let plan_ms = t0.elapsed().as_secs_f64() * 1e3;
    let sent: usize = plans.iter().map(|p| p.send_count()).sum();
    let dropped: usize = plans.iter().map(|p| p.drops.len()).sum();
    let idx = new.members().binary_search(&newcomer).unwrap_or(0);
    let expected = new.shares_with_replicas(R)[idx] * 100_000.0;
    serde_json::json!({"sent": sent, "dropped": dropped, "expected_share": expected.round(),
        "sent_over_expected": (sent as f64 / expected * 1000.0).round() / 1000.0, "plan_ms_all_shards": plan_ms})
}

//! Metrics over HTTP: scrape and parse `/metrics`, the dashboard, `/cluster` with three nodes,
//! and distinct series for two nodes in one process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use peercache_store::{PeerCacheConfig, Store};
use serde_json::json;

mod common;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn node(n: u8, port: u16) -> Store {
    let host = format!("127.0.0.{n}");
    let m = json!({
        "discovery_addr": format!("127.0.0.40:{port}"),
        "protocol": "tcp",
        "local_hostname": host, "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
        "metrics_bind_host": host, "metrics_port": 0,
        "global_segment_size": "16mb",
        "heartbeat_interval": 0.2, "member_ttl": 0.6,
        "cluster_secret": common::secret(),
    });
    let (cfg, _) = PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap();
    let s = Store::start(cfg).unwrap();
    s.wait_ready(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A minimal HTTP/1.0 GET (the test side only; the server is axum).
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}

#[test]
fn metrics_dashboard_cluster_and_labelled_series() {
    let port = free_port();
    let nodes: Vec<Store> = [40u8, 41, 42].iter().map(|&n| node(n, port)).collect();
    for n in &nodes {
        assert!(n.wait_members(3, Duration::from_secs(10)));
    }
    let page = vec![7u8; 8192];
    nodes[0].batch_set(&["a", "b"], &[&page, &page]).unwrap();
    let mut buf = vec![0u8; 8192];
    assert!(nodes[1].batch_get(&["a"], &mut [&mut buf[..]]).unwrap()[0]);

    let ep = nodes[0].metrics_endpoint().expect("metrics enabled");
    let (status, head, body) = get(ep, "/metrics");
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("text/plain"));
    // A real Prometheus text parser accepts it.
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition");
    assert!(!scrape.samples.is_empty());
    // No metric has two TYPE lines.
    let mut types = std::collections::HashSet::new();
    for l in body.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split_whitespace().nth(2).unwrap();
        assert!(
            types.insert(name.to_string()),
            "duplicate TYPE line for {name}"
        );
    }
    // Histograms carry buckets.
    assert!(
        body.contains("peercache_op_latency_seconds_bucket"),
        "latency is a histogram with buckets"
    );
    // Two nodes in one process: distinct labelled series.
    let writes = |node: &str| {
        scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == "peercache_write_requests_total" && s.labels.get("node") == Some(node)
            })
            .count()
    };
    assert_eq!(writes(nodes[0].node_id().as_str()), 1);
    assert_eq!(writes(nodes[1].node_id().as_str()), 1);
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "peercache_read_remote_hits_total"
                && s.labels.get("node") == Some(nodes[1].node_id().as_str())),
        "the reader's remote hit is labelled with the reader"
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("peercache_transport_ops_total")
                && s.labels.get("node").is_some()),
        "lower crates' series carry the node label too"
    );

    // `peercache-node status` asks discovery for the same members.
    let seeds = vec![format!("127.0.0.40:{port}").parse().unwrap()];
    let seen = peercache_store::tools::status::members(
        &seeds,
        Duration::from_secs(2),
        peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter()
            .all(|m| m.attrs.iter().any(|(k, _)| k == "metrics"))
    );

    let (status, _, body) = get(ep, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, head, body) = get(ep, "/");
    assert_eq!(status, 200);
    assert!(
        head.contains("text/html")
            && body.contains("PeerCache node")
            && !body.contains("http://")
            && !body.contains("https://"),
        "the dashboard is served and self-contained"
    );

    let (status, _, body) = get(ep, "/cluster");
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["members"].as_array().unwrap().len(), 3);
    assert!(
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["metrics"].is_string()),
        "each member advertises its metrics endpoint"
    );
    assert_eq!(v["node"], nodes[0].node_id().as_str());
    assert!(!v["masters"].as_array().unwrap().is_empty());
    for n in &nodes {
        n.shutdown();
    }
    let _ = std::net::TcpStream::connect_timeout(&ep, Duration::from_millis(200));
}

/// The value of one series of `node` in a scrape (0 when absent).
fn sample(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    node: &str,
    extra: &[(&str, &str)],
) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && s.labels.get("node") == Some(node))
        .filter(|s| extra.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Gauge(v) => v,
            _ => 0.0,
        })
        .sum()
}

#[test]
fn stats_and_the_scrape_read_the_same_counts() {
    let port = free_port();
    let nodes: Vec<Store> = [40u8, 47].iter().map(|&n| node(n, port)).collect();
    for n in &nodes {
        assert!(n.wait_members(2, Duration::from_secs(10)));
    }
    // Enough pages to evict from a 16 MiB pool, then reads from the other node.
    let page = vec![3u8; 64 << 10];
    let keys: Vec<String> = (0..400).map(|i| format!("k{i}")).collect();
    for chunk in keys.chunks(32) {
        let ks: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let pages: Vec<&[u8]> = ks.iter().map(|_| &page[..]).collect();
        nodes[0].batch_set(&ks, &pages).unwrap();
    }
    let mut bufs = vec![vec![0u8; 64 << 10]; 32];
    let tail: Vec<&str> = keys[keys.len() - 32..].iter().map(String::as_str).collect();
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = nodes[1].batch_get(&tail, &mut outs).unwrap();
    assert!(got.iter().all(|g| *g), "the newest pages are resident");
    // Eviction notices are sent in the background: wait until the queue drained.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while {
        let s = nodes[0].stats();
        s.evictions_notified < s.evictions_queued
    } {
        assert!(
            std::time::Instant::now() < deadline,
            "eviction notices never drained"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let ep = nodes[0].metrics_endpoint().unwrap();
    let (_, _, body) = get(ep, "/metrics");
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    let (writer, reader) = (nodes[0].stats(), nodes[1].stats());
    let (w, r) = (nodes[0].node_id().as_str(), nodes[1].node_id().as_str());
    assert!(writer.evictions_queued > 0, "the pool evicted");
    let pairs = [
        (
            "peercache_eviction_notices_total",
            w,
            vec![],
            writer.evictions_notified,
        ),
        (
            "peercache_eviction_notices_queued_total",
            w,
            vec![],
            writer.evictions_queued,
        ),
        (
            "peercache_transport_bytes_total",
            r,
            vec![("op", "read"), ("side", "client")],
            reader.transport_read_bytes,
        ),
        (
            "peercache_transport_local_read_bytes_total",
            r,
            vec![],
            reader.transport_local_read_bytes,
        ),
        (
            "peercache_read_staged_pages_total",
            r,
            vec![],
            reader.staged_reads,
        ),
        (
            "peercache_verify_rejects_total",
            r,
            vec![],
            reader.verify_rejects,
        ),
    ];
    assert!(reader.transport_read_bytes >= 32 * (64 << 10));
    for (name, node, extra, stat) in pairs {
        assert_eq!(
            sample(&scrape, name, node, &extra),
            stat as f64,
            "{name} on {node}: the series and stats() disagree"
        );
    }
}

/// Every series name the docs mention (`peercache_…` in README.md and docs/*.md, English
/// pages), without module paths (`peercache_store::…`), log filters (`peercache_pool=debug`)
/// and prefixes (`peercache_disk_*`).
fn documented_series() -> std::collections::BTreeSet<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut pages = vec![std::path::PathBuf::from(format!("{root}/README.md"))];
    for e in std::fs::read_dir(format!("{root}/docs")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".md") && !name.ends_with(".zh.md") {
            pages.push(p);
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("peercache_") {
            // `vllm:peercache_*` are the vLLM connector's series, on vLLM's own `/metrics`.
            let engine_series = rest[..at].ends_with("vllm:");
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            let (name, after) = tail.split_at(end);
            rest = after;
            let module_or_filter = after.starts_with(':') || after.starts_with('=');
            if engine_series || module_or_filter || name.ends_with('_') || name == "peercache_bench"
            {
                continue;
            }
            names.insert(name.to_string());
        }
    }
    names
}

/// The series a scrape shows for `node`.
fn series_of(scrape: &prometheus_parse::Scrape, node: &str) -> std::collections::BTreeSet<String> {
    scrape
        .samples
        .iter()
        .filter(|s| s.labels.get("node") == Some(node))
        .map(|s| s.metric.clone())
        .collect()
}

/// A plain TCP node alone on 127.0.0.`n` — no disk tier, no secret — with its metrics on an
/// ephemeral port.
fn plain_node(n: u8) -> Store {
    let host = format!("127.0.0.{n}");
    let m = json!({
        "discovery_addr": format!("{host}:{}", free_port()), "protocol": "tcp",
        "local_hostname": host, "rdma_bind_host": host, "control_bind_host": host,
        "meta_bind_host": host, "metrics_bind_host": host, "metrics_port": 0,
        "global_segment_size": "16mb",
    });
    let (cfg, _) = PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap();
    let s = Store::start(cfg).unwrap();
    s.wait_ready(Some(Duration::from_secs(10))).unwrap();
    s
}

#[test]
fn every_documented_series_is_there_from_the_start() {
    let documented = documented_series();
    assert!(
        documented.len() > 50,
        "the docs name {} series",
        documented.len()
    );
    // A plain TCP node without the disk tier or a secret: the RDMA, disk and authentication
    // series are registered anyway, at 0.
    let s = plain_node(43);
    let ep = s.metrics_endpoint().expect("metrics enabled");
    let me = s.node_id().to_string();

    let parse = |body: String| {
        prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("valid exposition")
    };
    let scrape = parse(get(ep, "/metrics").2);
    let fresh = series_of(&scrape, &me);
    // Histograms render once they hold a sample (the docs say so): one call of each kind.
    let histograms: Vec<&String> = documented
        .iter()
        .filter(|n| n.contains("_seconds"))
        .collect();
    let missing: Vec<&String> = documented
        .iter()
        .filter(|n| !n.contains("_seconds") && !fresh.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "documented but not exported at start: {missing:?}"
    );
    for name in [
        "peercache_rdma_read_ops_total",
        "peercache_disk_disabled",
        "peercache_auth_rejected_total",
    ] {
        assert_eq!(sample(&scrape, name, &me, &[]), 0.0, "{name} at 0");
    }

    let page = vec![3u8; 4096];
    s.batch_set(&["h"], &[&page]).unwrap();
    s.batch_exists(&["h"]).unwrap();
    let mut buf = vec![0u8; 4096];
    s.batch_get(&["h"], &mut [&mut buf[..]]).unwrap();
    let after = series_of(&parse(get(ep, "/metrics").2), &me);
    for h in histograms {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .fold(h.as_str(), |n, suffix| n.trim_end_matches(suffix));
        assert!(
            after.contains(family) || after.contains(&format!("{family}_count")),
            "histogram {h} after one call of each kind"
        );
    }
    s.shutdown();
}

/// The rows of docs/operations.md's "Series of PeerCache 0.8.4" table (or its translation's):
/// (0.8.4 name, series here, type).
fn compat_table(page: &str) -> Vec<(String, String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(page);
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("0.8.4").expect("the 0.8.4 section");
    let section = &text[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> = l
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            (cells[1].clone(), cells[2].clone(), cells[3].clone())
        })
        .collect()
}

#[test]
fn every_series_of_0_8_4_is_exported_under_its_name_with_its_type() {
    let rows = compat_table("operations.md");
    assert!(rows.len() >= 40, "the table has {} rows", rows.len());
    assert_eq!(
        compat_table("operations.zh.md"),
        rows,
        "the translation's table lists the same names and types"
    );
    // A plain TCP node without the disk tier: the RDMA and disk series are there anyway.
    let s = plain_node(44);
    // One call of each kind, so the latency histogram has samples.
    let page = vec![5u8; 4096];
    s.batch_set(&["c"], &[&page]).unwrap();
    s.batch_exists(&["c"]).unwrap();
    let mut buf = vec![0u8; 4096];
    s.batch_get(&["c"], &mut [&mut buf[..]]).unwrap();
    assert_eq!(buf, page);

    let ep = s.metrics_endpoint().expect("metrics enabled");
    let me = s.node_id().to_string();
    let body = get(ep, "/metrics").2;
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("valid exposition");
    for (old, series, kind) in &rows {
        let typed: Vec<&str> = scrape
            .samples
            .iter()
            .filter(|x| x.labels.get("node") == Some(me.as_str()))
            .filter(|x| x.metric == *series || x.metric == format!("{series}_count"))
            .map(|x| match x.value {
                prometheus_parse::Value::Counter(_) => "counter",
                prometheus_parse::Value::Gauge(_) => "gauge",
                prometheus_parse::Value::Histogram(_) => "histogram",
                prometheus_parse::Value::Summary(_) => "summary",
                prometheus_parse::Value::Untyped(_) => "untyped",
            })
            .collect();
        assert!(
            !typed.is_empty(),
            "0.8.4's `{old}`: no `{series}` on this node"
        );
        // A histogram's `_count` line parses as untyped on its own; its family is typed.
        let declared = body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# TYPE {series} ")))
            .unwrap_or("");
        assert!(
            typed.iter().all(|t| t == kind) || declared == kind,
            "0.8.4's `{old}`: `{series}` is {typed:?} (# TYPE {declared}), the table says {kind}"
        );
    }
    s.shutdown();
}

#[test]
fn every_series_has_help_and_every_grafana_query_names_exported_series() {
    let s = plain_node(45);
    let page = vec![7u8; 4096];
    s.batch_set(&["g"], &[&page]).unwrap();
    let mut buf = vec![0u8; 4096];
    s.batch_get(&["g"], &mut [&mut buf[..]]).unwrap();
    let body = get(s.metrics_endpoint().unwrap(), "/metrics").2;
    s.shutdown();

    // Every family has a `# HELP` line (its name's doc comment), as promtool asks.
    let typed: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(typed.len() > 80, "{} families", typed.len());
    for family in &typed {
        let help = body
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {family} ")));
        assert!(
            help.is_some_and(|h| h.len() > 10),
            "`{family}` has no help text"
        );
    }

    // Every series a query of the shipped Grafana dashboard names is exported.
    let board: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| match (k.as_str(), v) {
                ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                _ => exprs(v, out),
            }),
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let mut queries = Vec::new();
    exprs(&board, &mut queries);
    assert!(queries.len() >= 10, "{queries:?}");
    let exported: std::collections::BTreeSet<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    for q in &queries {
        let mut rest = q.as_str();
        while let Some(at) = rest.find("peercache_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            assert!(
                exported.contains(name),
                "the Grafana query {q:?} names `{name}`, which a node does not export"
            );
            rest = &tail[end..];
        }
    }
}

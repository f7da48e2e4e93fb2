//! Metrics for operators: one Prometheus recorder per process, every series of a node
//! labelled `node=<id>`, and a small HTTP server per node (`/metrics`, `/healthz`,
//! `/cluster`, and a dashboard at `/`).
//!
//! The lower crates register their metric handles when a node starts; the node runs that
//! start-up under a recorder that adds its `node` label, so several nodes in one process keep
//! their series apart.

pub mod read_timing;
pub mod series;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, Weak};

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::node::core::{Core, NodeCell};
use crate::serve::http::{HttpLimits, HttpServer};

/// Latency buckets in seconds: 20 µs to 5 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0,
];

struct Global {
    recorder: &'static PrometheusRecorder,
    handle: PrometheusHandle,
}

static GLOBAL: OnceLock<Global> = OnceLock::new();

/// Forwards to the process recorder (installed as the global one).
struct Forward(&'static PrometheusRecorder);

impl Recorder for Forward {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.0.describe_histogram(k, u, d)
    }
    fn register_counter(&self, k: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(k, m)
    }
    fn register_gauge(&self, k: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(k, m)
    }
    fn register_histogram(&self, k: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(k, m)
    }
}

/// Adds `node=<id>` to every series registered through it.
pub(crate) struct NodeRecorder {
    inner: &'static PrometheusRecorder,
    node: String,
}

impl NodeRecorder {
    fn key(&self, k: &Key) -> Key {
        if k.labels().any(|l| l.key() == "node") {
            return k.clone();
        }
        let mut labels: Vec<Label> = k.labels().cloned().collect();
        labels.push(Label::new("node", self.node.clone()));
        Key::from_parts(k.name().to_string(), labels)
    }
}

impl Recorder for NodeRecorder {
    fn describe_counter(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_counter(k, u, d)
    }
    fn describe_gauge(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_gauge(k, u, d)
    }
    fn describe_histogram(&self, k: KeyName, u: Option<Unit>, d: SharedString) {
        self.inner.describe_histogram(k, u, d)
    }
    fn register_counter(&self, k: &Key, m: &Metadata<'_>) -> Counter {
        self.inner.register_counter(&self.key(k), m)
    }
    fn register_gauge(&self, k: &Key, m: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(&self.key(k), m)
    }
    fn register_histogram(&self, k: &Key, m: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(&self.key(k), m)
    }
}

/// The process recorder, installed on first use (as the global recorder when none is set).
fn global() -> &'static Global {
    GLOBAL.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(LATENCY_BUCKETS)
            .expect("latency buckets are non-empty")
            .build_recorder();
        let handle = recorder.handle();
        let recorder: &'static PrometheusRecorder = Box::leak(Box::new(recorder));
        // `# HELP` for every series of every crate (their doc comments).
        metrics::with_local_recorder(recorder, crate::observe::series::describe_all);
        if metrics::set_global_recorder(Forward(recorder)).is_err() {
            tracing::debug!(
                "a metrics recorder was already installed; node-labelled series still render here"
            );
        }
        Global { recorder, handle }
    })
}

/// The recorder a node registers its handles through.
pub(crate) fn node_recorder(node: &str) -> NodeRecorder {
    NodeRecorder {
        inner: global().recorder,
        node: node.to_string(),
    }
}

/// The Prometheus text of every series in this process.
pub fn render() -> String {
    let g = global();
    g.handle.run_upkeep();
    g.handle.render()
}

/// What the HTTP port serves besides `/metrics` and `/healthz`.
pub(crate) struct Pages {
    /// The dashboard at `/` (a static page; its data comes from `/cluster` and `/metrics`).
    pub(crate) dashboard: bool,
    /// The token `/cluster` and `/prefix` require (`None`: `/cluster` open, `/prefix` open
    /// only on a cluster without a secret).
    pub(crate) guard: Option<crate::serve::bearer::BearerGuard>,
}

/// Serves `/metrics`, `/healthz`, `/cluster`, `/prefix` and `/` for the node behind `inner` on
/// `bind` (an ephemeral port if that one is taken).
pub(crate) fn serve(
    bind: SocketAddr,
    inner: NodeCell,
    pages: Pages,
    limits: HttpLimits,
    refused: metrics::Counter,
) -> std::io::Result<HttpServer> {
    HttpServer::start(bind, routes(inner, pages), limits, refused)
}

fn node(cell: &NodeCell) -> Option<Arc<Core>> {
    cell.get().and_then(Weak::upgrade)
}

fn routes(inner: NodeCell, pages: Pages) -> axum::Router {
    use axum::http::header;
    use axum::response::IntoResponse;
    use axum::routing::get;
    let cluster_inner = inner.clone();
    let prefix = crate::serve::prefix::route(inner.clone(), pages.guard.clone());
    let mut app = axum::Router::new()
        .route("/prefix", prefix)
        .route(
            "/metrics",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    render(),
                )
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let alive = node(&inner)
                    .is_some_and(|i| !i.stopping.load(std::sync::atomic::Ordering::Acquire));
                async move {
                    if alive {
                        (axum::http::StatusCode::OK, "ok").into_response()
                    } else {
                        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stopping").into_response()
                    }
                }
            }),
        )
        .route(
            "/cluster",
            get(move |headers: axum::http::HeaderMap| {
                let admitted = pages.guard.as_ref().is_none_or(|g| g.admits(&headers));
                let view = admitted
                    .then(|| node(&cluster_inner).map(|i| cluster_view(&i)))
                    .flatten();
                async move {
                    if !admitted {
                        return (
                            axum::http::StatusCode::UNAUTHORIZED,
                            [(header::WWW_AUTHENTICATE, "Bearer")],
                            "a bearer token is required (http_token_file)",
                        )
                            .into_response();
                    }
                    match view {
                        Some(v) => axum::Json(v).into_response(),
                        None => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "stopping")
                            .into_response(),
                    }
                }
            }),
        );
    if pages.dashboard {
        app = app.route(
            "/",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    DASHBOARD,
                )
            }),
        );
    }
    app
}

/// The `/cluster` document.
pub(crate) fn cluster_view(inner: &Arc<Core>) -> serde_json::Value {
    let members: Vec<serde_json::Value> = inner
        .discovery
        .members()
        .into_iter()
        .map(|m| {
            let metrics = m.attrs.iter().find(|(k, _)| k == "metrics").map(|(_, v)| v.clone());
            serde_json::json!({
                "node": m.node.as_str(), "host": m.host.to_string(),
                "control": m.control.to_string(), "data": m.data.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
                "meta": m.meta.map(|a| a.to_string()), "role": m.role, "metrics": metrics,
            })
        })
        .collect();
    let pool = inner.pool.stats();
    let ready = inner.pool.readiness();
    let t = inner.transport.stats();
    let d = inner.dir.stats();
    let peers: Vec<serde_json::Value> = inner
        .transport
        .peer_stats()
        .into_iter()
        .map(|p| serde_json::json!({"peer": p.peer.to_string(), "errors": p.errors, "timeouts": p.timeouts, "suspect": p.suspect}))
        .collect();
    serde_json::json!({
        "node": inner.id.me.as_str(),
        "authenticated": inner.id.auth_enabled, "insecure": inner.cfg.insecure,
        "masters": inner.discovery.masters().iter().map(|m| m.to_string()).collect::<Vec<_>>(),
        "discovery": {"kind": inner.discovery.kind(), "sources": inner.discovery.sources(),
                      "stale": inner.discovery.is_stale()},
        "members": members,
        "shard_entries": inner.dir_service.with_shard(|s, _| s.len()),
        "ring": {"members": inner.dir.ring().members().len(),
                 "changed_ms_ago": inner.dir.ring_age().as_millis() as u64},
        "pool": {"capacity": pool.capacity, "bytes_used": pool.bytes_used, "retained": pool.retained,
                 "ready_bytes": ready.ready_bytes, "ready": ready.is_ready(),
                 "reclaimable": pool.reclaimable, "evicted": pool.evicted_retained + pool.evicted_reclaimable,
                 "verify_rejects": pool.verify_rejects},
        // The disk tier (null when off): `recovering` while it scans a previous run's segments.
        "disk": inner.disk.as_ref().map(|d| {
            let s = d.stats();
            serde_json::json!({"keys": s.keys, "bytes_used": s.bytes, "recovering": s.recovering})
        }),
        "transport": {"read_bytes": t.read_bytes, "write_bytes": t.write_bytes, "timeouts": t.timeouts,
                      "suspect_marks": t.suspect_marks, "served_bytes": t.served_bytes,
                      "local_read_bytes": t.local_read_bytes, "local_peers": t.local_peers,
                      "local_leases": t.local_leases},
        "rdma": inner.transport.rdma_stats().map(|r| serde_json::json!({
            "read_ops": r.read_ops, "read_bytes": r.read_bytes, "fallbacks": r.fallbacks,
            "write_ops": r.write_ops, "write_bytes": r.write_bytes,
            "lazy_registrations": r.lazy_registrations, "lazy_mr_hits": r.lazy_mr_hits,
            "lazy_mrs": r.lazy_mrs,
            "op_errors": r.op_errors, "wc_errors": r.wc_errors, "last_wc_status": r.last_wc_status,
            "timeouts": r.timeouts, "channel_discards": r.channel_discards,
            "post_failures": r.post_failures, "lease_failures": r.lease_failures, "table_fetches": r.table_fetches,
            "peers_unavailable": r.peers_unavailable,
            // Bytes registered with the NIC, and still waiting for their chunk (`rdma_register_chunk`).
            "registered_bytes": r.registered_bytes, "registering_bytes": r.registering_bytes,
            // Peers read over TCP for now, and why (a failed region-table fetch or QP connect).
            "peers_on_tcp": inner.transport.rdma_peers_on_tcp().iter().map(|p| serde_json::json!({
                "peer": p.peer.to_string(), "why": p.why, "retry_in_s": p.retry_in.as_secs_f64(),
            })).collect::<Vec<_>>(),
        })),
        "directory": {"rpcs": d.rpcs, "local_calls": d.local_calls, "errors": d.rpc_errors, "fallbacks": d.fallbacks},
        "peers": peers,
    })
}

/// The dashboard: one self-contained page (no external assets) polling `/metrics` and
/// `/cluster`.
const DASHBOARD: &str = include_str!("dashboard.html");

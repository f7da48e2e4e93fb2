//! [`PeerCacheConfig`]: every setting of a node, from SGLang's `extra_config` JSON, a TOML
//! file and `PEERCACHE_<KEY>` environment overrides (in that order of precedence, lowest
//! first). Key names follow the original PeerCache so existing launch configs keep working.
//! Every key is documented in `docs/configuration.md` (a test checks that).

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

/// A setting that could not be accepted.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// A value of the wrong type or out of range.
    #[error("config key `{key}` = {value}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// The value given (as text).
        value: String,
        /// What is accepted.
        reason: String,
    },
    /// A required key is missing.
    #[error("config key `{0}` is required (e.g. \"discovery_addr\": \"10.0.0.1:31998\")")]
    Missing(&'static str),
    /// No cluster secret, yet the node would be reachable beyond loopback.
    #[error(
        "no cluster_secret set, but this node is reachable beyond loopback ({}): set \
         cluster_secret (or PEERCACHE_CLUSTER_SECRET / cluster_secret_file, ≥ 16 bytes, e.g. \
         `openssl rand -hex 32`) on every node, or bind to 127.0.0.x, or accept an open node \
         with insecure = true",
        reachable.join(", ")
    )]
    Unauthenticated {
        /// The settings that make it reachable.
        reachable: Vec<String>,
    },
    /// The config file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Deployment mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every node publishes its own pages; reads go peer to peer.
    P2p,
    /// p2p plus storage servers, by `write_policy`.
    Hybrid,
    /// Inference nodes write into storage servers.
    Centralized,
    /// Directory-free slot placement.
    Slotmap,
}

/// Where hybrid mode writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePolicy {
    /// Local pool (p2p).
    Local,
    /// Storage servers.
    Storage,
    /// Both.
    Both,
}

/// What a node is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Decided by the binary: inference in the store, storage in the storage server.
    Auto,
    /// An inference rank.
    Inference,
    /// A storage server.
    Storage,
}

/// Data-plane protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RDMA, falling back to TCP with one log line when no device exists.
    Rdma,
    /// TCP.
    Tcp,
}

/// Which RDMA backend `protocol = "rdma"` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdmaBackend {
    /// rdma-core devices (feature `rdma`).
    Verbs,
    /// The in-process software fabric (tests, demos).
    Soft,
}

/// The shared cluster secret. `Debug` prints `<redacted>`, and errors never echo it.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret from text.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret text (empty: none set).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no secret is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<none>"
        } else {
            "<redacted>"
        })
    }
}

/// Every setting of a PeerCache node.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerCacheConfig {
    /// Seed list `host:port[,host:port…]` (one cluster-wide meta port). Required.
    pub discovery_addr: String,
    /// Deployment mode.
    pub mode: Mode,
    /// Hybrid write policy.
    pub write_policy: WritePolicy,
    /// Node role.
    pub role: Role,
    /// Data-plane protocol.
    pub protocol: Protocol,
    /// One RDMA device (empty: the first).
    pub device_name: String,
    /// Comma-separated RDMA devices, one rail each (overrides `device_name`).
    pub device_names: Vec<String>,
    /// `device_names` given per local rank (`{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`): the one
    /// SGLang extra config names every rank's NICs; `device_names` is resolved from it.
    pub device_names_by_rank: BTreeMap<u32, Vec<String>>,
    /// RDMA backend: `verbs` (rdma-core NICs) or `soft` (an in-process software fabric that
    /// every node of this process shares — for tests and demos of the RDMA path).
    pub rdma_backend: RdmaBackend,
    /// Read into (and write from) caller memory outside registered host buffers directly —
    /// registered per batch on RDMA — instead of through staging and a copy.
    pub lazy_registration: bool,
    /// Peers on the same host read this node's pool straight from shared memory (a sealed
    /// memory file they map read-only), and this node theirs, instead of over the network.
    pub host_local: bool,
    /// Storage-server writes go one-sided over RDMA (both writer and storage server must set
    /// it); the reservation guard then cannot run per write, verified commits still hold.
    pub rdma_writes: bool,
    /// RDMA port.
    pub ib_port: u8,
    /// RDMA GID index (-1: no GRH).
    pub gid_index: i32,
    /// Connections (channels) per peer.
    pub max_channels_per_peer: usize,
    /// Pool bytes per host, divided by `tp_size`.
    pub global_segment_size: u64,
    /// Virtual nodes per member on the directory ring.
    pub vnodes: u32,
    /// Ring owners per directory entry.
    pub directory_replicas: usize,
    /// Seconds a looked-up location may be reused (0: off).
    pub directory_read_cache_ttl: f64,
    /// Address advertised to peers (empty: the local address that routes to the seeds).
    pub local_hostname: String,
    /// Data server bind host.
    pub rdma_bind_host: String,
    /// Data server port (0: any).
    pub rdma_port: u16,
    /// Control server bind host.
    pub control_bind_host: String,
    /// Control server port (0: any).
    pub control_port: u16,
    /// Serve the client API (put/get/exists for processes that do not embed a node).
    pub client_enabled: bool,
    /// Client API base port on the control bind host (0: any; each rank adds its local rank).
    pub client_port: u16,
    /// Embedded discovery server bind host.
    pub meta_bind_host: String,
    /// Disk tier on.
    pub disk_enabled: bool,
    /// Disk tier folder (empty: a per-user data folder); a `<node_id>/` subfolder is used.
    pub disk_path: String,
    /// Disk tier capacity.
    pub disk_size: u64,
    /// Metrics HTTP server on.
    pub metrics_enabled: bool,
    /// Metrics bind host.
    pub metrics_bind_host: String,
    /// Metrics base port (each rank adds its local rank offset).
    pub metrics_port: u16,
    /// Serve the HTML dashboard.
    pub metrics_dashboard: bool,
    /// Stable ring identity (empty: derived from host, meta port, ranks and prefix).
    pub node_id: String,
    /// Keyspace tag: every key becomes `<prefix>_<key>`.
    pub prefix: String,
    /// Pass-through flag SGLang reads to enable the zero-copy v1 path.
    pub interface_v1: bool,
    /// Slotmap payload size class.
    pub slot_max_page_bytes: u64,
    /// Slotmap associativity.
    pub slot_ways: u32,
    /// Slotmap buckets (0: derive from the region size).
    pub slot_num_buckets: u64,
    /// Discovery heartbeat, seconds.
    pub heartbeat_interval: f64,
    /// Seconds a silent member is kept by a discovery server.
    pub member_ttl: f64,
    /// Active discovery masters.
    pub max_masters: usize,
    /// Deadline of one network operation (transport batch, directory fan-out), seconds.
    pub op_timeout: f64,
    /// Seconds a peer that timed out is failed fast.
    pub suspect_for: f64,
    /// Seconds an exists → get hand-off stays valid.
    pub exists_prime_ttl: f64,
    /// Largest control-plane frame (directory, discovery and store requests and replies).
    pub max_frame_bytes: u64,
    /// Most inbound connections each server (data, control) accepts at once.
    pub max_inbound_connections: usize,
    /// Eviction-notice batches queued for the background batcher before writers wait.
    pub eviction_queue_depth: usize,
    /// Pages queued for the disk tier's writer; when full, write-through skips (counted).
    pub disk_queue_depth: usize,
    /// Seconds a storage server keeps a slot reserved for a remote writer before releasing it.
    pub reservation_timeout: f64,
    /// Keep pages fetched from peers as local reclaimable replicas and register them.
    pub replicate_on_read: bool,
    /// Milliseconds `batch_exists` waits for a complete prefix (0: answer at once). For decode
    /// nodes in prefill/decode disaggregation.
    pub exists_wait_ms: u64,
    /// Most entries in this node's directory shard.
    pub directory_max_entries: u64,
    /// Live owners at which a new copy is demoted to reclaimable.
    pub reclaim_threshold: u16,
    /// Most ops in one transport batch.
    pub max_batch_ops: usize,
    /// Seconds the node binaries wait for discovery before giving up (0: forever).
    pub startup_timeout: f64,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Log filter of the node binaries (`RUST_LOG` overrides it), e.g. `info` or
    /// `peercache_transport=debug,info`.
    pub log_level: String,
    /// Shared secret every connection proves in the handshake (empty: open cluster).
    pub cluster_secret: Secret,
    /// File holding the cluster secret (used when `cluster_secret` is empty).
    pub cluster_secret_file: String,
    /// Another secret accepted from peers during a rolling rotation (empty: none).
    pub cluster_secret_accept: Secret,
    /// Run without a cluster secret although the node is reachable beyond loopback (the
    /// explicit opt-out; shown in the start-up line and in `/cluster`).
    pub insecure: bool,
}

impl Default for PeerCacheConfig {
    fn default() -> Self {
        PeerCacheConfig {
            discovery_addr: String::new(),
            mode: Mode::P2p,
            write_policy: WritePolicy::Local,
            role: Role::Auto,
            protocol: Protocol::Rdma,
            device_name: String::new(),
            device_names: Vec::new(),
            device_names_by_rank: BTreeMap::new(),
            rdma_backend: RdmaBackend::Verbs,
            rdma_writes: false,
            lazy_registration: true,
            host_local: true,
            ib_port: 1,
            gid_index: 3,
            max_channels_per_peer: 16,
            global_segment_size: 4 << 30,
            vnodes: 160,
            directory_replicas: 2,
            directory_read_cache_ttl: 0.0,
            local_hostname: String::new(),
            rdma_bind_host: "0.0.0.0".into(),
            rdma_port: 0,
            control_bind_host: "0.0.0.0".into(),
            control_port: 0,
            client_enabled: false,
            client_port: 0,
            meta_bind_host: "0.0.0.0".into(),
            disk_enabled: false,
            disk_path: String::new(),
            disk_size: 100 << 30,
            metrics_enabled: true,
            metrics_bind_host: "0.0.0.0".into(),
            metrics_port: 31997,
            metrics_dashboard: true,
            node_id: String::new(),
            prefix: String::new(),
            interface_v1: false,
            slot_max_page_bytes: 262_144,
            slot_ways: 4,
            slot_num_buckets: 0,
            heartbeat_interval: 1.0,
            member_ttl: 3.0,
            max_masters: 3,
            op_timeout: 2.0,
            suspect_for: 2.0,
            exists_prime_ttl: 1.0,
            exists_wait_ms: 0,
            replicate_on_read: false,
            reservation_timeout: 5.0,
            max_frame_bytes: 64 << 20,
            max_inbound_connections: 4096,
            eviction_queue_depth: 256,
            disk_queue_depth: 256,
            directory_max_entries: 4_000_000,
            reclaim_threshold: 3,
            max_batch_ops: 8192,
            startup_timeout: 30.0,
            tp_rank: 0,
            tp_size: 1,
            pp_rank: 0,
            pp_size: 1,
            dp_rank: 0,
            log_level: "info".into(),
            cluster_secret: Secret::default(),
            cluster_secret_file: String::new(),
            insecure: false,
            cluster_secret_accept: Secret::default(),
        }
    }
}

/// Every key this build understands.
pub const KEYS: &[&str] = &[
    "discovery_addr",
    "mode",
    "write_policy",
    "role",
    "protocol",
    "device_name",
    "device_names",
    "rdma_backend",
    "rdma_writes",
    "lazy_registration",
    "host_local",
    "ib_port",
    "gid_index",
    "max_channels_per_peer",
    "global_segment_size",
    "vnodes",
    "directory_replicas",
    "directory_read_cache_ttl",
    "local_hostname",
    "rdma_bind_host",
    "rdma_port",
    "control_bind_host",
    "control_port",
    "client_enabled",
    "client_port",
    "meta_bind_host",
    "disk_enabled",
    "disk_path",
    "disk_size",
    "metrics_enabled",
    "metrics_bind_host",
    "metrics_port",
    "metrics_dashboard",
    "node_id",
    "prefix",
    "interface_v1",
    "slot_max_page_bytes",
    "slot_ways",
    "slot_num_buckets",
    "heartbeat_interval",
    "member_ttl",
    "max_masters",
    "op_timeout",
    "suspect_for",
    "exists_prime_ttl",
    "exists_wait_ms",
    "replicate_on_read",
    "reservation_timeout",
    "max_frame_bytes",
    "max_inbound_connections",
    "eviction_queue_depth",
    "disk_queue_depth",
    "directory_max_entries",
    "reclaim_threshold",
    "max_batch_ops",
    "startup_timeout",
    "tp_rank",
    "tp_size",
    "pp_rank",
    "pp_size",
    "dp_rank",
    "log_level",
    "cluster_secret",
    "cluster_secret_file",
    "cluster_secret_accept",
    "insecure",
];

/// Keys SGLang itself puts into `extra_config`: accepted silently.
pub const SGLANG_KEYS: &[&str] = &[
    "backend_name",
    "module_path",
    "class_name",
    "interface_v1",
    "allocator",
    "tp_rank",
    "tp_size",
    "pp_rank",
    "pp_size",
    "is_mla_model",
    "is_page_first_layout",
    "model_name",
    "extra_config",
    "hicache_storage_backend",
];

/// Parses a size: an integer, or a number with `k`/`m`/`g`/`t` (optionally `b`, `ib`) units,
/// powers of two: `"4gb"` = 4 GiB.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase().replace('_', "");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    if num.contains('.') {
        let f: f64 = num.parse().ok()?;
        (f >= 0.0 && f.is_finite()).then_some((f * mult as f64) as u64)
    } else {
        num.parse::<u64>().ok()?.checked_mul(mult)
    }
}

/// Parses a boolean: `1/true/yes/on` and `0/false/no/off`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" | "" => Some(false),
        _ => None,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn bad(key: &'static str, v: &Value, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        value: text(v),
        reason: reason.into(),
    }
}

fn as_u64(key: &'static str, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| bad(key, v, "expected a non-negative integer")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| bad(key, v, "expected a non-negative integer")),
        _ => Err(bad(key, v, "expected a non-negative integer")),
    }
}

fn as_i64(key: &'static str, v: &Value) -> Result<i64, ConfigError> {
    match v {
        Value::Number(n) => n.as_i64().ok_or_else(|| bad(key, v, "expected an integer")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| bad(key, v, "expected an integer")),
        _ => Err(bad(key, v, "expected an integer")),
    }
}

fn as_f64(key: &'static str, v: &Value) -> Result<f64, ConfigError> {
    let f = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match f {
        Some(f) if f.is_finite() && f >= 0.0 => Ok(f),
        _ => Err(bad(key, v, "expected a non-negative number of seconds")),
    }
}

fn as_size(key: &'static str, v: &Value) -> Result<u64, ConfigError> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| bad(key, v, "expected a size such as 4gb or 1073741824")),
        Value::String(s) => parse_size(s)
            .ok_or_else(|| bad(key, v, "expected a size such as 4gb, 512mb or 1073741824")),
        _ => Err(bad(key, v, "expected a size such as 4gb or 1073741824")),
    }
}

fn as_bool(key: &'static str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => Ok(n.as_f64().is_some_and(|x| x != 0.0)),
        Value::String(s) => {
            parse_bool(s).ok_or_else(|| bad(key, v, "expected 1/true/yes/on or 0/false/no/off"))
        }
        _ => Err(bad(key, v, "expected a boolean")),
    }
}

/// A device list (`"mlx5_0,mlx5_1"` or `["mlx5_0", "mlx5_1"]`) without duplicates; `whole` is
/// the key's value, for the error.
fn device_list(whole: &Value, v: &Value) -> Result<Vec<String>, ConfigError> {
    let list: Vec<String> = match v {
        Value::Array(items) => items.iter().map(as_str).collect(),
        _ => as_str(v).split(',').map(|s| s.trim().to_string()).collect(),
    };
    let list: Vec<String> = list.into_iter().filter(|s| !s.is_empty()).collect();
    let mut seen = std::collections::HashSet::new();
    if !list.iter().all(|d| seen.insert(d.clone())) {
        return Err(bad("device_names", whole, "duplicate device"));
    }
    Ok(list)
}

fn as_str(v: &Value) -> String {
    text(v).trim().to_string()
}

fn ranged<T: PartialOrd + std::fmt::Display + Copy>(
    key: &'static str,
    v: &Value,
    x: T,
    lo: T,
    hi: T,
) -> Result<T, ConfigError> {
    if x < lo || x > hi {
        return Err(bad(key, v, format!("must be within {lo}..={hi}")));
    }
    Ok(x)
}

fn port(key: &'static str, v: &Value) -> Result<u16, ConfigError> {
    let p = as_u64(key, v)?;
    Ok(ranged(key, v, p, 0, 65535)? as u16)
}

impl PeerCacheConfig {
    fn set(&mut self, key: &str, v: &Value) -> Result<bool, ConfigError> {
        match key {
            "discovery_addr" => self.discovery_addr = as_str(v),
            "mode" => {
                self.mode = match as_str(v).to_ascii_lowercase().as_str() {
                    "p2p" => Mode::P2p,
                    "hybrid" => Mode::Hybrid,
                    "centralized" => Mode::Centralized,
                    "slotmap" => Mode::Slotmap,
                    _ => {
                        return Err(bad(
                            "mode",
                            v,
                            "expected p2p, hybrid, centralized or slotmap",
                        ));
                    }
                }
            }
            "write_policy" => {
                self.write_policy = match as_str(v).to_ascii_lowercase().as_str() {
                    "local" => WritePolicy::Local,
                    "storage" => WritePolicy::Storage,
                    "both" => WritePolicy::Both,
                    _ => return Err(bad("write_policy", v, "expected local, storage or both")),
                }
            }
            "role" => {
                self.role = match as_str(v).to_ascii_lowercase().as_str() {
                    "auto" => Role::Auto,
                    "inference" => Role::Inference,
                    "storage" => Role::Storage,
                    _ => return Err(bad("role", v, "expected auto, inference or storage")),
                }
            }
            "protocol" => {
                self.protocol = match as_str(v).to_ascii_lowercase().as_str() {
                    "rdma" => Protocol::Rdma,
                    "tcp" => Protocol::Tcp,
                    _ => return Err(bad("protocol", v, "expected rdma or tcp")),
                }
            }
            "device_name" => self.device_name = as_str(v),
            "device_names" => match v {
                Value::Object(per_rank) => {
                    let mut by_rank = BTreeMap::new();
                    for (rank, devs) in per_rank {
                        let r: u32 = rank.trim().parse().map_err(|_| {
                            bad(
                                "device_names",
                                v,
                                format!("`{rank}` is not a local rank (expected 0, 1, …)"),
                            )
                        })?;
                        by_rank.insert(r, device_list(v, devs)?);
                    }
                    self.device_names_by_rank = by_rank;
                }
                _ => self.device_names = device_list(v, v)?,
            },
            "rdma_writes" => self.rdma_writes = as_bool("rdma_writes", v)?,
            "lazy_registration" => self.lazy_registration = as_bool("lazy_registration", v)?,
            "host_local" => self.host_local = as_bool("host_local", v)?,
            "rdma_backend" => {
                self.rdma_backend = match as_str(v).to_ascii_lowercase().as_str() {
                    "verbs" => RdmaBackend::Verbs,
                    "soft" => RdmaBackend::Soft,
                    _ => return Err(bad("rdma_backend", v, "expected verbs or soft")),
                }
            }
            "ib_port" => self.ib_port = ranged("ib_port", v, as_u64("ib_port", v)?, 1, 255)? as u8,
            "gid_index" => {
                self.gid_index = ranged("gid_index", v, as_i64("gid_index", v)?, -1, 255)? as i32
            }
            "max_channels_per_peer" => {
                self.max_channels_per_peer = ranged(
                    key_static(key),
                    v,
                    as_u64("max_channels_per_peer", v)?,
                    1,
                    1024,
                )? as usize
            }
            "global_segment_size" => {
                self.global_segment_size = ranged(
                    "global_segment_size",
                    v,
                    as_size("global_segment_size", v)?,
                    1 << 20,
                    u64::MAX,
                )?
            }
            "vnodes" => self.vnodes = ranged("vnodes", v, as_u64("vnodes", v)?, 1, 4096)? as u32,
            "directory_replicas" => {
                self.directory_replicas = ranged(
                    "directory_replicas",
                    v,
                    as_u64("directory_replicas", v)?,
                    1,
                    8,
                )? as usize
            }
            "directory_read_cache_ttl" => {
                self.directory_read_cache_ttl = as_f64("directory_read_cache_ttl", v)?
            }
            "local_hostname" => self.local_hostname = as_str(v),
            "rdma_bind_host" => self.rdma_bind_host = as_str(v),
            "rdma_port" => self.rdma_port = port("rdma_port", v)?,
            "control_bind_host" => self.control_bind_host = as_str(v),
            "control_port" => self.control_port = port("control_port", v)?,
            "client_enabled" => self.client_enabled = as_bool("client_enabled", v)?,
            "insecure" => self.insecure = as_bool("insecure", v)?,
            "client_port" => self.client_port = port("client_port", v)?,
            "meta_bind_host" => self.meta_bind_host = as_str(v),
            "disk_enabled" => self.disk_enabled = as_bool("disk_enabled", v)?,
            "disk_path" => self.disk_path = as_str(v),
            "disk_size" => self.disk_size = as_size("disk_size", v)?,
            "metrics_enabled" => self.metrics_enabled = as_bool("metrics_enabled", v)?,
            "metrics_bind_host" => self.metrics_bind_host = as_str(v),
            "metrics_port" => self.metrics_port = port("metrics_port", v)?,
            "metrics_dashboard" => self.metrics_dashboard = as_bool("metrics_dashboard", v)?,
            "node_id" => {
                let s = as_str(v);
                if !s.is_empty() {
                    peercache_wire::NodeId::new(&s)
                        .map_err(|e| bad("node_id", v, e.to_string()))?;
                }
                self.node_id = s;
            }
            "prefix" => self.prefix = as_str(v),
            "interface_v1" => self.interface_v1 = as_bool("interface_v1", v)?,
            "slot_max_page_bytes" => {
                self.slot_max_page_bytes = ranged(
                    "slot_max_page_bytes",
                    v,
                    as_size("slot_max_page_bytes", v)?,
                    64,
                    1 << 30,
                )?
            }
            "slot_ways" => {
                self.slot_ways = ranged("slot_ways", v, as_u64("slot_ways", v)?, 1, 64)? as u32
            }
            "slot_num_buckets" => self.slot_num_buckets = as_u64("slot_num_buckets", v)?,
            "heartbeat_interval" => self.heartbeat_interval = positive("heartbeat_interval", v)?,
            "member_ttl" => self.member_ttl = positive("member_ttl", v)?,
            "max_masters" => {
                self.max_masters =
                    ranged("max_masters", v, as_u64("max_masters", v)?, 1, 16)? as usize
            }
            "op_timeout" => self.op_timeout = positive("op_timeout", v)?,
            "suspect_for" => self.suspect_for = as_f64("suspect_for", v)?,
            "exists_prime_ttl" => self.exists_prime_ttl = as_f64("exists_prime_ttl", v)?,
            "replicate_on_read" => self.replicate_on_read = as_bool("replicate_on_read", v)?,
            "reservation_timeout" => self.reservation_timeout = positive("reservation_timeout", v)?,
            "exists_wait_ms" => {
                self.exists_wait_ms = ranged(
                    "exists_wait_ms",
                    v,
                    as_u64("exists_wait_ms", v)?,
                    0,
                    600_000,
                )?
            }
            "directory_max_entries" => {
                self.directory_max_entries = ranged(
                    "directory_max_entries",
                    v,
                    as_u64("directory_max_entries", v)?,
                    1,
                    u64::MAX,
                )?
            }
            "reclaim_threshold" => {
                self.reclaim_threshold = ranged(
                    "reclaim_threshold",
                    v,
                    as_u64("reclaim_threshold", v)?,
                    2,
                    1000,
                )? as u16
            }
            "max_batch_ops" => {
                self.max_batch_ops =
                    ranged("max_batch_ops", v, as_u64("max_batch_ops", v)?, 1, 1 << 20)? as usize
            }
            "max_frame_bytes" => {
                self.max_frame_bytes = ranged(
                    "max_frame_bytes",
                    v,
                    as_size("max_frame_bytes", v)?,
                    64 << 10,
                    1 << 30,
                )?
            }
            "max_inbound_connections" => {
                self.max_inbound_connections = ranged(
                    "max_inbound_connections",
                    v,
                    as_u64("max_inbound_connections", v)?,
                    1,
                    1 << 20,
                )? as usize
            }
            "eviction_queue_depth" => {
                self.eviction_queue_depth = ranged(
                    "eviction_queue_depth",
                    v,
                    as_u64("eviction_queue_depth", v)?,
                    1,
                    1 << 20,
                )? as usize
            }
            "disk_queue_depth" => {
                self.disk_queue_depth = ranged(
                    "disk_queue_depth",
                    v,
                    as_u64("disk_queue_depth", v)?,
                    1,
                    1 << 20,
                )? as usize
            }
            "startup_timeout" => self.startup_timeout = as_f64("startup_timeout", v)?,
            "tp_rank" => self.tp_rank = as_u64("tp_rank", v)? as u32,
            "tp_size" => {
                self.tp_size = ranged("tp_size", v, as_u64("tp_size", v)?, 1, 4096)? as u32
            }
            "pp_rank" => self.pp_rank = as_u64("pp_rank", v)? as u32,
            "pp_size" => {
                self.pp_size = ranged("pp_size", v, as_u64("pp_size", v)?, 1, 4096)? as u32
            }
            "dp_rank" => self.dp_rank = as_u64("dp_rank", v)? as u32,
            "log_level" => {
                let l = as_str(v);
                if l.is_empty()
                    || !l
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_=,:.-".contains(c))
                {
                    return Err(bad(
                        "log_level",
                        v,
                        "expected a filter such as info, debug or peercache_transport=debug,info",
                    ));
                }
                self.log_level = l;
            }
            "cluster_secret" => self.cluster_secret = secret("cluster_secret", v)?,
            "cluster_secret_accept" => {
                self.cluster_secret_accept = secret("cluster_secret_accept", v)?
            }
            "cluster_secret_file" => self.cluster_secret_file = as_str(v),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Builds a config from layered sources: a JSON object (SGLang's `extra_config`), then an
    /// optional TOML file, then `PEERCACHE_<KEY>` variables from `env`, then `overrides`
    /// (command-line `--set`). Returns the config and the warnings to log (unknown keys).
    pub fn from_sources(
        json: Option<&Map<String, Value>>,
        toml_file: Option<&std::path::Path>,
        env: &BTreeMap<String, String>,
        overrides: &Map<String, Value>,
    ) -> Result<(PeerCacheConfig, Vec<String>), ConfigError> {
        let mut merged: Map<String, Value> = Map::new();
        if let Some(j) = json {
            merged.extend(j.clone());
        }
        if let Some(path) = toml_file {
            let s = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            let table: toml::Table = toml::from_str(&s).map_err(|e| ConfigError::File {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            let v = serde_json::to_value(table).map_err(|e| ConfigError::File {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            if let Value::Object(m) = v {
                merged.extend(m);
            }
        }
        for (k, v) in env {
            if let Some(key) = k.strip_prefix("PEERCACHE_") {
                let key = key.to_ascii_lowercase();
                if KEYS.contains(&key.as_str()) {
                    merged.insert(key, Value::String(v.clone()));
                }
            }
        }
        merged.extend(overrides.clone());
        Self::from_map(&merged)
    }

    /// Builds a config from one flat map of keys.
    pub fn from_map(
        map: &Map<String, Value>,
    ) -> Result<(PeerCacheConfig, Vec<String>), ConfigError> {
        let mut cfg = PeerCacheConfig::default();
        let mut warnings = Vec::new();
        for (k, v) in map {
            if !cfg.set(k, v)? && !SGLANG_KEYS.contains(&k.as_str()) {
                warnings.push(format!(
                    "unknown config key `{k}` ignored (see docs/configuration.md)"
                ));
            }
        }
        if !cfg.device_names_by_rank.is_empty() {
            let rank = cfg.local_rank();
            cfg.device_names = cfg
                .device_names_by_rank
                .get(&rank)
                .cloned()
                .ok_or_else(|| ConfigError::Invalid {
                    key: "device_names",
                    value: format!("{:?}", cfg.device_names_by_rank),
                    reason: format!("no entry for local rank {rank}"),
                })?;
        }
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Checks relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.discovery_addr.is_empty() {
            return Err(ConfigError::Missing("discovery_addr"));
        }
        peercache_discovery::parse_seeds(&self.discovery_addr).map_err(|e| {
            ConfigError::Invalid {
                key: "discovery_addr",
                value: self.discovery_addr.clone(),
                reason: e.to_string(),
            }
        })?;
        if self.tp_rank >= self.tp_size {
            return Err(ConfigError::Invalid {
                key: "tp_rank",
                value: self.tp_rank.to_string(),
                reason: format!("must be below tp_size ({})", self.tp_size),
            });
        }
        if self.pp_rank >= self.pp_size {
            return Err(ConfigError::Invalid {
                key: "pp_rank",
                value: self.pp_rank.to_string(),
                reason: format!("must be below pp_size ({})", self.pp_size),
            });
        }
        if self.member_ttl < self.heartbeat_interval * 2.0 {
            return Err(ConfigError::Invalid {
                key: "member_ttl",
                value: self.member_ttl.to_string(),
                reason: format!(
                    "must be at least twice heartbeat_interval ({})",
                    self.heartbeat_interval
                ),
            });
        }
        if self.pool_bytes() < (4 << 20) {
            return Err(ConfigError::Invalid {
                key: "global_segment_size",
                value: self.global_segment_size.to_string(),
                reason: format!(
                    "global_segment_size / tp_size must be at least 4 MiB (tp_size {})",
                    self.tp_size
                ),
            });
        }
        Ok(())
    }

    /// The handshake authentication this config asks for: `cluster_secret`, else the contents
    /// of `cluster_secret_file` (surrounding whitespace trimmed), else none.
    pub fn cluster_auth(&self) -> Result<peercache_wire::Auth, ConfigError> {
        let from_file;
        let secret = if !self.cluster_secret.is_empty() {
            self.cluster_secret.expose()
        } else if !self.cluster_secret_file.is_empty() {
            let path = PathBuf::from(&self.cluster_secret_file);
            from_file = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
                path: path.clone(),
                reason: format!("reading cluster_secret_file: {e}"),
            })?;
            from_file.trim()
        } else {
            return Ok(peercache_wire::Auth::none());
        };
        let also: Vec<&[u8]> = [self.cluster_secret_accept.expose().as_bytes()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        peercache_wire::Auth::rotating(secret.as_bytes(), &also).map_err(|e| ConfigError::Invalid {
            key: if self.cluster_secret.is_empty() {
                "cluster_secret_file"
            } else {
                "cluster_secret"
            },
            value: "<redacted>".into(),
            reason: e.to_string(),
        })
    }

    /// The addresses this node would listen on, advertise or contact that are not loopback
    /// (a wildcard bind counts: it listens on every interface).
    pub fn reachable_beyond_loopback(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut host = |key: &str, h: &str| {
            if h.is_empty() {
                return;
            }
            let loopback = (h, 0u16)
                .to_socket_addrs()
                .map(|mut a| a.all(|a| a.ip().is_loopback()))
                .unwrap_or(false);
            if !loopback {
                out.push(format!("{key} = {h}"));
            }
        };
        host("local_hostname", &self.local_hostname);
        host("rdma_bind_host", &self.rdma_bind_host);
        host("control_bind_host", &self.control_bind_host);
        host("meta_bind_host", &self.meta_bind_host);
        for seed in self.discovery_addr.split(',').map(str::trim) {
            if let Some((h, _)) = seed.rsplit_once(':') {
                host(
                    "discovery_addr",
                    h.trim_start_matches('[').trim_end_matches(']'),
                );
            }
        }
        out
    }

    /// The authentication rule at start: with a secret, nothing to say; without one, a node
    /// reachable only on loopback starts with a warning (returned), one reachable beyond it
    /// refuses to start unless `insecure = true`; `cluster_secret_accept` alone is an error
    /// (it would silently leave the node open).
    pub fn check_authentication(
        &self,
        auth: &peercache_wire::Auth,
    ) -> Result<Option<String>, ConfigError> {
        if auth.is_enabled() {
            return Ok(None);
        }
        if !self.cluster_secret_accept.is_empty() {
            return Err(ConfigError::Invalid {
                key: "cluster_secret_accept",
                value: "<redacted>".into(),
                reason: "an accepted secret needs cluster_secret (or cluster_secret_file) too; \
                         alone it would leave the node unauthenticated"
                    .into(),
            });
        }
        let beyond = self.reachable_beyond_loopback();
        if self.insecure {
            return Ok(Some(format!(
                "insecure = true: running without a cluster secret although reachable at {}; \
                 any process that reaches these ports can join, read pages and query the directory",
                if beyond.is_empty() {
                    "loopback only".to_string()
                } else {
                    beyond.join(", ")
                }
            )));
        }
        if beyond.is_empty() {
            return Ok(Some(
                "no cluster_secret set: this node is reachable on loopback only, where any local \
                 process can join it (set cluster_secret or PEERCACHE_CLUSTER_SECRET; see \
                 docs/operations.md)"
                    .into(),
            ));
        }
        Err(ConfigError::Unauthenticated { reachable: beyond })
    }

    /// This rank's pool bytes (`global_segment_size / tp_size`).
    pub fn pool_bytes(&self) -> u64 {
        self.global_segment_size / self.tp_size as u64
    }

    /// `op_timeout` as a duration.
    pub fn op_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.op_timeout)
    }

    /// The rank offset a co-located process adds to per-rank ports.
    pub fn local_rank(&self) -> u32 {
        self.pp_rank * self.tp_size + self.tp_rank
    }
}

fn secret(key: &'static str, v: &Value) -> Result<Secret, ConfigError> {
    let s = text(v);
    if !s.is_empty() && s.len() < peercache_wire::auth::MIN_SECRET_LEN {
        return Err(ConfigError::Invalid {
            key,
            value: "<redacted>".into(),
            reason: format!(
                "must be at least {} bytes (e.g. `openssl rand -hex 32`)",
                peercache_wire::auth::MIN_SECRET_LEN
            ),
        });
    }
    Ok(Secret(s))
}

fn positive(key: &'static str, v: &Value) -> Result<f64, ConfigError> {
    let f = as_f64(key, v)?;
    if f <= 0.0 {
        return Err(bad(key, v, "must be greater than zero"));
    }
    Ok(f)
}

fn key_static(k: &str) -> &'static str {
    KEYS.iter().find(|x| **x == k).copied().unwrap_or("unknown")
}

/// Reads the `PEERCACHE_*` variables of this process.
pub fn process_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("PEERCACHE_"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(j: Value) -> Map<String, Value> {
        j.as_object().unwrap().clone()
    }

    #[test]
    fn sizes_and_bools() {
        assert_eq!(parse_size("4gb"), Some(4 << 30));
        assert_eq!(parse_size("512MB"), Some(512 << 20));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("1048576"), Some(1 << 20));
        assert_eq!(parse_size("12 KiB"), Some(12 << 10));
        assert_eq!(parse_size("4 parsecs"), None);
        assert_eq!(parse_size("-1"), None);
        for t in ["1", "true", "YES", "on"] {
            assert_eq!(parse_bool(t), Some(true));
        }
        for f in ["0", "false", "No", "off"] {
            assert_eq!(parse_bool(f), Some(false));
        }
        assert_eq!(parse_bool("maybe"), None);
    }

    #[test]
    fn json_with_sglang_keys_and_unknown_keys() {
        let (cfg, warnings) = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:31998",
            "global_segment_size": "1gb",
            "backend_name": "peercache", "module_path": "peercache.store", "class_name": "PeerCacheStore",
            "interface_v1": 1,
            "disk_enabled": "yes",
            "typo_key": 3,
        })))
        .unwrap();
        assert_eq!(cfg.global_segment_size, 1 << 30);
        assert!(cfg.interface_v1 && cfg.disk_enabled);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("typo_key"));
    }

    #[test]
    fn every_bad_value_gets_an_actionable_error() {
        let base = serde_json::json!({"discovery_addr": "127.0.0.1:31998"});
        let cases: &[(&str, Value)] = &[
            ("mode", "p3p".into()),
            ("write_policy", "sideways".into()),
            ("role", "boss".into()),
            ("protocol", "udp".into()),
            ("device_names", "mlx5_0,mlx5_0".into()),
            ("ib_port", 0.into()),
            ("gid_index", (-2).into()),
            ("max_channels_per_peer", 0.into()),
            ("global_segment_size", "lots".into()),
            ("vnodes", 0.into()),
            ("directory_replicas", 0.into()),
            ("directory_read_cache_ttl", (-1.0).into()),
            ("rdma_port", 70000.into()),
            ("control_port", "x".into()),
            ("disk_enabled", "perhaps".into()),
            ("disk_size", "big".into()),
            ("metrics_port", (-5).into()),
            ("node_id", "has space".into()),
            ("slot_ways", 0.into()),
            ("heartbeat_interval", 0.into()),
            ("member_ttl", "soon".into()),
            ("max_masters", 0.into()),
            ("op_timeout", 0.into()),
            ("reclaim_threshold", 1.into()),
            ("max_batch_ops", 0.into()),
            ("tp_size", 0.into()),
            ("log_level", "info; rm -rf".into()),
        ];
        for (k, v) in cases {
            let mut m = map(base.clone());
            m.insert((*k).into(), v.clone());
            let err = PeerCacheConfig::from_map(&m).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(k),
                "error for {k} does not name the key: {msg}"
            );
        }
        assert_eq!(
            PeerCacheConfig::from_map(&Map::new()).unwrap_err(),
            ConfigError::Missing("discovery_addr")
        );
        let mut m = map(base.clone());
        m.insert("tp_rank".into(), 2.into());
        m.insert("tp_size".into(), 2.into());
        assert!(
            PeerCacheConfig::from_map(&m)
                .unwrap_err()
                .to_string()
                .contains("tp_rank")
        );
        let mut m = map(base.clone());
        m.insert("member_ttl".into(), 1.0.into());
        assert!(
            PeerCacheConfig::from_map(&m)
                .unwrap_err()
                .to_string()
                .contains("heartbeat_interval")
        );
        let mut m = map(base);
        m.insert("discovery_addr".into(), "10.0.0.1:1,10.0.0.2:2".into());
        assert!(
            PeerCacheConfig::from_map(&m)
                .unwrap_err()
                .to_string()
                .contains("same meta port")
        );
    }

    #[test]
    fn env_overrides_beat_json_and_toml() {
        let dir = std::env::temp_dir().join(format!("pc-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("node.toml");
        std::fs::write(
            &file,
            "discovery_addr = \"127.0.0.1:31998\"\nvnodes = 100\nprefix = \"file\"\n",
        )
        .unwrap();
        let json = map(serde_json::json!({"vnodes": 50, "tp_rank": 0}));
        let mut env = BTreeMap::new();
        env.insert("PEERCACHE_PREFIX".to_string(), "tenant-a".to_string());
        env.insert("PEERCACHE_TP_SIZE".to_string(), "4".to_string());
        env.insert("PEERCACHE_TP_RANK".to_string(), "3".to_string());
        env.insert("OTHER".to_string(), "x".to_string());
        let mut over = Map::new();
        over.insert("vnodes".into(), Value::String("120".into()));
        let (cfg, _) =
            PeerCacheConfig::from_sources(Some(&json), Some(&file), &env, &Map::new()).unwrap();
        assert_eq!(cfg.vnodes, 100, "the file overrides the JSON");
        assert_eq!(cfg.prefix, "tenant-a", "the environment overrides the file");
        assert_eq!((cfg.tp_rank, cfg.tp_size), (3, 4));
        assert_eq!(cfg.pool_bytes(), 1 << 30);
        let (cfg, _) =
            PeerCacheConfig::from_sources(Some(&json), Some(&file), &env, &over).unwrap();
        assert_eq!(cfg.vnodes, 120, "command-line overrides beat everything");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn device_names_per_local_rank() {
        let per_rank = serde_json::json!({"0": "mlx5_0,mlx5_1", "3": ["mlx5_6", "mlx5_7"]});
        let cfg = |tp_rank: u32| {
            PeerCacheConfig::from_map(&map(serde_json::json!({
                "discovery_addr": "127.0.0.1:1", "tp_size": 4, "tp_rank": tp_rank,
                "device_names": per_rank.clone(),
            })))
        };
        assert_eq!(cfg(0).unwrap().0.device_names, ["mlx5_0", "mlx5_1"]);
        assert_eq!(cfg(3).unwrap().0.device_names, ["mlx5_6", "mlx5_7"]);
        let e = cfg(1).unwrap_err().to_string();
        assert!(e.contains("no entry for local rank 1"), "{e}");
        let bad = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:1", "device_names": {"gpu0": "mlx5_0"},
        })));
        assert!(bad.unwrap_err().to_string().contains("not a local rank"));
        let dup = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:1", "device_names": {"0": "mlx5_0,mlx5_0"},
        })));
        assert!(dup.unwrap_err().to_string().contains("duplicate device"));
    }

    #[test]
    fn a_node_without_a_secret_starts_only_on_loopback_or_when_declared_insecure() {
        let cfg = |extra: serde_json::Value| {
            let mut m = serde_json::json!({"discovery_addr": "127.0.0.1:7000"});
            for (k, v) in extra.as_object().unwrap() {
                m[k] = v.clone();
            }
            PeerCacheConfig::from_map(m.as_object().unwrap()).unwrap().0
        };
        let check = |c: &PeerCacheConfig| c.check_authentication(&c.cluster_auth().unwrap());
        let loopback = serde_json::json!({
            "local_hostname": "127.0.0.2", "rdma_bind_host": "127.0.0.2",
            "control_bind_host": "127.0.0.2", "meta_bind_host": "localhost",
        });
        // Loopback only: starts, with one warning.
        let w = check(&cfg(loopback.clone())).unwrap().unwrap();
        assert!(w.contains("loopback only"), "{w}");
        // The default wildcard binds reach every interface: refused, naming the fix.
        let e = check(&cfg(serde_json::json!({}))).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ConfigError::Unauthenticated { .. }));
        assert!(
            msg.contains("cluster_secret") && msg.contains("insecure = true"),
            "{msg}"
        );
        assert!(msg.contains("rdma_bind_host = 0.0.0.0"), "{msg}");
        // A seed on another host counts too.
        let mut remote_seed = loopback.clone();
        remote_seed["discovery_addr"] = "127.0.0.1:7000,10.1.2.3:7000".into();
        assert!(check(&cfg(remote_seed)).is_err());
        // The explicit opt-out starts, and says so.
        let w = check(&cfg(serde_json::json!({"insecure": true})))
            .unwrap()
            .unwrap();
        assert!(w.contains("insecure = true"), "{w}");
        // An accepted secret without a secret of its own would be an open node: refused.
        let mut accept_only = loopback.clone();
        accept_only["cluster_secret_accept"] = "sixteen-byte-secret!".into();
        let e = check(&cfg(accept_only)).unwrap_err();
        assert!(e.to_string().contains("cluster_secret_accept"), "{e}");
        // With a secret: nothing to say, wherever it listens.
        let c = cfg(serde_json::json!({"cluster_secret": "sixteen-byte-secret!"}));
        assert_eq!(check(&c).unwrap(), None);
    }

    #[test]
    fn every_listed_key_is_parsed_not_ignored() {
        // A key in KEYS without a `set` arm would be documented and silently ignored; every
        // arm either takes the value or refuses it with a typed error, never "unknown".
        for k in KEYS {
            let mut cfg = PeerCacheConfig::default();
            for v in [Value::Null, Value::String("1".into()), Value::Bool(true)] {
                assert!(
                    !matches!(cfg.set(k, &v), Ok(false)),
                    "`{k}` is listed and documented but not parsed"
                );
            }
        }
        let (cfg, warnings) = PeerCacheConfig::from_map(&map(serde_json::json!({
            "discovery_addr": "127.0.0.1:1", "max_frame_bytes": "1mb",
            "max_inbound_connections": 7, "eviction_queue_depth": 9, "disk_queue_depth": 11,
        })))
        .unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            (
                cfg.max_frame_bytes,
                cfg.max_inbound_connections,
                cfg.eviction_queue_depth,
                cfg.disk_queue_depth
            ),
            (1 << 20, 7, 9, 11)
        );
    }

    #[test]
    fn every_key_is_documented() {
        let doc = include_str!("../../docs/configuration.md");
        for k in KEYS {
            assert!(
                doc.contains(&format!("`{k}`")),
                "docs/configuration.md lacks `{k}`"
            );
        }
    }
}

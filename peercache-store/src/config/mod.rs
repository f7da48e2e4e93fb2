//! [`PeerCacheConfig`]: every setting of a node, from SGLang's `extra_config` JSON, a TOML
//! file, `PEERCACHE_<KEY>` environment overrides and `--set key=value` (in that order of
//! precedence, lowest first). Key names follow the original PeerCache so existing launch
//! configs keep working.
//!
//! Each key is declared once, in the table below (name, type, default, how the docs show the
//! default, an example value, the parser, the doc): the struct, `Default`, the parser every
//! source goes through, [`KEYS`] and [`SETTINGS`] are generated from it (`table.rs`), and a
//! test checks `docs/configuration.md` against [`SETTINGS`] and sets every key from TOML, the
//! environment and `--set`. The conversions into the lower crates' own config types are in
//! `lower.rs`; the authentication rules at start in `security.rs`.
//!
//! ```
//! use peercache_store::config::PeerCacheConfig;
//! let json = serde_json::json!({"discovery_addr": "127.0.0.1:31998", "protocol": "tcp"});
//! let (cfg, warnings) = PeerCacheConfig::from_map(json.as_object().unwrap()).unwrap();
//! assert_eq!(cfg.protocol, peercache_store::Protocol::Tcp);
//! assert!(warnings.is_empty());
//! ```

#[macro_use]
mod table;
mod etcd;
mod kinds;
mod lower;
mod security;
mod sources;
mod suggest;
mod values;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

pub use kinds::{
    ConfigError, Devices, DiscoveryKind, Mode, Protocol, RdmaBackend, Role, Secret, Transit,
    WritePolicy,
};
pub use security::{SECRET_KEYS, argv_secret_warning, secret_file_mode_warning};
use sources::{legacy_op_timeout, read_toml};
pub use sources::{parse_overrides, process_env};
pub use values::{parse_bool, parse_size};

/// One key's declaration, as the table states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The key.
    pub key: &'static str,
    /// The default as `docs/configuration.md` writes it.
    pub shown_default: &'static str,
    /// A valid value other than the default (used by the every-key test).
    pub example: &'static str,
    /// What the key does (the field's doc).
    pub doc: &'static str,
}

use values as p;

settings! {
    /// Seed list `host:port[,host:port…]` (one cluster-wide meta port). Required with
    /// `discovery = "builtin"`.
    discovery_addr: String = String::new();
        shown "required", example "127.0.0.9:4000", parse p::string;
    /// Where membership is kept: `builtin` (the multi-master discovery at `discovery_addr`)
    /// or `etcd` (leases under `etcd_prefix` in the cluster at `etcd_endpoints`; needs a build
    /// with the `etcd` feature).
    discovery: DiscoveryKind = DiscoveryKind::Builtin;
        shown "`builtin`", example "etcd", parse |k, v| p::choice(k, v, &[
            ("builtin", DiscoveryKind::Builtin), ("etcd", DiscoveryKind::Etcd),
        ]);
    /// etcd client URLs, comma-separated (`http://host:2379`, or `https://` with
    /// `etcd_ca_file`).
    etcd_endpoints: String = String::new();
        shown "empty", example "http://10.0.0.5:2379,http://10.0.0.6:2379", parse p::string;
    /// etcd key prefix of this cluster: members live under `<etcd_prefix>/members/<node id>`.
    etcd_prefix: String = "/peercache".into();
        shown "`/peercache`", example "/prod/peercache", parse p::string;
    /// etcd user (etcd's own authentication; with `etcd_password`).
    etcd_user: String = String::new();
        shown "empty", example "peercache", parse p::string;
    /// etcd password (`PEERCACHE_ETCD_PASSWORD`; never logged).
    etcd_password: Secret = Secret::default();
        shown "empty", example "etcd-password", parse p::password;
    /// File holding the etcd password (used when `etcd_password` is empty).
    etcd_password_file: String = String::new();
        shown "empty", example "/etc/peercache/etcd-password", parse p::string;
    /// CA bundle (PEM) that signed etcd's server certificate; required for `https://`.
    etcd_ca_file: String = String::new();
        shown "empty", example "/etc/etcd/ca.pem", parse p::string;
    /// Client certificate (PEM) for etcd's client-certificate authentication.
    etcd_cert_file: String = String::new();
        shown "empty", example "/etc/peercache/etcd-client.pem", parse p::string;
    /// Client key (PEM), with `etcd_cert_file`.
    etcd_key_file: String = String::new();
        shown "empty", example "/etc/peercache/etcd-client-key.pem", parse p::string;
    /// Deployment mode.
    mode: Mode = Mode::P2p;
        shown "`p2p`", example "hybrid", parse |k, v| p::choice(k, v, &[
            ("p2p", Mode::P2p), ("hybrid", Mode::Hybrid),
            ("centralized", Mode::Centralized), ("slotmap", Mode::Slotmap),
        ]);
    /// Hybrid write policy.
    write_policy: WritePolicy = WritePolicy::Local;
        shown "`local`", example "both", parse |k, v| p::choice(k, v, &[
            ("local", WritePolicy::Local), ("storage", WritePolicy::Storage),
            ("both", WritePolicy::Both),
        ]);
    /// Node role.
    role: Role = Role::Auto;
        shown "`auto`", example "storage", parse |k, v| p::choice(k, v, &[
            ("auto", Role::Auto), ("inference", Role::Inference), ("storage", Role::Storage),
        ]);
    /// Data-plane protocol.
    protocol: Protocol = Protocol::Rdma;
        shown "`rdma`", example "tcp", parse |k, v| p::choice(k, v, &[
            ("rdma", Protocol::Rdma), ("tcp", Protocol::Tcp),
        ]);
    /// One RDMA device (empty: the first).
    device_name: String = String::new();
        shown "`\"\"`", example "mlx5_3", parse p::string;
    /// RDMA backend: `verbs` (rdma-core NICs) or `soft` (an in-process software fabric that
    /// every node of this process shares — for tests and demos of the RDMA path).
    rdma_backend: RdmaBackend = RdmaBackend::Verbs;
        shown "`verbs`", example "soft", parse |k, v| p::choice(k, v, &[
            ("verbs", RdmaBackend::Verbs), ("soft", RdmaBackend::Soft),
        ]);
    /// RDMA devices, one rail each (overrides `device_name`): a comma-separated list, a JSON
    /// list, or a map per local rank (`{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}`) so one SGLang
    /// extra config names every rank's NICs. See [`PeerCacheConfig::rdma_devices`].
    device_names: Devices = Devices::default();
        shown "`\"\"`", example "mlx5_0,mlx5_1", parse p::devices;
    /// Storage-server writes go one-sided over RDMA (both writer and storage server must set
    /// it); the reservation guard then cannot run per write, verified commits still hold.
    rdma_writes: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Read into (and write from) caller memory outside registered host buffers directly —
    /// registered per batch on RDMA — instead of through staging and a copy.
    lazy_registration: bool = true;
        shown "`true`", example "false", parse p::boolean;
    /// Peers on the same host read this node's pool straight from shared memory (a sealed
    /// memory file they map read-only), and this node theirs, instead of over the network.
    host_local: bool = true;
        shown "`true`", example "false", parse p::boolean;
    /// RDMA port.
    ib_port: u8 = 1;
        shown "`1`", example "2", parse |k, v| p::ranged(k, v, 1, 255);
    /// RDMA GID index (-1: no GRH).
    gid_index: i32 = 3;
        shown "`3`", example "-1",
        parse |k, v| p::within(k, v, p::int(k, v)?, -1, 255).map(|g| g as i32);
    /// Connections (channels) per peer.
    max_channels_per_peer: usize = 16;
        shown "`16`", example "4", parse |k, v| p::ranged(k, v, 1, 1024);
    /// RDMA registration chunk: a pool longer than this is registered with the NIC in chunks
    /// (rounded up to whole slabs), the first at start and the rest in the background (0: one
    /// registration).
    rdma_register_chunk: u64 = 1 << 30;
        shown "`1gb`", example "256mb", parse |k, v| p::sized(k, v, 0, u64::MAX);
    /// Pool bytes per host, divided by `tp_size`.
    global_segment_size: u64 = 4 << 30;
        shown "`4gb`", example "512mb", parse |k, v| p::sized(k, v, 1 << 20, u64::MAX);
    /// Threads faulting the pool's memory in while the node already serves (0: one per core,
    /// at most 16).
    pool_fault_threads: usize = 0;
        shown "`0`", example "8", parse |k, v| p::ranged(k, v, 0, 256);
    /// Accept a pool larger than the host's available memory (`MemAvailable`); refused at start
    /// otherwise.
    pool_allow_overcommit: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Virtual nodes per member on the directory ring.
    vnodes: u32 = 160;
        shown "`160`", example "64", parse |k, v| p::ranged(k, v, 1, 4096);
    /// Ring owners per directory entry.
    directory_replicas: usize = 2;
        shown "`2`", example "3", parse |k, v| p::ranged(k, v, 1, 8);
    /// Seconds a looked-up location may be reused (0: off).
    directory_read_cache_ttl: f64 = 0.0;
        shown "`0`", example "0.5", parse p::seconds;
    /// Address advertised to peers (empty: the local address that routes to the seeds).
    local_hostname: String = String::new();
        shown "auto", example "127.0.0.7", parse p::string;
    /// Data server bind host.
    rdma_bind_host: String = "0.0.0.0".into();
        shown "`0.0.0.0`", example "127.0.0.7", parse p::string;
    /// Data server port (0: any).
    rdma_port: u16 = 0;
        shown "`0`", example "4100", parse p::port;
    /// Control server bind host.
    control_bind_host: String = "0.0.0.0".into();
        shown "`0.0.0.0`", example "127.0.0.7", parse p::string;
    /// Control server port (0: any).
    control_port: u16 = 0;
        shown "`0`", example "4200", parse p::port;
    /// Serve the client API (put/get/exists for processes that do not embed a node).
    client_enabled: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Client API base port on the control bind host (0: any; each rank adds its local rank).
    client_port: u16 = 0;
        shown "`0`", example "4300", parse p::port;
    /// Embedded discovery server bind host.
    meta_bind_host: String = "0.0.0.0".into();
        shown "`0.0.0.0`", example "127.0.0.7", parse p::string;
    /// Disk tier on.
    disk_enabled: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Disk tier folder (empty: a per-user data folder); a `<node_id>/` subfolder is used.
    disk_path: String = String::new();
        shown "per-user data folder", example "/var/lib/peercache", parse p::string;
    /// Disk tier capacity.
    disk_size: u64 = 100 << 30;
        shown "`100gb`", example "10gb", parse p::size;
    /// Metrics HTTP server on.
    metrics_enabled: bool = true;
        shown "`true`", example "false", parse p::boolean;
    /// Metrics (HTTP) bind host (empty: the node's own address, so the unauthenticated port
    /// is not on every interface; `0.0.0.0` to serve on all).
    metrics_bind_host: String = String::new();
        shown "the node's address", example "127.0.0.7", parse p::string;
    /// Metrics base port (each rank adds its local rank offset).
    metrics_port: u16 = 31997;
        shown "`31997`", example "9100", parse p::port;
    /// Serve the HTML dashboard.
    metrics_dashboard: bool = true;
        shown "`true`", example "false", parse p::boolean;
    /// File holding a bearer token (at least 16 bytes) that `/cluster` on the metrics port then
    /// requires (`Authorization: Bearer <token>`); empty: `/cluster` is open like `/metrics`.
    http_token_file: String = String::new();
        shown "empty", example "/etc/peercache/http-token", parse p::string;
    /// KV-event port (ZeroMQ `PUB`, vLLM's `KVEventBatch`): the changes of this node's
    /// directory shard for routers (docs/routing.md); each rank adds its local rank offset;
    /// `0`: off.
    kv_events_port: u16 = 0;
        shown "`0`", example "5557", parse p::port;
    /// KV-event replay port (ZeroMQ `ROUTER`): past batches or the shard's whole state for a
    /// late subscriber; each rank adds its local rank offset; `0`: off.
    kv_events_replay_port: u16 = 0;
        shown "`0`", example "5558", parse p::port;
    /// KV-event bind host (empty: the node's own address; the ports need no secret).
    kv_events_bind_host: String = String::new();
        shown "the node's address", example "10.0.0.5", parse p::string;
    /// Tokens per page, told as `block_size` in each `BlockStored` event (`0`: not known).
    kv_events_block_size: u64 = 0;
        shown "`0`", example "16", parse |k, v| p::ranged(k, v, 0, 1 << 20);
    /// Stable ring identity (empty: derived from host, meta port, ranks and prefix).
    node_id: String = String::new();
        shown "derived", example "node-a", parse p::node_id;
    /// Keyspace tag: every key becomes `<prefix>_<key>`.
    prefix: String = String::new();
        shown "`\"\"`", example "tenant-a", parse p::string;
    /// Pass-through flag SGLang reads to enable the zero-copy v1 path.
    interface_v1: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Slotmap payload size class.
    slot_max_page_bytes: u64 = 262_144;
        shown "`256kb`", example "64kb", parse |k, v| p::sized(k, v, 64, 1 << 30);
    /// Slotmap associativity.
    slot_ways: u32 = 4;
        shown "`4`", example "8", parse |k, v| p::ranged(k, v, 1, 64);
    /// Slotmap buckets (0: derive from the region size).
    slot_num_buckets: u64 = 0;
        shown "`0`", example "1024", parse p::uint;
    /// Discovery heartbeat, seconds.
    heartbeat_interval: f64 = 1.0;
        shown "`1.0`", example "0.5", parse p::positive;
    /// Seconds a silent member is kept by a discovery server.
    member_ttl: f64 = 3.0;
        shown "`3.0`", example "10", parse p::positive;
    /// Active discovery masters.
    max_masters: usize = 3;
        shown "`3`", example "5", parse |k, v| p::ranged(k, v, 1, 16);
    /// Deadline of one network operation (transport batch, directory fan-out), seconds.
    op_timeout: f64 = 2.0;
        shown "`2.0`", example "3", parse p::positive;
    /// Seconds a peer that timed out is failed fast.
    suspect_for: f64 = 2.0;
        shown "`2.0`", example "0", parse p::seconds;
    /// Seconds an exists → get hand-off stays valid.
    exists_prime_ttl: f64 = 1.0;
        shown "`1.0`", example "3", parse p::seconds;
    /// Milliseconds `batch_exists` waits for a complete prefix (0: answer at once). For decode
    /// nodes in prefill/decode disaggregation.
    exists_wait_ms: u64 = 0;
        shown "`0`", example "250", parse |k, v| p::ranged(k, v, 0, 600_000);
    /// Keep pages fetched from peers as local reclaimable replicas and register them.
    replicate_on_read: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Seconds a storage server keeps a slot reserved for a remote writer before releasing it
    /// (longer than `op_timeout`: a write admitted into the slot may take that long to land).
    reservation_timeout: f64 = 5.0;
        shown "`5`", example "9", parse p::positive;
    /// Largest control-plane frame (directory, discovery and store requests and replies).
    max_frame_bytes: u64 = 64 << 20;
        shown "`64mb`", example "1mb", parse |k, v| p::sized(k, v, 64 << 10, 1 << 30);
    /// The meta server this node hosts refuses a registration that announces an address on
    /// another host than the one it comes from (loopback counts as one host). Turn it off where
    /// members reach the meta port through a NAT or from another interface than they announce.
    meta_check_sources: bool = true;
        shown "`true`", example "false", parse p::boolean;
    /// Most inbound connections each server (data, control) accepts at once.
    max_inbound_connections: usize = 4096;
        shown "`4096`", example "64", parse |k, v| p::ranged(k, v, 1, 1 << 20);
    /// Most of those connections one source address may hold at once, on each server (0: no
    /// share, only `max_inbound_connections`).
    max_inbound_connections_per_source: usize = 0;
        shown "`0`", example "256", parse |k, v| p::ranged(k, v, 0, 1 << 20);
    /// Bytes of partially received frames (above 64 KiB each) the control and client ports
    /// together may buffer; a connection announcing a frame past what is left is closed.
    frame_budget_bytes: u64 = 1 << 30;
        shown "`1gb`", example "256mb", parse |k, v| p::sized(k, v, 1 << 20, 1 << 40);
    /// Eviction-notice batches queued for the background batcher before writers wait.
    eviction_queue_depth: usize = 256;
        shown "`256`", example "32", parse |k, v| p::ranged(k, v, 1, 1 << 20);
    /// Pages queued for the disk tier's writer; when full, write-through skips (counted).
    disk_queue_depth: usize = 256;
        shown "`256`", example "32", parse |k, v| p::ranged(k, v, 1, 1 << 20);
    /// Most entries in this node's directory shard.
    directory_max_entries: u64 = 4_000_000;
        shown "`4000000`", example "1000", parse |k, v| p::ranged(k, v, 1, u64::MAX);
    /// Bytes of directory entries per second this node hands off after a ring change (0: as
    /// fast as receivers answer).
    directory_handoff_rate: u64 = 64 << 20;
        shown "`64mb`", example "16mb", parse p::size;
    /// Live owners at which a new copy is demoted to reclaimable.
    reclaim_threshold: u16 = 3;
        shown "`3`", example "5", parse |k, v| p::ranged(k, v, 2, 1000);
    /// Most ops in one transport batch.
    max_batch_ops: usize = 8192;
        shown "`8192`", example "128", parse |k, v| p::ranged(k, v, 1, 1 << 20);
    /// Seconds the node binaries wait for discovery before giving up (0: forever).
    startup_timeout: f64 = 30.0;
        shown "`30`", example "0", parse p::seconds;
    /// Tensor-parallel rank.
    tp_rank: u32 = 0;
        shown "`0`", example "3", parse |k, v| p::ranged(k, v, 0, 4095);
    /// Tensor-parallel size.
    tp_size: u32 = 1;
        shown "`1`", example "4", parse |k, v| p::ranged(k, v, 1, 4096);
    /// Pipeline-parallel rank.
    pp_rank: u32 = 0;
        shown "`0`", example "1", parse |k, v| p::ranged(k, v, 0, 4095);
    /// Pipeline-parallel size.
    pp_size: u32 = 1;
        shown "`1`", example "2", parse |k, v| p::ranged(k, v, 1, 4096);
    /// Data-parallel rank.
    dp_rank: u32 = 0;
        shown "`0`", example "2", parse |k, v| p::ranged(k, v, 0, u32::MAX as u64);
    /// Log filter of the node binaries (`RUST_LOG` overrides it), e.g. `info` or
    /// `peercache_transport=debug,info`.
    log_level: String = "info".into();
        shown "`info`", example "debug", parse p::log_filter;
    /// Shared secret every connection proves in the handshake (empty: open cluster).
    cluster_secret: Secret = Secret::default();
        shown "empty", example "an-example-cluster-secret-0001", parse p::secret;
    /// File holding the cluster secret (used when `cluster_secret` is empty).
    cluster_secret_file: String = String::new();
        shown "empty", example "/etc/peercache/secret", parse p::string;
    /// Another secret accepted from peers during a rolling rotation (empty: none).
    cluster_secret_accept: Secret = Secret::default();
        shown "empty", example "an-example-previous-secret-02", parse p::secret;
    /// Encryption in transit of the discovery, control, client and TCP data planes (AES-256-GCM
    /// keyed from the handshake; needs a cluster secret): `auto` seals every connection whose
    /// other side can seal when the node is reachable beyond loopback (a peer of an earlier
    /// release is served unsealed) and acts as `false` on loopback; `true` seals always and
    /// refuses a peer that cannot; `false` seals only when the other side asks.
    encrypt_in_transit: Transit = Transit::Auto;
        shown "`auto`", example "true", parse |k, v| p::choice(k, v, &[
            ("auto", Transit::Auto), ("true", Transit::On), ("on", Transit::On),
            ("false", Transit::Off), ("off", Transit::Off),
        ]);
    /// File with this node's key (`peercache-key-v1 …`, from `peercache-node cert issue`): the
    /// node proves its node id with it in every handshake (needs `node_cert_file`).
    node_key_file: String = String::new();
        shown "empty", example "/etc/peercache/node.key", parse p::string;
    /// File with this node's certificate (`peercache-cert-v1 …`), which must cover its node id.
    node_cert_file: String = String::new();
        shown "empty", example "/etc/peercache/node.cert", parse p::string;
    /// File with the cluster's public signing key (`peercache-public-key-v1 …`) every node
    /// certificate is checked against.
    cluster_ca_file: String = String::new();
        shown "empty", example "/etc/peercache/cluster.pub", parse p::string;
    /// Refuse every connection whose Hello names a node without proving it with a certificate
    /// of `cluster_ca_file` (and servers that name a node without proving it): members can then
    /// speak only for themselves. Needs a cluster secret and `cluster_ca_file`.
    require_node_certificates: bool = false;
        shown "`false`", example "true", parse p::boolean;
    /// Run without a cluster secret although the node is reachable beyond loopback (the
    /// explicit opt-out; shown in the start-up line and in `/cluster`).
    insecure: bool = false;
        shown "`false`", example "true", parse p::boolean;
}

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

impl PeerCacheConfig {
    /// Builds a config from layered sources: a JSON object (SGLang's `extra_config`), then an
    /// optional TOML file, then `PEERCACHE_<KEY>` variables from `env`, then `overrides`
    /// (command-line `--set`, see [`parse_overrides`]). Returns the config and the warnings
    /// to log (unknown keys).
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
            merged.extend(read_toml(path)?);
        }
        for (k, v) in env {
            if let Some(key) = k.strip_prefix("PEERCACHE_") {
                let key = key.to_ascii_lowercase();
                if KEYS.contains(&key.as_str()) {
                    merged.insert(key, Value::String(v.clone()));
                }
            }
        }
        if let Some(secs) = legacy_op_timeout(env)? {
            merged.insert("op_timeout".into(), Value::from(secs));
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
                let hint = suggest::nearest(k, KEYS)
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                warnings.push(format!(
                    "unknown config key `{k}` ignored{hint} (see docs/configuration.md)"
                ));
            }
        }
        cfg.validate()?;
        Ok((cfg, warnings))
    }

    /// Checks relations between keys.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.discovery == DiscoveryKind::Builtin && self.discovery_addr.is_empty() {
            return Err(ConfigError::Missing("discovery_addr"));
        }
        if !self.discovery_addr.is_empty() {
            peercache_discovery::parse_seeds(&self.discovery_addr).map_err(|e| {
                ConfigError::Invalid {
                    key: "discovery_addr",
                    value: self.discovery_addr.clone(),
                    reason: e.to_string(),
                }
            })?;
        }
        if self.discovery == DiscoveryKind::Etcd {
            self.validate_etcd()?;
        }
        let invalid = |key, value: String, reason| Err(ConfigError::Invalid { key, value, reason });
        if self.tp_rank >= self.tp_size {
            return invalid(
                "tp_rank",
                self.tp_rank.to_string(),
                format!("must be below tp_size ({})", self.tp_size),
            );
        }
        if self.pp_rank >= self.pp_size {
            return invalid(
                "pp_rank",
                self.pp_rank.to_string(),
                format!("must be below pp_size ({})", self.pp_size),
            );
        }
        if self.member_ttl < self.heartbeat_interval * 2.0 {
            return invalid(
                "member_ttl",
                self.member_ttl.to_string(),
                format!(
                    "must be at least twice heartbeat_interval ({})",
                    self.heartbeat_interval
                ),
            );
        }
        if self.role == Role::Storage && self.reservation_timeout <= self.op_timeout {
            // A remote write may land until the data server's deadline (`op_timeout`) after it
            // was admitted: the reservation must outlive that.
            return invalid(
                "reservation_timeout",
                self.reservation_timeout.to_string(),
                format!(
                    "must be longer than op_timeout ({}): a write admitted into a reserved slot \
                     may take that long to land",
                    self.op_timeout
                ),
            );
        }
        if self.pool_bytes() < (4 << 20) {
            return invalid(
                "global_segment_size",
                self.global_segment_size.to_string(),
                format!(
                    "global_segment_size / tp_size must be at least 4 MiB (tp_size {})",
                    self.tp_size
                ),
            );
        }
        let one_frame = self
            .max_frame_bytes
            .max(crate::client::MAX_CLIENT_FRAME as u64);
        if self.frame_budget_bytes < one_frame {
            return invalid(
                "frame_budget_bytes",
                self.frame_budget_bytes.to_string(),
                format!(
                    "must hold the largest frame a port accepts ({one_frame} bytes: \
                     max_frame_bytes, or the client port's frame)"
                ),
            );
        }
        if self.device_names.for_rank(self.local_rank()).is_none() {
            return invalid(
                "device_names",
                format!("{:?}", self.device_names),
                format!("no entry for local rank {}", self.local_rank()),
            );
        }
        Ok(())
    }

    /// The RDMA devices of this rank: `device_names` (this rank's entry of a per-rank map),
    /// else `device_name`; empty means "the first device found".
    pub fn rdma_devices(&self) -> Vec<String> {
        match self.device_names.for_rank(self.local_rank()) {
            Some(list) if !list.is_empty() => list.to_vec(),
            _ => [self.device_name.clone()]
                .into_iter()
                .filter(|d| !d.is_empty())
                .collect(),
        }
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

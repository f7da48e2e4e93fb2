//! Each lower crate's own config type, built from the node's settings: the one place that
//! knows which key feeds which field below the store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use peercache_directory::{ClientConfig as DirClientConfig, ShardConfig};
use peercache_discovery::DiscoveryConfig;
use peercache_pool::disk::DiskConfig;
use peercache_transport::TransportConfig;
use peercache_wire::Auth;
use peercache_wire::handshake::Hello;
use peercache_wire::rpc;

use super::PeerCacheConfig;

impl PeerCacheConfig {
    /// The data transport's settings, serving on `bind` with at most `max_connections`
    /// inbound connections (the configured cap, lowered to fit the descriptor limit).
    pub fn transport(
        &self,
        bind: SocketAddr,
        max_connections: usize,
        auth: Auth,
    ) -> TransportConfig {
        TransportConfig {
            bind,
            max_channels_per_peer: self.max_channels_per_peer,
            op_timeout: self.op_timeout(),
            suspect_for: Duration::from_secs_f64(self.suspect_for),
            max_batch_ops: self.max_batch_ops,
            max_server_connections: max_connections,
            max_server_connections_per_source: self.max_inbound_connections_per_source,
            auth,
            rdma_writes: self.rdma_writes,
            host_local: self.host_local,
            ..TransportConfig::default()
        }
    }

    /// The directory shard's limits.
    pub fn shard(&self) -> ShardConfig {
        ShardConfig {
            max_entries: usize::try_from(self.directory_max_entries).unwrap_or(usize::MAX),
            entry_ttl_ms: 0,
            reclaim_threshold: self.reclaim_threshold,
        }
    }

    /// The directory client's ring and deadline.
    pub fn directory_client(&self) -> DirClientConfig {
        DirClientConfig {
            replicas: self.directory_replicas,
            vnodes: self.vnodes,
            timeout: self.op_timeout(),
            handoff_bytes_per_s: self.directory_handoff_rate,
            ..DirClientConfig::default()
        }
    }

    /// The control-plane RPC client's settings, greeting peers with `hello`.
    pub fn rpc_client(&self, hello: Hello, auth: Auth) -> rpc::ClientConfig {
        rpc::ClientConfig {
            hello,
            max_idle_per_peer: self.max_channels_per_peer,
            max_frame: usize::try_from(self.max_frame_bytes).unwrap_or(usize::MAX),
            auth,
        }
    }

    /// Discovery's settings for `seeds`: the heartbeat, the masters, and a per-RPC deadline
    /// no longer than one heartbeat.
    pub fn discovery(&self, seeds: Vec<SocketAddr>, auth: Auth) -> DiscoveryConfig {
        let heartbeat = Duration::from_secs_f64(self.heartbeat_interval);
        DiscoveryConfig {
            seeds,
            heartbeat,
            max_masters: self.max_masters,
            rpc_timeout: self.op_timeout().min(heartbeat),
            auth,
        }
    }

    /// The disk tier's settings for folder `dir`.
    pub fn disk(&self, dir: PathBuf) -> DiskConfig {
        let mut d = DiskConfig::new(dir, self.disk_size);
        d.queue_depth = self.disk_queue_depth;
        d
    }
}

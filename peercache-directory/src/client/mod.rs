//! The routing side: sends each key to its shard owners, one request per shard per batch,
//! shards in parallel, with replicas as the fallback. The client and its view of the ring live
//! here; the fan-out (`route`), writes (`write`), queries with their replica fallback
//! (`query`) and the reaction to a membership change (`membership`) beside it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use peercache_wire::rpc::RpcClient;
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::ring::Ring;
use crate::service::DirectoryService;

mod membership;
mod query;
mod route;
mod write;

pub use membership::HandoffReport;

/// A cluster member as the directory sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub node: NodeId,
    /// Its control endpoint (directory RPCs).
    pub control: SocketAddr,
    /// Its life: a member seen again under another incarnation restarted, with an empty
    /// shard and pool, and is handed its ranges again as if it had just joined.
    pub incarnation: Incarnation,
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Ring owners per entry (`directory_replicas`).
    pub replicas: usize,
    /// Virtual nodes per member.
    pub vnodes: u32,
    /// Deadline of one fan-out.
    pub timeout: Duration,
    /// Keys per request; larger batches are split, never rejected.
    pub max_keys_per_request: usize,
    /// After a membership change, misses are retried on replicas for this long (entries may
    /// still be in flight to their new owners).
    pub handoff_grace: Duration,
    /// How long a shard keeps entries it no longer owns after handing them off, so readers
    /// whose view of the ring lags still find them (0: drop at once).
    pub drop_grace: Duration,
    /// Pace of this node's hand-off after a ring change, in bytes of entries per second (0:
    /// as fast as the receivers answer). A newcomer is not flooded by every member at once;
    /// meanwhile it points readers at the keys' previous holders, so a paced hand-off causes
    /// no misses.
    pub handoff_bytes_per_s: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            replicas: 2,
            vnodes: crate::ring::DEFAULT_VNODES,
            timeout: Duration::from_secs(2),
            max_keys_per_request: 16 * 1024,
            handoff_grace: Duration::from_secs(5),
            drop_grace: Duration::from_secs(5),
            handoff_bytes_per_s: 64 << 20,
        }
    }
}

struct View {
    ring: Ring,
    addrs: HashMap<NodeId, SocketAddr>,
    lives: HashMap<NodeId, Incarnation>,
    changed_at: Instant,
}

/// Counters of a client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Requests sent over the network.
    pub rpcs: u64,
    /// Requests answered by the local shard.
    pub local_calls: u64,
    /// Requests that failed.
    pub rpc_errors: u64,
    /// Keys retried on a replica.
    pub fallbacks: u64,
    /// Keys a shard still receiving them by hand-off pointed to their previous holder.
    pub redirects: u64,
}

/// Routes directory operations to shard owners (the local shard directly, peers over RPC).
///
/// # Example
///
/// Two nodes on loopback, each serving its shard on a control port. Node A records where a
/// page lives; node B finds it, wherever the ring put the entry:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use peercache_directory::{
///     ClientConfig, CopyClass, DirectoryClient, DirectoryService, Location, Member, Rail,
///     ShardConfig,
/// };
/// use peercache_wire::handshake::{Hello, Plane};
/// use peercache_wire::rpc::{self, Reply, RpcClient, RpcError, RpcServer, ServerConfig};
/// use peercache_wire::{Auth, Incarnation, Layout, NodeId, PageKey};
///
/// /// One node: its shard behind an RPC server, and a routing client.
/// fn node(name: &str) -> (NodeId, RpcServer, DirectoryClient) {
///     let id = NodeId::new(name).unwrap();
///     let shard = Arc::new(DirectoryService::new(ShardConfig::default()));
///     let served = shard.clone();
///     let handler: rpc::Handler = Arc::new(move |peer, env| {
///         served.handle(peer, env).unwrap_or(Reply::Error {
///             error: RpcError { code: RpcError::CODE_UNKNOWN_KIND, message: "not mine".into() },
///             close: false,
///         })
///     });
///     let server = RpcServer::start(
///         ServerConfig {
///             bind: "127.0.0.1:0".parse().unwrap(),
///             planes: vec![Plane::Control],
///             node: Some(id.clone()),
///             incarnation: Incarnation(1),
///             max_frame: 16 << 20,
///             handshake_timeout: Duration::from_secs(2),
///             max_connections: 64,
///             offload: &[],
///             workers: 1,
///             name: "doc",
///             auth: Auth::none(),
///             shares: Default::default(),
///         },
///         handler,
///     )
///     .unwrap();
///     let rpc = RpcClient::new(rpc::ClientConfig {
///         hello: Hello::new(Plane::Control, Some(id.clone()), Incarnation(1)),
///         max_idle_per_peer: 4,
///         max_frame: 16 << 20,
///         auth: Auth::none(),
///     });
///     let client = DirectoryClient::new(id.clone(), shard, rpc, ClientConfig::default());
///     (id, server, client)
/// }
///
/// let (a, server_a, dir_a) = node("node-a");
/// let (b, server_b, dir_b) = node("node-b");
/// let members = [
///     Member { node: a.clone(), control: server_a.local_addr(), incarnation: Incarnation(1) },
///     Member { node: b.clone(), control: server_b.local_addr(), incarnation: Incarnation(1) },
/// ];
/// dir_a.apply_membership(&members);
/// dir_b.apply_membership(&members);
///
/// let key = PageKey::from_key("model/layer0/page42");
/// let here = Location {
///     node: a.clone(),
///     incarnation: Incarnation(1),
///     rails: [Rail { endpoint: "127.0.0.1:7000".parse().unwrap(), region: 1 }].into_iter().collect(),
///     addr: 0x1000,
///     len: 4096,
///     valid_len: 4096,
///     generation: 1,
///     checksum: 0xfeed,
///     resident: true,
///     class: CopyClass::Retained,
///     // What the page's bytes mean (model, KV dtype, shard, geometry): readers of another
///     // layout skip this copy.
///     layout: Layout::from_canonical(b"model=demo;dtype=bfloat16"),
/// };
/// dir_a.insert(&[(key, here.clone())])?;
///
/// let found = dir_b.lookup(&[key])?;
/// assert_eq!(found[0].as_ref().map(|owners| owners[0].clone()), Some(here));
/// assert_eq!(dir_b.exists(&[key, PageKey::from_key("never-written")])?, [true, false]);
/// # Ok::<(), peercache_directory::DirError>(())
/// ```
pub struct DirectoryClient {
    me: NodeId,
    local: Arc<DirectoryService>,
    rpc: RpcClient,
    cfg: ClientConfig,
    view: RwLock<Arc<View>>,
    c: crate::metrics::Counters,
    /// Handed-off entries waiting out `drop_grace`: (due, keys).
    pending_drops: parking_lot::Mutex<Vec<(Instant, Vec<PageKey>)>>,
}

impl std::fmt::Debug for DirectoryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectoryClient")
            .field("me", &self.me)
            .finish()
    }
}

type Chunk = (NodeId, Vec<usize>);

impl DirectoryClient {
    /// A client for node `me`, whose own shard is `local`.
    pub fn new(
        me: NodeId,
        local: Arc<DirectoryService>,
        rpc: RpcClient,
        cfg: ClientConfig,
    ) -> Self {
        local.receive_handoffs(me.clone(), cfg.handoff_grace);
        let view = View {
            ring: Ring::new(Vec::new(), cfg.vnodes),
            addrs: HashMap::new(),
            lives: HashMap::new(),
            changed_at: Instant::now(),
        };
        DirectoryClient {
            me,
            local,
            rpc,
            cfg,
            view: RwLock::new(Arc::new(view)),
            pending_drops: parking_lot::Mutex::new(Vec::new()),
            c: crate::metrics::Counters::register(),
        }
    }

    fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    /// Whether this node's own shard holds a copy of every key's entry — the current ring
    /// has no more members than the replicas each entry is stored on, and this node is one of
    /// them — so a lookup is answered without a round trip (outside a ring change's hand-off
    /// grace, when a key no owner has is also looked for on the other members).
    pub fn holds_every_entry(&self) -> bool {
        let v = self.view();
        v.ring.contains(&self.me) && v.ring.members().len() <= self.cfg.replicas
    }

    /// The control endpoint of a member of the current view.
    pub fn control_of(&self, node: &NodeId) -> Option<SocketAddr> {
        self.view().addrs.get(node).copied()
    }

    /// The RPC client this directory client calls shards with (shared by other control-plane
    /// calls to the same members, so they reuse its pooled, authenticated connections).
    pub fn rpc(&self) -> &RpcClient {
        &self.rpc
    }

    /// The primary owner of each key on the current ring (None: no members), computed under
    /// one view without copying the ring.
    pub fn primaries(&self, keys: &[PageKey]) -> Vec<Option<NodeId>> {
        let view = self.view();
        let mut idx = Vec::with_capacity(1);
        keys.iter()
            .map(|k| {
                view.ring.owner_indices(*k, 1, &mut idx);
                idx.first().map(|&i| view.ring.member(i).clone())
            })
            .collect()
    }

    /// The current ring.
    pub fn ring(&self) -> Ring {
        self.view().ring.clone()
    }

    /// How long ago the ring last changed membership.
    pub fn ring_age(&self) -> Duration {
        self.view().changed_at.elapsed()
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            rpcs: self.c.rpcs.get(),
            local_calls: self.c.local_calls.get(),
            rpc_errors: self.c.errors.get(),
            fallbacks: self.c.fallbacks.get(),
            redirects: self.c.redirects.get(),
        }
    }
}

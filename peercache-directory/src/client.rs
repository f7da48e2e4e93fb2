//! The routing side: sends each key to its shard owners, one request per shard per batch,
//! shards in parallel, with replicas as the fallback.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use peercache_wire::envelope::{self, Extension};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Incarnation, NodeId, PageKey};
use smallvec::SmallVec;

use crate::DirError;
use crate::handoff;
use crate::holding::{Holding, KeyHolders};
use crate::location::{Location, Owners};
use crate::msg::{
    DirReply, DirRequest, EXT_HANDOFF_MORE, EXT_HOLDERS_ONLY, EXT_MOVING, LayoutRuns, Moving,
    OwnerRef,
};
use crate::ring::Ring;
use crate::service::DirectoryService;
use crate::shard::InsertOutcome;

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

/// What a membership change did to this node's shard.
#[derive(Clone, Debug, Default)]
pub struct HandoffReport {
    /// Entries sent to new owners.
    pub sent: usize,
    /// Entries dropped because this node no longer owns them.
    pub dropped: usize,
    /// Entries whose send failed (kept; retried at the next change).
    pub failed: usize,
    /// Locations dropped because their owner left or restarted (its old life's copies).
    pub gc: usize,
    /// Members seen again under a new incarnation (restarted with an empty shard).
    pub restarted: usize,
    /// When the ring changed (a member joined, left or restarted) on a node that had a ring
    /// before: the ring the hand-off was planned from (the previous ring without restarted
    /// members) and the new one. An owner re-announces what moved between them
    /// ([`crate::handoff::reannounce_routes`]).
    pub rings: Option<(Ring, Ring)>,
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

    /// Groups item indices by the owner at replica position `rank` (items without one skip).
    /// With `local_first` (queries), this node counts as rank 0 of every key it is an owner of
    /// (the others keep their order): a query answered by the local shard needs no round trip;
    /// and a key it does not own has its owners ordered by this node's fixed preference among
    /// the members, so the keys two owners share go to the same one: fewer shards asked per
    /// query (with three members and two replicas, one), while each member prefers others.
    fn group(
        &self,
        view: &View,
        keys: impl Iterator<Item = (usize, PageKey)>,
        rank: usize,
        local_first: bool,
    ) -> Vec<Chunk> {
        // (member, item) pairs sorted by member: no hashing, and items keep their order
        // within a member (they are unique, so the unstable sort cannot reorder them).
        let mut picked: Vec<(u32, usize)> = Vec::with_capacity(keys.size_hint().0);
        let mut idx = Vec::with_capacity(self.cfg.replicas);
        let me = if local_first {
            view.ring.index_of(&self.me)
        } else {
            None
        };
        for (i, k) in keys {
            view.ring.owner_indices(k, self.cfg.replicas, &mut idx);
            if let Some(me) = me {
                match idx.iter().position(|&m| m == me) {
                    Some(p) => idx[..=p].rotate_right(1),
                    None => idx.sort_unstable_by_key(|&m| peer_preference(me, m)),
                }
            }
            if let Some(&m) = idx.get(rank) {
                picked.push((m, i));
            }
        }
        picked.sort_unstable();
        let max = self.cfg.max_keys_per_request.max(1);
        let mut out = Vec::new();
        for run in picked.chunk_by(|a, b| a.0 == b.0) {
            let node = view.ring.member(run[0].0);
            for chunk in run.chunks(max) {
                out.push((node.clone(), chunk.iter().map(|&(_, i)| i).collect()));
            }
        }
        out
    }

    /// Sends one request per chunk (local shard inline, peers in parallel).
    fn fan_out<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
    ) -> Vec<Result<DirReply, DirError>> {
        self.fan_out_as(view, chunks, build, false)
    }

    /// [`Self::fan_out`]; with `holders`, lookups ask for holders only
    /// ([`crate::msg::EXT_HOLDERS_ONLY`]).
    fn fan_out_as<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<Result<DirReply, DirError>> {
        self.fan_out_hinted(view, chunks, build, holders)
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// [`Self::fan_out_as`], with each reply's [`Moving`] hints (empty unless a shard is still
    /// receiving a hand-off of keys it missed).
    fn fan_out_hinted<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<(Result<DirReply, DirError>, Moving)> {
        let mut results: Vec<Option<(Result<DirReply, DirError>, Moving)>> =
            (0..chunks.len()).map(|_| None).collect();
        let mut frames = Vec::new();
        let mut remote = Vec::new();
        // This node's own chunks are answered while the remote requests are in flight.
        let mut local = Vec::new();
        for (ci, (node, items)) in chunks.iter().enumerate() {
            if *node == self.me {
                local.push(ci);
                continue;
            }
            let req = build(items);
            let Some(&addr) = view.addrs.get(node) else {
                results[ci] = Some((
                    Err(DirError::UnknownMember(node.clone())),
                    Moving::default(),
                ));
                continue;
            };
            let frame = LayoutRuns::extension(&req).and_then(|layouts| {
                let mut ext: Vec<Extension> = layouts.into_iter().collect();
                if holders {
                    ext.push(Extension::of(EXT_HOLDERS_ONLY, &1u8)?);
                }
                envelope::encode(&req, &ext)
            });
            match frame {
                Ok(f) => {
                    frames.push((addr, f));
                    remote.push(ci);
                }
                Err(e) => results[ci] = Some((Err(DirError::Wire(e)), Moving::default())),
            }
        }
        let answer_local = |results: &mut Vec<Option<(Result<DirReply, DirError>, Moving)>>| {
            for &ci in &local {
                let req = build(&chunks[ci].1);
                self.c.local_calls.add(1);
                let reply = match &req {
                    DirRequest::Lookup(keys) if holders => self.local.apply_holders(keys),
                    _ => self.local.apply(&req),
                };
                let moving = self.local.moving(&req, &reply);
                results[ci] = Some((Ok(reply), moving));
            }
        };
        if frames.is_empty() {
            answer_local(&mut results);
        } else {
            let calls: Vec<(SocketAddr, &[u8])> =
                frames.iter().map(|(a, f)| (*a, f.as_slice())).collect();
            self.c.rpcs.add(calls.len() as u64);
            let replies = self
                .rpc
                .call_many_then(&calls, self.cfg.timeout, || answer_local(&mut results));
            for (ci, r) in remote.into_iter().zip(replies) {
                let r = r.and_then(|f| decode_hinted(&f)).map_err(DirError::Wire);
                if r.is_err() {
                    self.c.errors.add(1);
                }
                results[ci] = Some(match r {
                    Ok((reply, moving)) => (Ok(reply), moving),
                    Err(e) => (Err(e), Moving::default()),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or((Err(DirError::NoMembers), Moving::default())))
            .collect()
    }

    /// Records locations on every replica owner. Returns, per entry, the primary's outcome
    /// (or a replica's when the primary failed); `None` if no owner took it.
    pub fn insert(
        &self,
        entries: &[(PageKey, Location)],
    ) -> Result<Vec<Option<InsertOutcome>>, DirError> {
        self.own("insert", entries.iter().map(|(_, l)| &l.node))?;
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut out: Vec<Option<InsertOutcome>> = vec![None; entries.len()];
        let mut from_primary = vec![false; entries.len()];
        let mut chunks = Vec::new();
        let mut ranks = Vec::new();
        for rank in 0..self.cfg.replicas {
            for c in self.group(&view, entries.iter().map(|e| e.0).enumerate(), rank, false) {
                chunks.push(c);
                ranks.push(rank);
            }
        }
        let replies = self.fan_out(&view, &chunks, |items| {
            DirRequest::Insert(
                items
                    .iter()
                    .map(|&i| entries[i].clone())
                    .collect::<Vec<_>>()
                    .into(),
            )
        });
        for (((_, items), rank), reply) in chunks.iter().zip(ranks).zip(replies) {
            if let Ok(DirReply::Inserted(v)) = reply {
                for (&i, oc) in items.iter().zip(v) {
                    if rank == 0 || (!from_primary[i] && out[i].is_none()) {
                        out[i] = Some(oc);
                        from_primary[i] = rank == 0;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Records entries on given owners only: `routes` lists, per node, indices into `entries`
    /// (split at the request size limit). Returns how many entries some node accepted. For an
    /// owner re-announcing its pages to the replicas a ring change added.
    pub fn insert_routed(
        &self,
        entries: &[(PageKey, Location)],
        routes: &[(NodeId, Vec<usize>)],
    ) -> usize {
        if self
            .own("insert", entries.iter().map(|(_, l)| &l.node))
            .is_err()
        {
            return 0;
        }
        let view = self.view();
        let chunks: Vec<Chunk> = routes
            .iter()
            .flat_map(|(node, idx)| {
                idx.chunks(self.cfg.max_keys_per_request.max(1))
                    .map(move |c| (node.clone(), c.to_vec()))
            })
            .collect();
        let replies = self.fan_out(&view, &chunks, |items| {
            DirRequest::Insert(
                items
                    .iter()
                    .map(|&i| entries[i].clone())
                    .collect::<Vec<_>>()
                    .into(),
            )
        });
        replies
            .into_iter()
            .filter_map(|r| match r {
                Ok(DirReply::Inserted(v)) => Some(v.len()),
                _ => None,
            })
            .sum()
    }

    /// Owners of each key, best first; misses and failures come back as `None`. Within
    /// `handoff_grace` of a ring change, a key no owner has is looked for on every member.
    pub fn lookup(&self, keys: &[PageKey]) -> Result<Vec<Option<Owners>>, DirError> {
        self.replica_query(
            keys,
            false,
            None,
            |items| DirRequest::Lookup(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Found(v) => Some(v),
                _ => None,
            },
            Option::is_some,
        )
    }

    /// Which nodes hold each key and whether in memory, without the locations: the compact
    /// form of [`Self::lookup`] a router's prefix query needs (a few bytes per key on the wire
    /// instead of a location per copy). Same replicas, fallbacks and hand-off grace as
    /// [`Self::lookup`]; a shard of a release before holders answers with full owners, which
    /// are folded here. A key nobody holds (or whose shards failed) is empty.
    pub fn holders(&self, keys: &[PageKey]) -> Result<Vec<Holding>, DirError> {
        self.key_holders(keys)?
            .into_holdings(keys.len())
            .map_err(DirError::Wire)
    }

    /// [`Self::holders`] as one [`KeyHolders`] in `keys`' order: every shard's answer merged
    /// under one node table, each copy a small index into it — no per-key allocation and no
    /// node id cloned per copy, the form a prefix query walks. A shard's reply that
    /// [`KeyHolders::check`] refuses counts as a failed shard (its keys go to the next replica).
    pub fn key_holders(&self, keys: &[PageKey]) -> Result<KeyHolders, DirError> {
        /// One key's copies, as indices into the merged node table (inline up to three).
        type Copies = SmallVec<[u32; 3]>;
        let table = RefCell::new(Vec::<NodeId>::new());
        let index_of = |node: &NodeId| -> u32 {
            let mut t = table.borrow_mut();
            match t.iter().position(|n| n == node) {
                Some(i) => i as u32,
                None => {
                    t.push(node.clone());
                    (t.len() - 1) as u32
                }
            }
        };
        let per_key = self.replica_query(
            keys,
            true,
            Copies::new(),
            |items| DirRequest::Lookup(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Holders(h) => {
                    let n = h.len();
                    h.check(n).ok()?;
                    let map: SmallVec<[u32; 8]> = h.nodes.iter().map(index_of).collect();
                    Some(
                        (0..n)
                            .map(|i| {
                                h.copies(i)
                                    .iter()
                                    .map(|&c| (map[(c >> 1) as usize] << 1) | (c & 1))
                                    .collect()
                            })
                            .collect(),
                    )
                }
                DirReply::Found(v) => Some(
                    v.iter()
                        .map(|o| {
                            o.iter()
                                .flatten()
                                .map(|l| (index_of(&l.node) << 1) | u32::from(l.resident))
                                .collect()
                        })
                        .collect(),
                ),
                _ => None,
            },
            |h| !h.is_empty(),
        )?;
        let mut out = KeyHolders {
            nodes: table.into_inner(),
            ends: Vec::with_capacity(keys.len()),
            copies: Vec::with_capacity(keys.len() * self.cfg.replicas),
        };
        for copies in &per_key {
            out.copies.extend_from_slice(copies);
            out.ends.push(out.copies.len() as u32);
        }
        Ok(out)
    }

    /// Presence of each key (memory or disk of a live owner). Within `handoff_grace` of a ring
    /// change, a key no owner has is asked about on every member, as [`Self::lookup`] does.
    pub fn exists(&self, keys: &[PageKey]) -> Result<Vec<bool>, DirError> {
        self.replica_query(
            keys,
            false,
            false,
            |items| DirRequest::Exists(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Exists(v) => Some(v),
                _ => None,
            },
            |present| *present,
        )
    }

    /// The one replica query behind [`Self::lookup`] and [`Self::exists`]: asks each key's
    /// owner at replica rank 0 (this node's own shard when it is one of the key's owners),
    /// then — for keys whose owner failed or (within
    /// `handoff_grace` of a ring change) did not have them — the owner at the next rank, and
    /// so on; within the grace, keys still missing are asked about on every member. `build`
    /// makes the request for a chunk of key indices, `decode` takes the per-key answers out
    /// of a reply (`None`: not the reply asked for), `found` says whether an answer is a hit.
    fn replica_query<'a, T: Clone>(
        &self,
        keys: &[PageKey],
        holders: bool,
        missing: T,
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        decode: impl Fn(DirReply) -> Option<Vec<T>>,
        found: impl Fn(&T) -> bool,
    ) -> Result<Vec<T>, DirError> {
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut out = vec![missing; keys.len()];
        let retry_misses = view.changed_at.elapsed() < self.cfg.handoff_grace;
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        // Keys a shard missed because it is still receiving them, with their previous holder.
        let mut hinted: Vec<(usize, NodeId)> = Vec::new();
        for rank in 0..self.cfg.replicas {
            if pending.is_empty() {
                break;
            }
            if rank > 0 {
                self.c.fallbacks.add(pending.len() as u64);
            }
            let chunks = self.group(&view, pending.iter().map(|&i| (i, keys[i])), rank, true);
            let replies = self.fan_out_hinted(&view, &chunks, &build, holders);
            let mut next = Vec::new();
            for ((node, items), (reply, moving)) in chunks.iter().zip(replies) {
                for (j, holder) in moving.keys {
                    if let Some(&i) = items.get(j as usize)
                        && holder != *node
                    {
                        hinted.push((i, holder));
                    }
                }
                match reply.ok().and_then(&decode) {
                    Some(v) if v.len() == items.len() => {
                        for (&i, answer) in items.iter().zip(v) {
                            if found(&answer) {
                                out[i] = answer;
                            } else if retry_misses {
                                next.push(i);
                            }
                        }
                    }
                    _ => next.extend_from_slice(items),
                }
            }
            pending = next;
        }
        // Within the grace every member is asked below (the previous holders among them);
        // past it, only the holders a receiving shard named.
        hinted.retain(|(i, _)| !retry_misses && !found(&out[*i]));
        if !hinted.is_empty() {
            self.c.redirects.add(hinted.len() as u64);
            let mut by_node: HashMap<NodeId, Vec<usize>> = HashMap::new();
            for (i, holder) in hinted {
                by_node.entry(holder).or_default().push(i);
            }
            let max = self.cfg.max_keys_per_request.max(1);
            let chunks: Vec<Chunk> = by_node
                .into_iter()
                .flat_map(|(node, items)| {
                    items
                        .chunks(max)
                        .map(|c| (node.clone(), c.to_vec()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let replies = self.fan_out_as(&view, &chunks, &build, holders);
            for ((_, items), reply) in chunks.iter().zip(replies) {
                if let Some(v) = reply.ok().and_then(&decode)
                    && v.len() == items.len()
                {
                    for (&i, answer) in items.iter().zip(v) {
                        if found(&answer) {
                            out[i] = answer;
                        }
                    }
                }
            }
            pending.retain(|&i| !found(&out[i]));
        }
        if retry_misses && !pending.is_empty() {
            for (items, reply) in self.ask_every_member(&view, &pending, &build, holders) {
                if let Some(v) = reply.ok().and_then(&decode)
                    && v.len() == items.len()
                {
                    for (&i, answer) in items.iter().zip(v) {
                        if !found(&out[i]) {
                            out[i] = answer;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Shortly after a ring change, a writer whose ring lagged may have put entries on nodes
    /// that are no owners in this ring, and the hand-off to the owners may not have landed
    /// yet: asks every member once about the `pending` keys (in chunks of at most
    /// `max_keys_per_request`) and returns each chunk's key indices with its reply.
    fn ask_every_member<'a>(
        &self,
        view: &View,
        pending: &[usize],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<(Vec<usize>, Result<DirReply, DirError>)> {
        self.c.fallbacks.add(pending.len() as u64);
        let max = self.cfg.max_keys_per_request.max(1);
        let chunks: Vec<Chunk> = view
            .ring
            .members()
            .iter()
            .flat_map(|m| pending.chunks(max).map(move |c| (m.clone(), c.to_vec())))
            .collect();
        let replies = self.fan_out_as(view, &chunks, build, holders);
        chunks
            .into_iter()
            .map(|(_, items)| items)
            .zip(replies)
            .collect()
    }

    fn to_replicas(&self, items: &[OwnerRef], mark: bool) -> Result<u32, DirError> {
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut chunks = Vec::new();
        for rank in 0..self.cfg.replicas {
            chunks.extend(self.group(&view, items.iter().map(|r| r.key).enumerate(), rank, false));
        }
        let replies = self.fan_out(&view, &chunks, |idx| {
            let v: Vec<OwnerRef> = idx.iter().map(|&i| items[i].clone()).collect();
            if mark {
                DirRequest::MarkNonResident(v.into())
            } else {
                DirRequest::Remove(v.into())
            }
        });
        Ok(replies
            .into_iter()
            .map(|r| match r {
                Ok(DirReply::Applied(n)) => n,
                _ => 0,
            })
            .sum())
    }

    /// Fails with [`DirError::NotYours`] unless every node named is this one.
    fn own<'n>(
        &self,
        action: &'static str,
        mut nodes: impl Iterator<Item = &'n NodeId>,
    ) -> Result<(), DirError> {
        match nodes.find(|n| **n != self.me) {
            None => Ok(()),
            Some(n) => Err(DirError::NotYours {
                action,
                target: n.clone(),
                me: self.me.clone(),
            }),
        }
    }

    /// Removes this node's copies on every replica (owner-conditional by generation).
    pub fn remove(&self, items: &[OwnerRef]) -> Result<u32, DirError> {
        self.own("remove", items.iter().map(|r| &r.node))?;
        self.to_replicas(items, false)
    }

    /// Marks this node's copies disk-only on every replica.
    pub fn mark_nonresident(&self, items: &[OwnerRef]) -> Result<u32, DirError> {
        self.own("mark", items.iter().map(|r| &r.node))?;
        self.to_replicas(items, true)
    }

    /// Drops handed-off entries whose `drop_grace` has passed and that this node still does
    /// not own under the current ring. Returns how many were dropped. Called on every
    /// membership update; call it periodically too.
    pub fn drop_due(&self) -> usize {
        let now = Instant::now();
        let due: Vec<Vec<PageKey>> = {
            let mut p = self.pending_drops.lock();
            if p.iter().all(|(at, _)| *at > now) {
                return 0;
            }
            let (due, keep): (Vec<_>, Vec<_>) = p.drain(..).partition(|(at, _)| *at <= now);
            *p = keep;
            due.into_iter().map(|(_, k)| k).collect()
        };
        let ring = self.view().ring.clone();
        let mut idx = Vec::with_capacity(self.cfg.replicas);
        let keys: Vec<PageKey> = due
            .into_iter()
            .flatten()
            .filter(|k| {
                ring.owner_indices(*k, self.cfg.replicas, &mut idx);
                !idx.iter().any(|&i| *ring.member(i) == self.me)
            })
            .collect();
        let n = keys.len();
        if n > 0 {
            self.local.with_shard(|sh, _| sh.drop_keys(&keys));
            self.c.handoff_dropped.add(n as u64);
        }
        n
    }

    /// Sends a ring change's hand-off: to every receiver its first chunk at once (each chunk
    /// says how many entries are still to come, [`EXT_HANDOFF_MORE`], so the receiver points
    /// readers here until it has them all), then the rest round-robin over the receivers, one
    /// chunk each per round in parallel, paced at `handoff_bytes_per_s`. Returns false when a
    /// send failed (those entries are kept and counted in `report.failed`).
    fn send_handoff(
        &self,
        view: &View,
        sends: &HashMap<NodeId, Vec<PageKey>>,
        newcomers: &[NodeId],
        report: &mut HandoffReport,
    ) -> bool {
        let max = self.cfg.max_keys_per_request.max(1);
        // A newcomer waits for each earlier member's last word: one with nothing for it says
        // so in an empty first chunk.
        let targets: Vec<(SocketAddr, &NodeId, &[PageKey])> = sends
            .iter()
            .map(|(node, keys)| (node, keys.as_slice()))
            .chain(
                newcomers
                    .iter()
                    .filter(|n| !sends.contains_key(*n))
                    .map(|n| (n, &[][..])),
            )
            .filter_map(|(node, keys)| view.addrs.get(node).map(|&a| (a, node, keys)))
            .collect();
        let rounds = targets
            .iter()
            .map(|(_, _, keys)| keys.len().div_ceil(max).max(1))
            .max()
            .unwrap_or(0);
        let started = Instant::now();
        let mut bytes = 0u64;
        let mut ok_all = true;
        for round in 0..rounds {
            if round > 0 && self.cfg.handoff_bytes_per_s > 0 {
                let due =
                    Duration::from_secs_f64(bytes as f64 / self.cfg.handoff_bytes_per_s as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let mut frames = Vec::new();
            let mut sent_keys = Vec::new();
            for (addr, node, keys) in &targets {
                let chunk = match keys.chunks(max).nth(round) {
                    Some(chunk) => chunk,
                    None if round == 0 => &[][..],
                    None => continue,
                };
                let more = (keys.len() - (round * max + chunk.len())) as u64;
                let entries: Vec<(PageKey, Owners)> = self.local.with_shard(|sh, _| {
                    chunk
                        .iter()
                        .filter_map(|k| sh.peek(*k).map(|o| (*k, o)))
                        .collect()
                });
                let req = DirRequest::Handoff(entries.into());
                let frame = Extension::of(EXT_HANDOFF_MORE, &more).and_then(|more| {
                    let layouts = LayoutRuns::extension(&req)?;
                    let ext: Vec<Extension> = std::iter::once(more).chain(layouts).collect();
                    envelope::encode(&req, &ext)
                });
                match frame {
                    Ok(f) => {
                        bytes += f.len() as u64;
                        frames.push((*addr, f));
                        sent_keys.push((*node, chunk.len()));
                    }
                    Err(e) => {
                        ok_all = false;
                        report.failed += chunk.len();
                        tracing::warn!(%node, error = %e, "directory hand-off not encoded; entries kept");
                    }
                }
            }
            let calls: Vec<(SocketAddr, &[u8])> =
                frames.iter().map(|(a, f)| (*a, f.as_slice())).collect();
            self.c.rpcs.add(calls.len() as u64);
            let replies = self.rpc.call_many(&calls, self.cfg.timeout);
            for ((node, n), r) in sent_keys.into_iter().zip(replies) {
                match r.and_then(|f| rpc::decode_reply::<DirReply>(&f)) {
                    Ok(_) => report.sent += n,
                    Err(e) => {
                        ok_all = false;
                        report.failed += n;
                        tracing::warn!(%node, error = %e, "directory hand-off failed; entries kept");
                    }
                }
            }
        }
        ok_all
    }

    /// Installs a new member set: re-routes, collects locations of departed owners and of
    /// restarted owners' previous lives, and hands off the entries whose owners changed (only
    /// those; a member back under a new incarnation is handed its ranges again, since its
    /// shard restarted empty); the old copies are dropped after `drop_grace`.
    pub fn apply_membership(&self, members: &[Member]) -> HandoffReport {
        let old = self.view();
        let new_ring = Ring::new(members.iter().map(|m| m.node.clone()), self.cfg.vnodes);
        let addrs: HashMap<NodeId, SocketAddr> = members
            .iter()
            .map(|m| (m.node.clone(), m.control))
            .collect();
        let lives: HashMap<NodeId, Incarnation> = members
            .iter()
            .map(|m| (m.node.clone(), m.incarnation))
            .collect();
        // A member back under a new life lost its shard: plan as if it had left and joined.
        let restarted: Vec<(NodeId, Incarnation)> = members
            .iter()
            .filter(|m| m.node != self.me)
            .filter(|m| old.lives.get(&m.node).is_some_and(|i| *i != m.incarnation))
            .map(|m| (m.node.clone(), m.incarnation))
            .collect();
        let ring_changed = new_ring.members() != old.ring.members() || !restarted.is_empty();
        let view = Arc::new(View {
            ring: new_ring.clone(),
            addrs,
            lives,
            changed_at: if ring_changed {
                Instant::now()
            } else {
                old.changed_at
            },
        });
        *self.view.write() = view.clone();
        let from = if restarted.is_empty() {
            old.ring.clone()
        } else {
            Ring::new(
                old.ring
                    .members()
                    .iter()
                    .filter(|n| !restarted.iter().any(|(r, _)| r == *n))
                    .cloned(),
                self.cfg.vnodes,
            )
        };
        if ring_changed {
            // A node's first ring: the range holders before it joined are the others.
            let previous = if old.ring.is_empty() {
                Ring::new(
                    members
                        .iter()
                        .map(|m| m.node.clone())
                        .filter(|n| *n != self.me),
                    self.cfg.vnodes,
                )
            } else {
                from.clone()
            };
            self.local
                .set_holders(previous, new_ring.clone(), self.cfg.replicas);
        }
        let mut report = HandoffReport {
            dropped: self.drop_due(),
            restarted: restarted.len(),
            ..HandoffReport::default()
        };
        if !ring_changed {
            return report;
        }
        for m in old.ring.members() {
            let gone = !view.addrs.contains_key(m) || restarted.iter().any(|(r, _)| r == m);
            if gone && let Some(a) = old.addrs.get(m) {
                self.rpc.forget(*a);
            }
        }
        let plan = self.local.with_shard(|sh, _| {
            report.gc = sh.set_live(members.iter().map(|m| m.node.clone()));
            for (node, life) in &restarted {
                report.gc += sh.drop_incarnations_before(node, *life);
            }
            handoff::plan(sh, &self.me, &from, &new_ring, self.cfg.replicas)
        });
        // Members new to the ring (joined, or back under a new life) wait for each earlier
        // member to say its hand-off is done.
        let newcomers: Vec<NodeId> = if from.is_empty() {
            Vec::new()
        } else {
            new_ring
                .members()
                .iter()
                .filter(|n| **n != self.me && !from.contains(n))
                .cloned()
                .collect()
        };
        if !old.ring.is_empty() {
            report.rings = Some((from, new_ring.clone()));
        }
        let ok_all = self.send_handoff(&view, &plan.sends, &newcomers, &mut report);
        if ok_all && !plan.drops.is_empty() {
            if self.cfg.drop_grace.is_zero() {
                self.local.with_shard(|sh, _| sh.drop_keys(&plan.drops));
                report.dropped += plan.drops.len();
            } else {
                self.pending_drops
                    .lock()
                    .push((Instant::now() + self.cfg.drop_grace, plan.drops));
            }
        }
        self.c.handoff_sent.add(report.sent as u64);
        self.c.handoff_dropped.add(report.dropped as u64);
        tracing::info!(
            members = members.len(),
            restarted = report.restarted,
            sent = report.sent,
            dropped = report.dropped,
            gc = report.gc,
            "directory ring changed"
        );
        report
    }
}

/// Decodes a shard's reply frame with its [`Moving`] hints (a reply without them, as an older
/// shard sends, has none).
/// How much member `me` prefers asking member `m` about a key both can answer: a fixed
/// pseudo-random order of the members per asking node.
fn peer_preference(me: u32, m: u32) -> u64 {
    let mut x = (u64::from(me) << 32 | u64::from(m)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn decode_hinted(frame: &[u8]) -> Result<(DirReply, Moving), peercache_wire::WireError> {
    let env = envelope::Envelope::parse(frame)?;
    if env.kind == <rpc::RpcError as envelope::Message>::KIND {
        let e: rpc::RpcError = env.decode()?;
        return Err(peercache_wire::WireError::Remote {
            code: e.code,
            message: e.message,
        });
    }
    let mut reply: DirReply = env.decode()?;
    LayoutRuns::read(&env, &mut reply)?;
    let moving = env
        .extension_value::<Moving>(EXT_MOVING)?
        .unwrap_or_default();
    Ok((reply, moving))
}

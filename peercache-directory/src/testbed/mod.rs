//! A directory fleet in one process (feature `testbed`, for tests and benches).
//!
//! Each node is a real [`DirectoryService`] behind a real RPC server on its own loopback
//! address `127.0.0.(i+1)`, with a real [`DirectoryClient`]. A membership change runs the real
//! hand-off ([`DirectoryClient::apply_membership`]) and the owners' re-announcement
//! ([`handoff::reannounce_routes`], then [`DirectoryClient::insert_routed`]) on every node at
//! once, over real sockets; only discovery is simulated: the time a fleet takes to notice a
//! silent member is a given ([`RecoveryConfig::detect`]), not waited for.
//!
//! [`Fleet`] measures recovery: with `pages` pages published round-robin by the nodes, kill a
//! node (or restart it with an empty shard), and report when every page still held by a live
//! owner is found again on all of its ring owners, how many entries moved, and what a reader
//! sees. [`join`] measures a newcomer's paced hand-off under a lookup load.

pub mod join;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcServer, ServerConfig};
use peercache_wire::{Auth, Incarnation, NodeId, PageKey};

use crate::DirError;
use crate::client::{ClientConfig, DirectoryClient, Member};
use crate::handoff;
use crate::location::{CopyClass, Location, Rail};
use crate::ring::Ring;
use crate::service::DirectoryService;
use crate::shard::ShardConfig;

/// The id of test node `i` (`node-{i}`).
pub fn node_id(i: usize) -> NodeId {
    NodeId::new(format!("node-{i}")).expect("a short ascii node id")
}

/// One directory node: its shard, served on `127.0.0.(i+1)`, and its routing client.
pub struct TestNode {
    /// Node id.
    pub id: NodeId,
    /// This life of the node.
    pub incarnation: Incarnation,
    /// Its shard.
    pub service: Arc<DirectoryService>,
    /// The RPC server in front of the shard.
    pub server: RpcServer,
    /// Its routing client.
    pub client: DirectoryClient,
}

impl std::fmt::Debug for TestNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNode")
            .field("id", &self.id)
            .field("incarnation", &self.incarnation)
            .field("control", &self.server.local_addr())
            .finish()
    }
}

impl TestNode {
    /// Starts node `i` ([`node_id`]) in life `incarnation` with an empty shard.
    ///
    /// # Errors
    /// [`DirError::Wire`] when its address cannot be bound.
    pub fn start(i: usize, incarnation: Incarnation, cfg: ClientConfig) -> Result<Self, DirError> {
        let id = node_id(i);
        let service = Arc::new(DirectoryService::new(ShardConfig::default()));
        let bind = SocketAddr::from(([127, 0, 0, (i % 250 + 1) as u8], 0));
        let server = RpcServer::start(
            ServerConfig {
                bind,
                planes: vec![Plane::Control],
                node: Some(id.clone()),
                incarnation,
                max_frame: 16 << 20,
                handshake_timeout: Duration::from_secs(2),
                max_connections: 256,
                offload: &[],
                workers: 1,
                name: "dir-testbed",
                auth: Auth::none(),
                shares: Default::default(),
            },
            service.clone().into_handler(),
        )
        .map_err(DirError::Wire)?;
        let rpc = RpcClient::new(rpc::ClientConfig {
            hello: Hello::new(Plane::Control, Some(id.clone()), incarnation),
            max_idle_per_peer: 8,
            max_frame: 16 << 20,
            auth: Auth::none(),
        });
        let client = DirectoryClient::new(id.clone(), service.clone(), rpc, cfg);
        Ok(TestNode {
            id,
            incarnation,
            service,
            server,
            client,
        })
    }

    /// This node as a member of the ring.
    pub fn member(&self) -> Member {
        Member {
            node: self.id.clone(),
            control: self.server.local_addr(),
            incarnation: self.incarnation,
        }
    }
}

/// What a recovery run is made of.
#[derive(Clone, Debug)]
pub struct RecoveryConfig {
    /// Nodes in the fleet (each a directory shard and a publishing owner).
    pub nodes: usize,
    /// Pages, published round-robin: page `i` belongs to node `i % nodes`.
    pub pages: u64,
    /// Directory owners per entry (`directory_replicas`).
    pub replicas: usize,
    /// Simulated time from a node's death (or restart) until every member's view has the
    /// change: discovery's bound, `member_ttl` + 2 × `heartbeat_interval` (5 s by default).
    pub detect: Duration,
    /// Deadline of one directory request.
    pub timeout: Duration,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            nodes: 16,
            pages: 100_000,
            replicas: 2,
            detect: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
        }
    }
}

/// What a reader of the fleet sees after a change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Pages whose owner is alive in the life that published them.
    pub expected: u64,
    /// Of those, pages that every ring owner's shard holds with that owner's location.
    pub placed: u64,
    /// Of those, pages a lookup through a live node's client returns with exactly the
    /// published location (no grace-period broadcast: only the ring's owners are asked).
    pub found: u64,
    /// Lookups that named the owner with another location than the one published.
    pub wrong: u64,
    /// Pages of a dead owner, or of an owner's previous life, a lookup still returned.
    pub stale: u64,
}

impl Check {
    /// Every expected page placed and found, nothing wrong or stale.
    pub fn complete(&self) -> bool {
        self.placed == self.expected
            && self.found == self.expected
            && self.wrong == 0
            && self.stale == 0
    }
}

/// One recovery, measured.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// Simulated: until every member saw the change ([`RecoveryConfig::detect`]).
    pub detect: Duration,
    /// Real: every node's hand-off and re-announcement, run at once on this machine.
    pub handoff: Duration,
    /// Entries shards sent each other.
    pub handed_off: u64,
    /// Entries whose hand-off failed.
    pub failed: u64,
    /// Entries owners re-announced to the replicas the change added.
    pub reannounced: u64,
    /// Locations collected (dead owners, previous lives).
    pub collected: u64,
    /// What a reader saw afterwards.
    pub check: Check,
}

impl Recovery {
    /// When every page of a live owner was found again, on the simulated clock: detection,
    /// then the measured hand-off (an upper bound: here every node shares this machine).
    pub fn recovered_at(&self) -> Duration {
        self.detect + self.handoff
    }
}

/// The key of page `i`.
pub fn page_key(i: u64) -> PageKey {
    PageKey::from_bytes(&i.to_le_bytes())
}

/// The location test node `owner` published page `i` at, in life `life`, at pool offset `addr`
/// (generation and checksum derived from `i`, so a reader can tell it from any other page's).
pub fn published(owner: usize, life: Incarnation, i: u64, addr: u64) -> Location {
    Location {
        node: node_id(owner),
        incarnation: life,
        rails: smallvec::smallvec![Rail {
            endpoint: SocketAddr::from(([127, 0, 0, (owner % 250 + 1) as u8], 9000)),
            region: 0x5eed,
        }],
        addr,
        len: 4096,
        valid_len: 4096,
        generation: i + 1,
        checksum: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

/// A fleet of [`TestNode`]s with pages published round-robin (see the module docs).
pub struct Fleet {
    cfg: RecoveryConfig,
    client: ClientConfig,
    nodes: Vec<Option<TestNode>>,
    /// Per node, the life that published its pages (None: the pages are gone).
    published: Vec<Option<Incarnation>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("cfg", &self.cfg).finish()
    }
}

impl Fleet {
    /// Starts `cfg.nodes` nodes, gives them one ring and records every page on its ring
    /// owners' shards (directly: loading is not what is measured).
    ///
    /// # Errors
    /// [`DirError::Wire`] when a node cannot bind.
    pub fn start(cfg: RecoveryConfig) -> Result<Fleet, DirError> {
        let client = ClientConfig {
            replicas: cfg.replicas,
            timeout: cfg.timeout,
            handoff_grace: Duration::ZERO,
            drop_grace: Duration::ZERO,
            ..ClientConfig::default()
        };
        let nodes: Vec<Option<TestNode>> = (0..cfg.nodes)
            .map(|i| TestNode::start(i, Incarnation(1), client.clone()).map(Some))
            .collect::<Result<_, _>>()?;
        let mut fleet = Fleet {
            published: vec![Some(Incarnation(1)); cfg.nodes],
            cfg,
            client,
            nodes,
        };
        let members = fleet.members();
        for n in fleet.nodes.iter().flatten() {
            n.client.apply_membership(&members);
        }
        fleet.load();
        Ok(fleet)
    }

    fn members(&self) -> Vec<Member> {
        self.nodes.iter().flatten().map(TestNode::member).collect()
    }

    fn ring(&self) -> Ring {
        self.nodes
            .iter()
            .flatten()
            .next()
            .map(|n| n.client.ring())
            .unwrap_or_default()
    }

    /// The location page `i` was published at by its owner in life `life`.
    fn location(&self, i: u64, life: Incarnation) -> Location {
        let owner = (i % self.cfg.nodes as u64) as usize;
        published(owner, life, i, (i / self.cfg.nodes as u64) * 4096)
    }

    /// Records every page on the shards of its ring owners, a thread per node.
    fn load(&mut self) {
        let ring = self.ring();
        let n = self.cfg.nodes;
        let mut per_node: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut idx = Vec::new();
        let by_id: std::collections::HashMap<&NodeId, usize> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (&t.id, i)))
            .collect();
        for i in 0..self.cfg.pages {
            ring.owner_indices(page_key(i), self.cfg.replicas, &mut idx);
            for &m in &idx {
                per_node[by_id[ring.member(m)]].push(i);
            }
        }
        let this = &*self;
        std::thread::scope(|s| {
            for (node, pages) in this.nodes.iter().zip(&per_node) {
                let Some(node) = node else { continue };
                s.spawn(move || {
                    node.service.with_shard(|sh, now| {
                        for &i in pages {
                            sh.insert(page_key(i), this.location(i, Incarnation(1)), now);
                        }
                    });
                });
            }
        });
    }

    /// Kills node `victim`: its server stops, its pages are gone, and (after the simulated
    /// detection) every other node applies the new membership at once.
    pub fn kill(&mut self, victim: usize) -> Recovery {
        if let Some(mut t) = self.nodes[victim].take() {
            t.server.shutdown();
        }
        self.published[victim] = None;
        self.change()
    }

    /// Restarts node `victim` in a new life with an empty shard and pool (its pages are gone;
    /// the others see the same id under another incarnation, with no departure in between).
    ///
    /// # Errors
    /// [`DirError::Wire`] when the new life cannot bind.
    pub fn restart(&mut self, victim: usize) -> Result<Recovery, DirError> {
        let life = self.nodes[victim]
            .take()
            .map(|mut t| {
                t.server.shutdown();
                t.incarnation
            })
            .unwrap_or(Incarnation(1));
        let next = Incarnation(life.0 + 1);
        self.nodes[victim] = Some(TestNode::start(victim, next, self.client.clone())?);
        self.published[victim] = None;
        Ok(self.change())
    }

    /// Every live node applies the current membership at once, then re-announces the pages it
    /// owns that moved; measured, then checked.
    fn change(&mut self) -> Recovery {
        let members = self.members();
        let this = &*self;
        let started = Instant::now();
        let per_node: Vec<(u64, u64, u64, u64)> = std::thread::scope(|s| {
            let jobs: Vec<_> = this
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, t)| t.as_ref().map(|t| (i, t)))
                .map(|(i, t)| {
                    let members = &members;
                    s.spawn(move || {
                        let report = t.client.apply_membership(members);
                        let reannounced = match (&report.rings, this.published[i]) {
                            (Some((before, after)), Some(life)) => {
                                this.reannounce(i, life, &t.client, before, after)
                            }
                            _ => 0,
                        };
                        (
                            report.sent as u64,
                            report.failed as u64,
                            reannounced,
                            report.gc as u64,
                        )
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().expect("a recovery thread panicked"))
                .collect()
        });
        let handoff = started.elapsed();
        let mut r = Recovery {
            detect: self.cfg.detect,
            handoff,
            ..Recovery::default()
        };
        for (sent, failed, re, gc) in per_node {
            r.handed_off += sent;
            r.failed += failed;
            r.reannounced += re;
            r.collected += gc;
        }
        r.check = self.check();
        r
    }

    /// Owner `i`'s re-announcement, as a node does it after a ring change.
    fn reannounce(
        &self,
        owner: usize,
        life: Incarnation,
        client: &DirectoryClient,
        before: &Ring,
        after: &Ring,
    ) -> u64 {
        let n = self.cfg.nodes as u64;
        let own = (owner as u64..self.cfg.pages).step_by(n as usize);
        let plan = handoff::reannounce_routes(before, after, self.cfg.replicas, own.map(page_key));
        let entries: Vec<(PageKey, Location)> = plan
            .pages
            .iter()
            .map(|&j| {
                let i = owner as u64 + j as u64 * n;
                (page_key(i), self.location(i, life))
            })
            .collect();
        client.insert_routed(&entries, &plan.routes) as u64
    }

    /// What a reader sees now: placement on every ring owner's shard (in process) and a
    /// lookup of every page through the first live node's client (over its sockets).
    pub fn check(&self) -> Check {
        let ring = self.ring();
        let mut c = Check::default();
        let Some(reader) = self.nodes.iter().flatten().next() else {
            return c;
        };
        let by_id: std::collections::HashMap<&NodeId, &TestNode> =
            self.nodes.iter().flatten().map(|t| (&t.id, t)).collect();
        let n = self.cfg.nodes as u64;
        let mut idx = Vec::new();
        const BATCH: u64 = 16 * 1024;
        let mut start = 0;
        while start < self.cfg.pages {
            let end = (start + BATCH).min(self.cfg.pages);
            let keys: Vec<PageKey> = (start..end).map(page_key).collect();
            let found = reader.client.lookup(&keys).unwrap_or_default();
            for (j, i) in (start..end).enumerate() {
                let owner = (i % n) as usize;
                let owner_id = node_id(owner);
                let got = found.get(j).and_then(Option::as_ref);
                let named = got.and_then(|o| o.iter().find(|l| l.node == owner_id));
                let Some(life) = self.published[owner] else {
                    c.stale += u64::from(named.is_some());
                    continue;
                };
                c.expected += 1;
                let want = self.location(i, life);
                match named {
                    Some(l) if *l == want => c.found += 1,
                    Some(_) => c.wrong += 1,
                    None => {}
                }
                ring.owner_indices(keys[j], self.cfg.replicas, &mut idx);
                let everywhere = idx.iter().all(|&m| {
                    by_id.get(ring.member(m)).is_some_and(|t| {
                        t.service
                            .with_shard(|sh, _| sh.peek(keys[j]).is_some_and(|o| o.contains(&want)))
                    })
                });
                c.placed += u64::from(everywhere);
            }
            start = end;
        }
        c
    }
}

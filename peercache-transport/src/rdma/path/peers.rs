//! Peers as this node reads them over RDMA: each one's region table (fetched when unknown,
//! again when a batch names a region or chunk it lacks) or why it is left on TCP for now.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::RdmaPath;
use super::plane::{PeerOnTcp, Registrar};
use crate::Batch;
use crate::rdma::bootstrap::{self, ChunkedRegion, RegionRkeys, RegionTables, Responder};
use crate::rdma::engine::Verbs;

/// A peer's region table as this node reads it: every region in the chunked form (one
/// registered whole is a single chunk of its full length).
pub(super) struct RemoteTable {
    pub(super) regions: HashMap<u64, ChunkedRegion>,
    /// Some region had chunks still to register when the table was fetched.
    pub(super) incomplete: bool,
    pub(super) fetched: Instant,
}

impl RemoteTable {
    fn new(t: RegionTables) -> Self {
        let whole = t.whole.into_iter().map(|r: RegionRkeys| ChunkedRegion {
            key: r.key,
            base: r.base,
            len: r.len,
            chunk: r.len.max(1),
            chunks: 1,
            rkeys: vec![r.rkeys],
            writable: r.writable,
        });
        let regions: HashMap<u64, ChunkedRegion> =
            whole.chain(t.chunked).map(|r| (r.key, r)).collect();
        RemoteTable {
            incomplete: regions.values().any(|r| !r.complete()),
            regions,
            fetched: Instant::now(),
        }
    }

    /// Whether an op of `batch` targets a chunk of a region the peer was still registering
    /// when this table was fetched (a newer table may have its keys). Free once the peer's
    /// regions were all complete: no op is looked at.
    pub(super) fn awaits_chunks(&self, batch: &Batch) -> bool {
        self.incomplete
            && batch.ops().iter().any(|o| {
                self.regions.get(&o.remote.region.0).is_some_and(|r| {
                    !r.complete()
                        && crate::validate::contains(
                            r.base,
                            r.len,
                            o.remote.addr,
                            u64::from(o.remote.len),
                        )
                        && r.chunk_of(o.remote.addr, u64::from(o.remote.len)).is_none()
                })
            })
    }
}

/// A peer's RDMA state.
pub(super) enum Peer {
    /// Its region table.
    Ready(Arc<RemoteTable>),
    /// No RDMA there (or the fetch failed); retry after `until`. `why` says what failed.
    Unavailable { until: Instant, why: String },
}

/// How long a peer without RDMA is left on TCP before asking again.
pub(super) const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How often a peer's table is fetched again while a batch targets chunks it was still
/// registering (those batches go over TCP meanwhile).
pub(super) const CHUNK_REFRESH: Duration = Duration::from_millis(200);

impl<V: Verbs + Registrar + Responder> RdmaPath<V> {
    /// The peer's region table, fetching it when unknown (or when `refresh`).
    pub(super) fn peer_regions(&self, peer: SocketAddr, refresh: bool) -> Option<Arc<RemoteTable>> {
        {
            let peers = self.peers.lock();
            match peers.get(&peer) {
                Some(Peer::Ready(t)) if !refresh => return Some(t.clone()),
                Some(Peer::Unavailable { until, .. }) if Instant::now() < *until => return None,
                _ => {}
            }
        }
        self.counters.table_fetches.add(1);
        match bootstrap::fetch_regions(peer, self.node.clone(), &self.auth, self.timeout) {
            Ok(tables) => {
                let t = Arc::new(RemoteTable::new(tables));
                self.peers.lock().insert(peer, Peer::Ready(t.clone()));
                Some(t)
            }
            Err(e) => {
                self.mark_unavailable(peer, format!("region table: {e}"));
                None
            }
        }
    }

    /// Leaves `peer` on TCP for [`RETRY_AFTER`]: one WARN line with the reason, counted in
    /// `peercache_rdma_peers_unavailable_total`, listed by [`RdmaPlane::peers_on_tcp`].
    pub(super) fn mark_unavailable(&self, peer: SocketAddr, why: String) {
        tracing::warn!(
            %peer, reason = %why,
            "no RDMA to this peer: reading and writing over TCP for {} s", RETRY_AFTER.as_secs()
        );
        self.counters.unavailable.add(1);
        self.peers.lock().insert(
            peer,
            Peer::Unavailable {
                until: Instant::now() + RETRY_AFTER,
                why,
            },
        );
    }
    /// [`RdmaPlane::peers_on_tcp`].
    pub(super) fn unavailable_peers(&self) -> Vec<PeerOnTcp> {
        let now = Instant::now();
        self.peers
            .lock()
            .iter()
            .filter_map(|(peer, p)| match p {
                Peer::Unavailable { until, why } if *until > now => Some(PeerOnTcp {
                    peer: *peer,
                    why: why.clone(),
                    retry_in: *until - now,
                }),
                _ => None,
            })
            .collect()
    }
}

//! Disk-tier promotions on a node: pages brought back into the pool for a read here, for a
//! reader on another node, or in the background after an `exists`; and the resident
//! location of a page this node holds.

use std::net::SocketAddr;
use std::time::Duration;

use peercache_pool::{PublishScratch, Published};
use peercache_wire::envelope;
use peercache_wire::rpc;
use peercache_wire::{NodeId, PageKey};

use crate::control::{MAX_PROMOTE_KEYS, StoreReply, StoreRequest};
use crate::node::home::PageHome;

/// Promotions, with what they need of their node (`Core::promotion`).
pub(crate) struct Promotion<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    pub(crate) op_timeout: Duration,
}

impl<'a> Promotion<'a> {
    /// Promotes `keys` from this node's disk tier into its pool (pages already resident are
    /// answered as they are) and returns their resident locations. The directory learns of
    /// them inline (`inline`) or through the background batcher (when serving a peer).
    pub(crate) fn promote_here(
        &self,
        keys: &[PageKey],
        inline: bool,
    ) -> Vec<Option<peercache_directory::Location>> {
        self.promote_inner(keys, inline, false).0
    }

    /// [`Promotion::promote_here`] for a read on this node: the promoted pages are leased in the
    /// same step, so no other promotion or publish can evict them before the read copies them.
    pub(crate) fn promote_and_lease(
        &self,
        keys: &[PageKey],
    ) -> (
        Vec<Option<peercache_directory::Location>>,
        Option<peercache_pool::Leases<'a>>,
    ) {
        self.promote_inner(keys, true, true)
    }

    fn promote_inner(
        &self,
        keys: &[PageKey],
        inline: bool,
        lease: bool,
    ) -> (
        Vec<Option<peercache_directory::Location>>,
        Option<peercache_pool::Leases<'a>>,
    ) {
        let mut res = vec![None; keys.len()];
        let Some(disk) = self.home.disk else {
            return (res, None);
        };
        if keys.iter().any(|k| disk.is_pending(*k)) {
            // Written through but not on disk yet: wait for the writer (bounded queue).
            disk.flush();
        }
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        let serial = self.home.tasks.promote_lock.lock();
        self.home.pool.promote_batch(
            disk,
            keys,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        let leases = lease.then(|| self.home.pool.lease_batch(keys));
        drop(serial);
        let mut entries = Vec::new();
        let mut promoted = 0u64;
        for (i, p) in out.iter().enumerate() {
            if let Published::New(loc) | Published::Duplicate(loc) = p {
                promoted += u64::from(matches!(p, Published::New(_)));
                let l = self.home.stamp.resident(loc);
                entries.push((keys[i], l.clone()));
                res[i] = Some(l);
            }
        }
        self.home.metrics.promotes_owner.add(promoted);
        let batcher = self.home.tasks.evictions.lock();
        if let Some(b) = batcher.as_ref() {
            b.push(evicted);
        }
        if inline {
            drop(batcher);
            if !entries.is_empty() {
                let _ = self.home.dir.insert(&entries);
            }
        } else if let Some(b) = batcher.as_ref() {
            b.publish(entries);
        }
        (res, leases)
    }

    /// Asks other owners to promote disk-tier pages: one RPC per owner (split at
    /// [`MAX_PROMOTE_KEYS`]), all in flight at once, bounded by `op_timeout`. Returns, per
    /// group, one answer per key (None: not promoted, owner unreachable or unknown).
    pub(crate) fn ask_promote(
        &self,
        groups: &[(NodeId, Vec<PageKey>)],
    ) -> Vec<Vec<Option<peercache_directory::Location>>> {
        let mut answers: Vec<Vec<Option<peercache_directory::Location>>> =
            groups.iter().map(|(_, k)| vec![None; k.len()]).collect();
        let mut reqs: Vec<(SocketAddr, Vec<u8>, usize, usize)> = Vec::new();
        for (g, (node, keys)) in groups.iter().enumerate() {
            let Some(ep) = self.home.dir.control_of(node) else {
                continue;
            };
            for (c, chunk) in keys.chunks(MAX_PROMOTE_KEYS).enumerate() {
                if let Ok(f) = envelope::encode(&StoreRequest::Promote(chunk.to_vec()), &[]) {
                    reqs.push((ep, f, g, c * MAX_PROMOTE_KEYS));
                }
            }
        }
        let calls: Vec<(SocketAddr, &[u8])> =
            reqs.iter().map(|(ep, f, ..)| (*ep, f.as_slice())).collect();
        let replies = self.home.dir.rpc().call_many(&calls, self.op_timeout);
        let mut asked = 0u64;
        for ((_, _, g, at), r) in reqs.iter().zip(replies) {
            match r.and_then(|f| rpc::decode_reply::<StoreReply>(&f)) {
                Ok(StoreReply::Promoted(locs)) => {
                    let slot = &mut answers[*g];
                    for (j, l) in locs.into_iter().enumerate() {
                        if let Some(dst) = slot.get_mut(at + j) {
                            asked += 1;
                            *dst = l;
                        }
                    }
                }
                Ok(other) => tracing::debug!(reply = ?other, "unexpected reply to a promote"),
                Err(e) => tracing::debug!(error = %e, "promote request failed"),
            }
        }
        self.home.metrics.promotes_asked.add(asked);
        answers
    }
}

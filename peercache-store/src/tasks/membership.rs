//! Keeping the directory ring in step with discovery (the node's membership thread runs it):
//! the members' slotmap layouts and storage view, the departed and strangers forgotten by the
//! transport, and this pool's pages re-announced to the replicas a ring change added.

use std::net::SocketAddr;
use std::sync::Arc;

use peercache_directory::Member;
use peercache_discovery::{Membership, NodeInfo};
use peercache_transport::Transport;
use peercache_wire::NodeId;

use crate::modes::central::owner::StorageOwner;
use crate::modes::state::ModeState;
use crate::node::home::PageHome;

/// What the membership sync needs of the node.
pub(crate) struct MembershipSync<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    pub(crate) me: &'a NodeId,
    /// Virtual nodes per storage server (the storage view's ring).
    pub(crate) vnodes: u32,
    /// Directory replicas per page (re-announcements).
    pub(crate) directory_replicas: usize,
    pub(crate) discovery: &'a Membership,
    /// The slot layouts or storage view the members' announcements update.
    pub(crate) mode: &'a ModeState,
    pub(crate) transport: &'a Transport,
    /// Seconds a storage server's reservation waits for its commit (reaped at each sync).
    pub(crate) reservation_timeout: f64,
}

impl MembershipSync<'_> {
    /// Releases a storage server's reservations whose writer did not commit in time (left,
    /// or gave up); nothing on other nodes.
    pub(crate) fn reap_reservations(&self) {
        StorageOwner::of(self.home, self.mode, self.reservation_timeout).reap_reservations();
    }

    /// Counts and logs each member's refused slotmap layout once per announcement.
    fn count_refused_layouts(
        &self,
        slots: &crate::modes::state::SlotMode,
        infos: &[NodeInfo],
        refused: Vec<crate::layout::slot::Refused>,
    ) {
        let mut seen = slots.refused.lock();
        let mut now = std::collections::HashMap::new();
        for r in refused {
            let attr = infos
                .iter()
                .find(|m| m.node == r.node)
                .and_then(|m| {
                    m.attrs
                        .iter()
                        .find(|(k, _)| k == crate::modes::slot::LAYOUT_ATTR)
                })
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            if seen.get(&r.node) != Some(&attr) {
                self.home.metrics.layouts_refused.add(1);
                tracing::warn!(
                    member = %r.node,
                    error = %r.error,
                    "refused a member's slotmap layout: its keys are misses"
                );
            }
            now.insert(r.node, attr);
        }
        *seen = now;
    }

    /// Installs discovery's current members as the directory ring.
    pub(crate) fn sync(&self) {
        let infos = self.discovery.members();
        if let Some(slots) = self.mode.slots() {
            let (good, refused) = crate::modes::slot::layouts(&infos);
            *slots.layouts.write() = Arc::new(good);
            self.count_refused_layouts(slots, &infos, refused);
        } else if let Some(st) = self.mode.storage() {
            *st.view.write() = Arc::new(crate::modes::storage_view::StorageView::of(
                &infos,
                self.vnodes,
            ));
        }
        self.reap_reservations();
        self.forget_departed(&infos);
        if !infos.is_empty() {
            let storage = infos.iter().filter(|m| m.role == "storage").count();
            self.home.metrics.storage_nodes.set(storage as f64);
        }
        let members: Vec<Member> = infos
            .into_iter()
            .map(|m| Member {
                node: m.node,
                control: m.control,
                incarnation: m.incarnation,
            })
            .collect();
        if members.is_empty() {
            return;
        }
        self.home.metrics.members.set(members.len() as f64);
        let has_me = members.iter().any(|m| m.node == *self.me);
        let report = self.home.dir.apply_membership(&members);
        if has_me && let Some((before, after)) = &report.rings {
            self.reannounce(before, after);
        }
        if has_me {
            let mut ready = self.home.tasks.ring_ready.0.lock();
            if !*ready {
                *ready = true;
                self.home.tasks.ring_ready.1.notify_all();
            }
        }
    }

    /// Tells the transport to drop what it keeps for members that left: their idle pooled
    /// connections and any host-local attachment.
    fn forget_departed(&self, infos: &[NodeInfo]) {
        if infos.is_empty() {
            // No view of the cluster right now (not "everyone left").
            return;
        }
        let now: std::collections::HashSet<SocketAddr> =
            infos.iter().flat_map(|m| m.data.iter().copied()).collect();
        let gone: Vec<SocketAddr> = {
            let mut known = self.home.tasks.member_data.lock();
            let gone = known.difference(&now).copied().collect();
            *known = now;
            gone
        };
        for peer in gone {
            tracing::debug!(%peer, "member left; its transport state is dropped");
            self.transport.forget_peer(peer);
        }
    }

    /// Drops transport state for peers that are not members (a read may have reached a member
    /// after it left, re-creating what [`MembershipSync::forget_departed`] dropped). Once a heartbeat.
    pub(crate) fn forget_strangers(&self) {
        let known = self.home.tasks.member_data.lock().clone();
        if known.is_empty() {
            return;
        }
        for p in self.transport.peer_stats() {
            if !known.contains(&p.peer) {
                tracing::debug!(peer = %p.peer, "not a member; its transport state is dropped");
                self.transport.forget_peer(p.peer);
            }
        }
    }

    /// Announces this pool's pages to the directory replicas a ring change added for them.
    ///
    /// Shard-to-shard hand-off moves entries when the ring changes, but nodes see a change at
    /// slightly different times, and a page published under an older view may miss a replica
    /// the other shards assume it has. The owner knows its pages and the view it published
    /// them under: for each page whose replica set gained members between `before` and
    /// `after`, it sends the entry to those new members only — so the traffic is the changed
    /// share of this node's pages (about 1/N per join), never the whole pool, and a lookup that
    /// falls back to a replica (primary down or unreachable) still finds the entry.
    fn reannounce(&self, before: &peercache_directory::Ring, after: &peercache_directory::Ring) {
        let mut pages = Vec::new();
        self.home.pool.live_pages(&mut pages);
        let plan = peercache_directory::handoff::reannounce_routes(
            before,
            after,
            self.directory_replicas,
            pages.iter().map(|(k, _)| *k),
        );
        let entries: Vec<_> = plan
            .pages
            .iter()
            .map(|&i| (pages[i].0, self.home.stamp.resident(&pages[i].1)))
            .collect();
        if entries.is_empty() {
            return;
        }
        let done = self.home.dir.insert_routed(&entries, &plan.routes);
        self.home.metrics.reannounced.add(done as u64);
        tracing::debug!(
            pages = entries.len(),
            sent = done,
            "announced pages to the replicas a ring change added"
        );
    }
}

//! A membership change: the new ring, this node's shard entries handed to their new owners
//! (paced), entries of members that left or restarted dropped, and the hand-off's own
//! entries dropped once their grace has passed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use peercache_wire::envelope::{self, Extension};
use peercache_wire::rpc;
use peercache_wire::{Incarnation, NodeId, PageKey};

use crate::handoff;
use crate::location::Owners;
use crate::msg::{DirReply, DirRequest, EXT_HANDOFF_MORE, LayoutRuns};
use crate::ring::Ring;

use super::{DirectoryClient, Member, View};

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

impl DirectoryClient {
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

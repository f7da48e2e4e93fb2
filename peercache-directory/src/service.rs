//! The serving side: a shard behind a lock, answering [`DirRequest`]s.
//!
//! [`DirectoryService::handle`] plugs into any `peercache-wire` RPC server; the store routes
//! directory kinds to it from its one control listener.

use std::time::Instant;

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use peercache_wire::envelope::{self, Envelope, Extension, Message};
use peercache_wire::metrics::IDENTITY_REFUSED_TOTAL;
use peercache_wire::rpc::{Peer, Reply, RpcError};
use peercache_wire::tally::Tally;

use crate::admission::{self, Holders, Refusal};
use crate::location::Owners;
use crate::msg::{
    DirReply, DirRequest, EXT_HANDOFF_MORE, EXT_HOLDERS_ONLY, EXT_MOVING, LayoutRuns, Moving,
};
use crate::receiving::Receiving;
use crate::ring::Ring;
use crate::shard::{Millis, Shard, ShardConfig};
use peercache_wire::PageKey;

/// One directory entry: a key and its owners.
type Entry = (PageKey, Owners);

/// What a shard refused, counted once each.
#[derive(Debug, Clone)]
pub struct Refusals {
    /// Inserts, removes and marks of another node's copies, and hand-offs from a non-holder
    /// ([`IDENTITY_REFUSED_TOTAL`], `service = "directory"`).
    pub identity: Tally,
    /// Hand-off entries from a node that did not hold the range
    /// ([`crate::metrics::HANDOFF_REFUSED_TOTAL`], `reason = "not_a_holder"`).
    pub not_a_holder: Tally,
    /// Hand-off owners that are not live members (`reason = "dead_owner"`).
    pub dead_owners: Tally,
    /// Hand-off entries naming too many owners (`reason = "too_many_owners"`).
    pub too_many_owners: Tally,
    /// Hand-off entries refused because too many were waiting for this shard's first ring
    /// (`reason = "too_early"`).
    pub too_early: Tally,
}

impl Refusals {
    fn register() -> Self {
        let h = |r: &'static str| {
            Tally::new(metrics::counter!(crate::metrics::HANDOFF_REFUSED_TOTAL, "reason" => r))
        };
        Refusals {
            identity: Tally::new(
                metrics::counter!(IDENTITY_REFUSED_TOTAL, "service" => "directory"),
            ),
            not_a_holder: h("not_a_holder"),
            dead_owners: h("dead_owner"),
            too_many_owners: h("too_many_owners"),
            too_early: h("too_early"),
        }
    }
}

/// One node's shard, served.
#[derive(Debug)]
pub struct DirectoryService {
    shard: Mutex<Shard>,
    entries: metrics::Gauge,
    malformed: metrics::Counter,
    epoch: Instant,
    holders: RwLock<Arc<Holders>>,
    /// Hand-offs that arrived before this shard had a ring to judge them by (a newcomer that
    /// the old members saw first), judged when the ring arrives.
    early: Mutex<Vec<(Peer, Vec<Entry>)>>,
    /// Whether the last ring change's hand-off may still bring entries here.
    receiving: Mutex<Receiving>,
    refusals: Refusals,
    /// Largest number of items accepted in one request.
    pub max_items: usize,
}

impl DirectoryService {
    /// A service over an empty shard.
    pub fn new(cfg: ShardConfig) -> Self {
        DirectoryService {
            shard: Mutex::new(Shard::new(cfg)),
            entries: metrics::gauge!(crate::metrics::SHARD_ENTRIES),
            malformed: metrics::counter!(crate::metrics::MALFORMED_TOTAL),
            epoch: Instant::now(),
            holders: RwLock::new(Arc::new(Holders::default())),
            early: Mutex::new(Vec::new()),
            receiving: Mutex::new(Receiving::default()),
            refusals: Refusals::register(),
            max_items: 1 << 20,
        }
    }

    /// Installs the rings hand-offs are judged by (the directory client calls this on every
    /// ring change): `previous` before the change, `current` after, `replicas` owners per key.
    pub fn set_holders(&self, previous: Ring, current: Ring, replicas: usize) {
        let holders = Arc::new(Holders {
            previous,
            current,
            replicas,
        });
        // Held until the early entries are in: a miss meanwhile waits for its hints, which
        // then name the previous holder.
        let mut receiving = self.receiving.lock();
        let first = std::mem::replace(&mut *self.holders.write(), holders.clone())
            .current
            .is_empty();
        receiving.ring_changed(&holders, first, Instant::now());
        let early = std::mem::take(&mut *self.early.lock());
        for (peer, entries) in early {
            let kept = self.judge_handoff(&peer, &holders, entries);
            self.apply(&DirRequest::Handoff(kept.into()));
        }
    }

    /// Lets this shard point readers at a key's previous holder while it receives a hand-off
    /// ([`crate::msg::EXT_MOVING`]): `me` is its node, `grace` how long after a ring change it
    /// counts as receiving before any sender announced its hand-off (the directory client
    /// calls this with its `handoff_grace`). A shard new to the ring waits longer for the
    /// members it gains from: until each said it is done, or at most
    /// [`SENDER_WAIT`](crate::SENDER_WAIT) (or `grace`, if longer).
    pub fn receive_handoffs(&self, me: peercache_wire::NodeId, grace: std::time::Duration) {
        self.receiving.lock().configure(me, grace);
    }

    /// Whether the last ring change's hand-off may still bring entries to this shard.
    pub fn receiving(&self) -> bool {
        let holders = self.holders.read().clone();
        self.receiving.lock().open(&holders, Instant::now())
    }

    /// For a lookup or exists `req` and this shard's `reply`: the keys it missed that it is
    /// still receiving by hand-off, each with the member to ask instead. Empty otherwise.
    pub fn moving(&self, req: &DirRequest<'_>, reply: &DirReply) -> Moving {
        if !matches!(req, DirRequest::Lookup(_) | DirRequest::Exists(_))
            || self.receiving.lock().idle(Instant::now())
        {
            return Moving::default();
        }
        let missed: Vec<(u32, PageKey)> = match (req, reply) {
            (DirRequest::Lookup(keys), DirReply::Found(v)) => keys
                .iter()
                .zip(v)
                .enumerate()
                .filter(|(_, (_, o))| o.is_none())
                .map(|(i, (k, _))| (i as u32, *k))
                .collect(),
            (DirRequest::Lookup(keys), DirReply::Holders(h)) => keys
                .iter()
                .enumerate()
                .filter(|(i, _)| h.copies_of(*i) == 0)
                .map(|(i, k)| (i as u32, *k))
                .collect(),
            (DirRequest::Exists(keys), DirReply::Exists(v)) => keys
                .iter()
                .zip(v)
                .enumerate()
                .filter(|(_, (_, p))| !**p)
                .map(|(i, (k, _))| (i as u32, *k))
                .collect(),
            _ => return Moving::default(),
        };
        if missed.is_empty() {
            return Moving::default();
        }
        let holders = self.holders.read().clone();
        self.receiving
            .lock()
            .hints(&holders, Instant::now(), missed.into_iter())
    }

    /// Keeps the entries of a hand-off from `peer` that `holders` admit; counts the rest.
    fn judge_handoff(
        &self,
        peer: &Peer,
        holders: &Holders,
        entries: Vec<(PageKey, Owners)>,
    ) -> Vec<(PageKey, Owners)> {
        let (kept, seen) = admission::filter_handoff(peer, holders, entries);
        self.refusals.not_a_holder.add(seen.not_a_holder as u64);
        self.refusals.dead_owners.add(seen.dead_owners as u64);
        self.refusals
            .too_many_owners
            .add(seen.too_many_owners as u64);
        static LOG: peercache_wire::limits::Throttle = peercache_wire::limits::Throttle::new();
        if (seen.not_a_holder > 0 || seen.too_many_owners > 0) && LOG.admit().is_some() {
            tracing::warn!(
                peer = %peer.label(),
                not_a_holder = seen.not_a_holder,
                too_many_owners = seen.too_many_owners,
                dead_owners = seen.dead_owners,
                "refused hand-off entries"
            );
        }
        kept
    }

    /// What this shard refused so far.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Milliseconds since start (the shard's clock).
    pub fn now(&self) -> Millis {
        self.epoch.elapsed().as_millis() as Millis
    }

    /// Runs `f` with the shard locked.
    pub fn with_shard<R>(&self, f: impl FnOnce(&mut Shard, Millis) -> R) -> R {
        let now = self.now();
        f(&mut self.shard.lock(), now)
    }

    /// Applies a request (local callers skip the wire).
    pub fn apply(&self, req: &DirRequest<'_>) -> DirReply {
        let now = self.now();
        let mut sh = self.shard.lock();
        let reply = match req {
            DirRequest::Insert(entries) => DirReply::Inserted(
                entries
                    .iter()
                    .map(|(k, loc)| sh.insert(*k, loc.clone(), now))
                    .collect(),
            ),
            DirRequest::Lookup(keys) => DirReply::Found(sh.lookup_many(keys, now)),
            DirRequest::Exists(keys) => DirReply::Exists(sh.exists_many(keys, now)),
            DirRequest::Remove(items) => DirReply::Applied(
                items
                    .iter()
                    .filter(|r| sh.remove(r.key, &r.node, r.generation))
                    .count() as u32,
            ),
            DirRequest::MarkNonResident(items) => DirReply::Applied(
                items
                    .iter()
                    .filter(|r| sh.mark_nonresident(r.key, &r.node, r.generation))
                    .count() as u32,
            ),
            DirRequest::Handoff(entries) => {
                for (k, owners) in entries.iter() {
                    sh.merge(*k, owners, now);
                }
                DirReply::Applied(entries.len() as u32)
            }
        };
        self.entries.set(sh.len() as f64);
        reply
    }

    /// [`DirRequest::Lookup`] of `keys` answered with holders only ([`EXT_HOLDERS_ONLY`]).
    pub fn apply_holders(&self, keys: &[PageKey]) -> DirReply {
        let now = self.now();
        let mut sh = self.shard.lock();
        DirReply::Holders(sh.holders_many(keys, now))
    }

    fn items(req: &DirRequest<'_>) -> usize {
        match req {
            DirRequest::Insert(v) => v.len(),
            DirRequest::Lookup(v) | DirRequest::Exists(v) => v.len(),
            DirRequest::Remove(v) | DirRequest::MarkNonResident(v) => v.len(),
            DirRequest::Handoff(v) => v.len(),
        }
    }

    /// Admits `req` from `peer`: inserts, removes and marks only of its own copies; hand-offs
    /// only of ranges it held, naming live owners (the rest is dropped and counted).
    fn admit(&self, peer: &Peer, req: DirRequest<'static>) -> Result<DirRequest<'static>, Refusal> {
        if let Err(r) = admission::check_own(peer, &req) {
            self.refusals.identity.add(1);
            return Err(r);
        }
        let DirRequest::Handoff(entries) = req else {
            return Ok(req);
        };
        let holders = self.holders.read().clone();
        let total = entries.len();
        if holders.current.is_empty() {
            // No ring yet: keep the entries (bounded) until one arrives.
            let mut early = self.early.lock();
            let held: usize = early.iter().map(|(_, e)| e.len()).sum();
            if held + total > admission::MAX_EARLY_HANDOFF_ENTRIES {
                self.refusals.too_early.add(total as u64);
                return Err(Refusal::TooEarly {
                    entries: total,
                    max: admission::MAX_EARLY_HANDOFF_ENTRIES,
                });
            }
            early.push((peer.clone(), entries.into_owned()));
            return Ok(DirRequest::Handoff(Vec::new().into()));
        }
        let before = self.refusals.not_a_holder.get();
        let kept = self.judge_handoff(peer, &holders, entries.into_owned());
        let not_a_holder = (self.refusals.not_a_holder.get() - before) as usize;
        if total > 0 && not_a_holder == total {
            self.refusals.identity.add(1);
            return Err(Refusal::NotAHolder {
                entries: total,
                caller: peer.label(),
            });
        }
        Ok(DirRequest::Handoff(kept.into()))
    }

    /// This shard as an RPC server's whole handler: directory requests are handled, any other
    /// kind is answered `CODE_UNKNOWN_KIND` (for a server that serves nothing else).
    pub fn into_handler(self: Arc<Self>) -> peercache_wire::rpc::Handler {
        Arc::new(move |peer, env| {
            self.handle(peer, env).unwrap_or(Reply::Error {
                error: RpcError {
                    code: RpcError::CODE_UNKNOWN_KIND,
                    message: "not a directory request".into(),
                },
                close: false,
            })
        })
    }

    /// Handles a directory envelope from `peer`; `None` if the kind is not a directory
    /// request.
    pub fn handle(&self, peer: &Peer, env: Envelope<'_>) -> Option<Reply> {
        if env.kind != DirRequest::KIND {
            return None;
        }
        let decoded = env.decode::<DirRequest<'static>>().and_then(|mut r| {
            LayoutRuns::read(&env, &mut r)?;
            Ok(r)
        });
        let req = match decoded {
            Ok(r) => r,
            Err(e) => {
                self.malformed.increment(1);
                return Some(Reply::Error {
                    error: RpcError {
                        code: RpcError::CODE_MALFORMED,
                        message: e.to_string(),
                    },
                    close: true,
                });
            }
        };
        // What a sender says is left counts once this request's entries are applied: a
        // sender's last word must not close the window before its last entries are here.
        let announced = match (&req, &peer.node) {
            (DirRequest::Handoff(_), Some(node)) => env
                .extension_value::<u64>(EXT_HANDOFF_MORE)
                .ok()
                .flatten()
                .map(|more| (node, more)),
            _ => None,
        };
        let holders_only = env.extension(EXT_HOLDERS_ONLY).is_ok_and(|e| e.is_some());
        if Self::items(&req) > self.max_items {
            return Some(Reply::Error {
                error: RpcError {
                    code: RpcError::CODE_REFUSED,
                    message: format!("more than {} items in one request", self.max_items),
                },
                close: false,
            });
        }
        let req = match self.admit(peer, req) {
            Ok(r) => r,
            Err(r) => {
                return Some(Reply::Error {
                    error: RpcError {
                        code: RpcError::CODE_FORBIDDEN,
                        message: r.to_string(),
                    },
                    close: false,
                });
            }
        };
        let reply = match &req {
            DirRequest::Lookup(keys) if holders_only => self.apply_holders(keys),
            _ => self.apply(&req),
        };
        if let Some((node, more)) = announced {
            self.receiving.lock().announced(node, more);
        }
        let moving = self.moving(&req, &reply);
        let mut ext = Vec::new();
        if !moving.keys.is_empty() {
            ext.extend(Extension::of(EXT_MOVING, &moving));
        }
        ext.extend(LayoutRuns::extension(&reply).ok().flatten());
        Some(match envelope::encode(&reply, &ext) {
            Ok(f) => Reply::Frame(f),
            Err(e) => Reply::Error {
                error: RpcError {
                    code: RpcError::CODE_REFUSED,
                    message: e.to_string(),
                },
                close: false,
            },
        })
    }
}

//! The storage server's side of a centralized write: reservations (prepare), commit, abort
//! and ingest, and the reaping of expired reservations.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peercache_directory::Location;
use peercache_pool::{PageWrite, PublishScratch, Published, ReplClass, Reservation, Reserved};
use peercache_wire::{NodeId, PageKey};

use crate::control::PrepareOutcome;
use crate::modes::storage_view::{Held, Reservations, Taken};
use crate::node::home::PageHome;

/// The storage server's side, with what it needs of its node (`Core::storage_owner`).
pub(crate) struct StorageOwner<'a> {
    /// This node's pool, disk tier, directory, tasks, counters and stamp.
    pub(crate) home: PageHome<'a>,
    /// The reservations (`None`: this node is not a storage server; every request refused).
    pub(crate) table: Option<&'a Mutex<Reservations>>,
    /// Seconds a reservation waits for its commit.
    pub(crate) reservation_timeout: f64,
}

impl<'a> StorageOwner<'a> {
    /// The storage server's side of `mode` (its reservations when `mode` is a storage server;
    /// otherwise every request is refused) over the node's `home`.
    pub(crate) fn of(
        home: PageHome<'a>,
        mode: &'a crate::modes::state::ModeState,
        reservation_timeout: f64,
    ) -> Self {
        StorageOwner {
            home,
            table: mode.storage_server().map(|s| &*s.reservations),
            reservation_timeout,
        }
    }

    /// Releases reservations whose writer did not commit in time.
    pub(crate) fn reap_reservations(&self) -> usize {
        let Some(table) = self.table else {
            return 0;
        };
        let now = Instant::now();
        let expired: Vec<Reservation> = {
            let mut t = table.lock();
            let tokens: Vec<u64> = t
                .by_token
                .iter()
                .filter(|(_, h)| h.expires <= now)
                .map(|(k, _)| *k)
                .collect();
            tokens
                .into_iter()
                .filter_map(|k| t.take(k).map(|h| h.res))
                .collect()
        };
        if expired.is_empty() {
            return 0;
        }
        let n = self.home.pool.abort_reserved(&expired);
        self.home.metrics.reservations_expired.add(n as u64);
        tracing::debug!(
            released = n,
            "released reservations that were never committed"
        );
        n
    }

    /// Serves a prepare: reserves slots for `writer` (the node the connection belongs to),
    /// each under a random token only that writer can commit or abort.
    pub(crate) fn prepare(
        &self,
        writer: &NodeId,
        pages: &[(PageKey, u32, u32)],
        layout: peercache_wire::Layout,
    ) -> Vec<PrepareOutcome> {
        let Some(table) = self.table else {
            return pages
                .iter()
                .map(|_| PrepareOutcome::Refused("this node is not a storage server".into()))
                .collect();
        };
        self.reap_reservations();
        let want: Vec<(PageKey, u32, Option<u32>)> =
            pages.iter().map(|&(k, l, v)| (k, l, Some(v))).collect();
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        self.home
            .pool
            .reserve_batch(&want, layout, ReplClass::Retained, &mut out, &mut evicted);
        if let Some(b) = self.home.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        let expires = Instant::now() + Duration::from_secs_f64(self.reservation_timeout);
        let mut t = table.lock();
        let mut unheld = Vec::new();
        let outcomes = out
            .into_iter()
            .map(|r| match r {
                Reserved::Slot(res) => {
                    let held = Held {
                        res,
                        writer: writer.clone(),
                        expires,
                    };
                    match t.hold(held) {
                        Ok(token) => PrepareOutcome::Slot {
                            token,
                            addr: res.payload_addr,
                            region: self.home.stamp.id.pool_key,
                        },
                        Err(e) => {
                            unheld.push(res);
                            PrepareOutcome::Refused(format!("no reservation token: {e}"))
                        }
                    }
                }
                Reserved::Duplicate(loc) => PrepareOutcome::Present(self.home.stamp.resident(&loc)),
                Reserved::Failed(e) => PrepareOutcome::Refused(e.to_string()),
            })
            .collect();
        drop(t);
        self.home.pool.abort_reserved(&unheld);
        outcomes
    }

    /// Takes `writer`'s reservations among `tokens`; another writer's are left in place and
    /// counted as identity refusals.
    fn take_mine(&self, writer: &NodeId, tokens: &[u64]) -> Vec<Option<Reservation>> {
        let Some(table) = self.table else {
            return vec![None; tokens.len()];
        };
        let mut foreign = 0u64;
        let held = {
            let mut t = table.lock();
            tokens
                .iter()
                .map(|k| match t.take_for(*k, writer) {
                    Taken::Mine(h) => Some(h.res),
                    Taken::NotYours => {
                        foreign += 1;
                        None
                    }
                    Taken::Unknown => None,
                })
                .collect()
        };
        if foreign > 0 {
            self.home.metrics.identity_refused.add(foreign);
            tracing::warn!(
                writer = %writer,
                tokens = foreign,
                "refused committing or aborting another writer's reservations"
            );
        }
        held
    }

    /// Makes `writer`'s written reservations live, each only if its payload checksum is the
    /// writer's, and records them in the directory as this node's copies.
    pub(crate) fn commit_verified(
        &self,
        writer: &NodeId,
        pairs: &[(u64, u64)],
    ) -> Vec<Option<Location>> {
        let tokens: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let held = self.take_mine(writer, &tokens);
        let res: Vec<Reservation> = held.iter().flatten().copied().collect();
        let expected: Vec<u64> = held
            .iter()
            .zip(pairs)
            .filter(|(h, _)| h.is_some())
            .map(|(_, p)| p.1)
            .collect();
        let mut locs = Vec::new();
        self.home
            .pool
            .commit_reserved_verified(&res, &expected, &mut locs);
        let refused = locs.iter().filter(|l| l.is_none()).count() as u64;
        if refused > 0 {
            self.home.metrics.commit_rejects.add(refused);
            tracing::warn!(
                pages = refused,
                "refused committing pages whose bytes differ from the writer's checksum"
            );
        }
        let mut committed = locs.into_iter();
        let mut out: Vec<Option<Location>> = held
            .iter()
            .map(|h| {
                h.and_then(|_| committed.next().flatten())
                    .map(|l| self.home.stamp.resident(&l))
            })
            .collect();
        self.write_through(&res, &out);
        let keys: Vec<Option<PageKey>> = held.iter().map(|h| h.map(|r| r.key)).collect();
        self.record_stored(&keys, &mut out);
        out
    }

    /// Records pages this storage node now holds in the directory (a node publishes only its
    /// own copies); a page the directory did not take is reported as not stored.
    fn record_stored(&self, keys: &[Option<PageKey>], locs: &mut [Option<Location>]) {
        let idx: Vec<usize> = (0..locs.len())
            .filter(|&i| locs[i].is_some() && keys[i].is_some())
            .collect();
        if idx.is_empty() {
            return;
        }
        let entries: Vec<(PageKey, Location)> = idx
            .iter()
            .filter_map(|&i| Some((keys[i]?, locs[i].clone()?)))
            .collect();
        let taken = match self.home.dir.insert(&entries) {
            Ok(v) => v.iter().map(Option::is_some).collect(),
            Err(e) => {
                tracing::warn!(error = %e, pages = entries.len(), "stored pages could not be recorded in the directory");
                vec![false; entries.len()]
            }
        };
        for (&i, ok) in idx.iter().zip(taken) {
            if !ok {
                locs[i] = None;
            }
        }
    }

    /// Copies committed pages to the disk tier, under leases.
    fn write_through(&self, res: &[Reservation], locs: &[Option<Location>]) {
        let Some(disk) = self.home.disk else { return };
        let keys: Vec<PageKey> = res.iter().map(|r| r.key).collect();
        let leases = self.home.pool.lease_batch(&keys);
        let mut buf = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let Some(loc) = leases.location(i) else {
                continue;
            };
            if !locs
                .iter()
                .flatten()
                .any(|l| l.generation == loc.generation)
            {
                continue;
            }
            buf.resize(loc.len as usize, 0);
            if self
                .home
                .pool
                .read_leased(&leases, i, *k, &mut [&mut buf[..]])
                .is_ok()
            {
                disk.put(*k, &[&buf[..]], loc.valid_len, loc.generation, loc.layout);
            }
        }
    }

    /// Serves an abort: releases `writer`'s reservations it gave up on.
    pub(crate) fn abort(&self, writer: &NodeId, tokens: &[u64]) -> u32 {
        let res: Vec<Reservation> = self
            .take_mine(writer, tokens)
            .into_iter()
            .flatten()
            .collect();
        self.home.pool.abort_reserved(&res) as u32
    }

    /// Serves an ingest: publishes pages whose bytes came inside the request.
    pub(crate) fn ingest(
        &self,
        pages: &[(PageKey, u32, Vec<u8>)],
        layout: peercache_wire::Layout,
    ) -> Vec<Option<Location>> {
        if self.table.is_none() {
            return vec![None; pages.len()];
        }
        let segs: Vec<[&[u8]; 1]> = pages.iter().map(|p| [p.2.as_slice()]).collect();
        let writes: Vec<PageWrite<'_>> = pages
            .iter()
            .zip(&segs)
            .map(|((k, valid, bytes), s)| PageWrite {
                key: *k,
                segments: s,
                valid_len: (*valid as usize != bytes.len()).then_some(*valid),
                layout,
            })
            .collect();
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        self.home.pool.publish_batch(
            &writes,
            ReplClass::Retained,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        if let Some(b) = self.home.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        let mut locs: Vec<Option<Location>> = out
            .iter()
            .zip(&writes)
            .map(|(p, w)| match p {
                Published::New(loc) => {
                    if let Some(d) = self.home.disk {
                        d.put(w.key, w.segments, loc.valid_len, loc.generation, w.layout);
                    }
                    Some(self.home.stamp.resident(loc))
                }
                Published::Duplicate(loc) => Some(self.home.stamp.resident(loc)),
                Published::Failed(_) => None,
            })
            .collect();
        let keys: Vec<Option<PageKey>> = pages.iter().map(|p| Some(p.0)).collect();
        self.record_stored(&keys, &mut locs);
        locs
    }
}

// ----- writer side -----

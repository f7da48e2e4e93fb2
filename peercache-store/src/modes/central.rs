//! Centralized and hybrid modes: inference nodes write into storage servers' pools.
//!
//! A write to storage is three steps per storage owner (the ring of storage nodes places each
//! key; all owners are asked at once):
//!
//! 1. **prepare** — the owner reserves pool slots for the pages and returns their payload
//!    addresses; only these ranges accept remote writes, only from the node that reserved them
//!    ([`ReservationGuard`] on the owner's pool registration), only until the reservation
//!    expires (`reservation_timeout`; expired ones are released, so nothing leaks);
//! 2. **write** — one-sided WRITE of the payloads straight from the caller's registered buffer
//!    (or a registered staging copy) into those slots;
//! 3. **commit** — the owner checksums the payloads in place, writes the slot headers and makes
//!    the pages live; the writer records the returned locations in the directory.
//!
//! A page whose write failed is aborted and sent again inside an **ingest** request that
//! carries its bytes. Reads need nothing new: the directory names the storage node, and readers
//! read its pool one-sided like any peer's.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peercache_directory::Location;
use peercache_pool::{PageWrite, PublishScratch, Published, ReplClass, Reservation, Reserved};
use peercache_transport::{Batch, RemoteRange, Segment};
use peercache_wire::{NodeId, PageKey, envelope, rpc};
use smallvec::SmallVec;

use crate::control::{PrepareOutcome, StoreReply, StoreRequest};
use crate::node::core::Core;

use crate::modes::state::StorageMode;
use crate::modes::storage_view::{Held, Taken};

// ----- storage side -----

impl Core {
    /// Releases reservations whose writer did not commit in time.
    pub(crate) fn reap_reservations(&self) -> usize {
        let Some(table) = self.mode.storage().and_then(|s| s.reservations.as_ref()) else {
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
        let n = self.pool.abort_reserved(&expired);
        self.metrics.reservations_expired.add(n as u64);
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
        let Some(table) = self.mode.storage().and_then(|s| s.reservations.as_ref()) else {
            return pages
                .iter()
                .map(|_| PrepareOutcome::Refused("this node is not a storage server".into()))
                .collect();
        };
        self.reap_reservations();
        let want: Vec<(PageKey, u32, Option<u32>)> =
            pages.iter().map(|&(k, l, v)| (k, l, Some(v))).collect();
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        self.pool
            .reserve_batch(&want, layout, ReplClass::Retained, &mut out, &mut evicted);
        if let Some(b) = self.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        let expires = Instant::now() + Duration::from_secs_f64(self.cfg.reservation_timeout);
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
                            region: self.pool_key,
                        },
                        Err(e) => {
                            unheld.push(res);
                            PrepareOutcome::Refused(format!("no reservation token: {e}"))
                        }
                    }
                }
                Reserved::Duplicate(loc) => PrepareOutcome::Present(self.resident_location(&loc)),
                Reserved::Failed(e) => PrepareOutcome::Refused(e.to_string()),
            })
            .collect();
        drop(t);
        self.pool.abort_reserved(&unheld);
        outcomes
    }

    /// Takes `writer`'s reservations among `tokens`; another writer's are left in place and
    /// counted as identity refusals.
    fn take_mine(&self, writer: &NodeId, tokens: &[u64]) -> Vec<Option<Reservation>> {
        let Some(table) = self.mode.storage().and_then(|s| s.reservations.as_ref()) else {
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
            self.metrics.identity_refused.add(foreign);
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
        self.pool
            .commit_reserved_verified(&res, &expected, &mut locs);
        let refused = locs.iter().filter(|l| l.is_none()).count() as u64;
        if refused > 0 {
            self.metrics.commit_rejects.add(refused);
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
                    .map(|l| self.resident_location(&l))
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
        let taken = match self.dir.insert(&entries) {
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
        let Some(disk) = &self.disk else { return };
        let keys: Vec<PageKey> = res.iter().map(|r| r.key).collect();
        let leases = self.pool.lease_batch(&keys);
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
        self.pool.abort_reserved(&res) as u32
    }

    /// Serves an ingest: publishes pages whose bytes came inside the request.
    pub(crate) fn ingest(
        &self,
        pages: &[(PageKey, u32, Vec<u8>)],
        layout: peercache_wire::Layout,
    ) -> Vec<Option<Location>> {
        if self.mode.storage().is_none_or(|s| s.reservations.is_none()) {
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
        self.pool.publish_batch(
            &writes,
            ReplClass::Retained,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        if let Some(b) = self.tasks.evictions.lock().as_ref() {
            b.push(evicted);
        }
        let mut locs: Vec<Option<Location>> = out
            .iter()
            .zip(&writes)
            .map(|(p, w)| match p {
                Published::New(loc) => {
                    if let Some(d) = &self.disk {
                        d.put(w.key, w.segments, loc.valid_len, loc.generation, w.layout);
                    }
                    Some(self.resident_location(loc))
                }
                Published::Duplicate(loc) => Some(self.resident_location(loc)),
                Published::Failed(_) => None,
            })
            .collect();
        let keys: Vec<Option<PageKey>> = pages.iter().map(|p| Some(p.0)).collect();
        self.record_stored(&keys, &mut locs);
        locs
    }
}

// ----- writer side -----

/// One storage owner's share of a write.
struct OwnerWrite {
    control: std::net::SocketAddr,
    pages: Vec<usize>,
}

impl Core {
    /// Writes pages into storage servers. `None` when no storage server is registered.
    pub(crate) fn write_to_storage(
        &self,
        st: &StorageMode,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Option<Vec<bool>> {
        let inner = self;
        let view = st.view.read().clone();
        let Some(ring) = &view.ring else {
            if !st.no_storage_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    mode = ?inner.cfg.mode,
                    "no storage server is registered: writes to storage fail (centralized) or \
                     go to the local pool (hybrid) until one joins"
                );
            }
            return None;
        };
        st.no_storage_logged.store(false, Ordering::Relaxed);
        let layout_ext = inner.layout_extension();
        let mut starts = Vec::with_capacity(keys.len());
        let mut lens = Vec::with_capacity(keys.len());
        let mut at = 0;
        for &c in counts {
            starts.push(at);
            lens.push(slices[at..at + c].iter().map(|s| s.len()).sum::<usize>());
            at += c;
        }
        let valid = |i: usize| valid_lens.map_or(lens[i] as u32, |v| v[i]);
        // Group by storage owner.
        let mut owners: Vec<(NodeId, OwnerWrite)> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let Some(node) = ring.primary(*k) else {
                continue;
            };
            let Some(&control) = view.control.get(node) else {
                continue;
            };
            match owners.iter_mut().find(|(n, _)| n == node) {
                Some((_, w)) => w.pages.push(i),
                None => owners.push((
                    node.clone(),
                    OwnerWrite {
                        control,
                        pages: vec![i],
                    },
                )),
            }
        }
        let mut done = vec![false; keys.len()];
        // 1. Prepare on every owner at once.
        let reqs: Vec<Vec<u8>> = owners
            .iter()
            .map(|(_, w)| {
                let pages = w
                    .pages
                    .iter()
                    .map(|&i| (keys[i], lens[i] as u32, valid(i)))
                    .collect();
                envelope::encode(
                    &StoreRequest::Prepare {
                        writer: inner.me.clone(),
                        pages,
                    },
                    &layout_ext,
                )
                .unwrap_or_default()
            })
            .collect();
        let calls: Vec<(std::net::SocketAddr, &[u8])> = owners
            .iter()
            .zip(&reqs)
            .map(|((_, w), r)| (w.control, r.as_slice()))
            .collect();
        let replies = inner.dir.rpc().call_many(&calls, inner.cfg.op_timeout());
        for ((node, w), reply) in owners.iter().zip(replies) {
            let outcomes = match reply.and_then(|f| rpc::decode_reply::<StoreReply>(&f)) {
                Ok(StoreReply::Prepared(o)) if o.len() == w.pages.len() => o,
                other => {
                    tracing::debug!(owner = %node, reply = ?other.err(), "prepare failed");
                    continue;
                }
            };
            self.write_owner(
                w, &outcomes, keys, slices, &starts, counts, &lens, &mut done,
            );
        }
        // 3. Each storage server recorded its pages in the directory before answering (a node
        // publishes only its own copies), so a page reported stored is findable.
        let stored = done.iter().filter(|d| **d).count() as u64;
        inner.metrics.storage_writes.add(stored);
        Some(done)
    }

    /// Writes one owner's reserved slots, commits them, and ingests what could not be written.
    #[allow(clippy::too_many_arguments)]
    fn write_owner(
        &self,
        w: &OwnerWrite,
        outcomes: &[PrepareOutcome],
        keys: &[PageKey],
        slices: &[&[u8]],
        starts: &[usize],
        counts: &[usize],
        lens: &[usize],
        done: &mut [bool],
    ) {
        let inner = self;
        let timeout = inner.cfg.op_timeout();
        let layout_ext = inner.layout_extension();
        let mut slots: Vec<(usize, u64, u64, u64)> = Vec::new(); // (page, token, addr, region)
        for (&i, o) in w.pages.iter().zip(outcomes) {
            match o {
                PrepareOutcome::Slot {
                    token,
                    addr,
                    region,
                } => slots.push((i, *token, *addr, *region)),
                PrepareOutcome::Present(_) => done[i] = true,
                PrepareOutcome::Refused(why) => {
                    tracing::debug!(key = %keys[i], why, "storage refused a page")
                }
            }
        }
        if slots.is_empty() {
            return;
        }
        // 2. One-sided WRITE of every reserved page: straight from registered host memory, or
        // from a registered staging copy.
        let bufs = inner.reads.host_buffers.read();
        // With `lazy_registration`, unregistered pages are sent straight from the caller's
        // memory (named unregistered); otherwise from a registered staging copy.
        let lazy = inner.cfg.lazy_registration;
        let direct = |i: usize| lazy || self.page_registered(&bufs, slices, starts[i], counts[i]);
        let staging: usize = slots
            .iter()
            .filter(|(i, ..)| !direct(*i))
            .map(|(i, ..)| lens[*i])
            .sum();
        let Ok(mut scratch) = self.checkout_scratch(0, staging) else {
            return;
        };
        let mut batch = Batch::new();
        let mut soff = 0usize;
        for &(i, _, addr, region) in &slots {
            let page = &slices[starts[i]..starts[i] + counts[i]];
            let mut local: SmallVec<[Segment; 4]> = SmallVec::new();
            if direct(i) {
                for s in page {
                    let key = self
                        .host_region(&bufs, s.as_ptr() as u64, s.len() as u64)
                        .unwrap_or(peercache_transport::RegionKey::UNREGISTERED);
                    local.push(Segment {
                        region: key,
                        addr: s.as_ptr() as u64,
                        len: s.len() as u32,
                    });
                }
            } else {
                let dst = scratch.staging_mut(soff, lens[i]);
                let mut at = 0;
                for s in page {
                    dst[at..at + s.len()].copy_from_slice(s);
                    at += s.len();
                }
                local.push(Segment {
                    region: scratch.key(),
                    addr: scratch.staging_addr(soff),
                    len: lens[i] as u32,
                });
                soff += lens[i];
            }
            batch.push(
                RemoteRange {
                    region: peercache_transport::RegionKey(region),
                    addr,
                    len: lens[i] as u32,
                },
                &local,
            );
        }
        if lazy {
            // SAFETY: the pages are the caller's slices, borrowed (and only read) for the whole
            // call, which the write batch runs within.
            unsafe { batch.allow_unregistered() };
        }
        let data_ep = inner
            .discovery
            .members()
            .into_iter()
            .find(|m| m.control == w.control)
            .and_then(|m| m.data.first().copied());
        let written: Vec<bool> = match data_ep.map(|ep| inner.transport.write_batch(ep, &batch)) {
            Some(Ok(r)) => r.iter().map(|x| x.is_ok()).collect(),
            Some(Err(e)) => {
                tracing::debug!(error = %e, "write to storage failed; falling back to ingest");
                vec![false; slots.len()]
            }
            None => vec![false; slots.len()],
        };
        drop(bufs);
        inner.reads.scratch.lock().push(scratch);
        // Each committed page carries the writer's checksum, so the server publishes exactly
        // the bytes written (a torn or stray one-sided write is refused, not published).
        let commit: Vec<(u64, u64)> = slots
            .iter()
            .zip(&written)
            .filter(|(_, ok)| **ok)
            .map(|(s, _)| {
                let page = &slices[starts[s.0]..starts[s.0] + counts[s.0]];
                (s.1, peercache_pool::header::checksum_segments(page))
            })
            .collect();
        let abort: Vec<u64> = slots
            .iter()
            .zip(&written)
            .filter(|(_, ok)| !**ok)
            .map(|(s, _)| s.1)
            .collect();
        // Commit what landed; abort the rest and send those pages with their bytes.
        let mut calls: Vec<Vec<u8>> = Vec::new();
        if !commit.is_empty() {
            calls.push(
                envelope::encode(&StoreRequest::CommitVerified(commit), &[]).unwrap_or_default(),
            );
        }
        let fallback: Vec<usize> = slots
            .iter()
            .zip(&written)
            .filter(|(_, ok)| !**ok)
            .map(|(s, _)| s.0)
            .collect();
        if !abort.is_empty() {
            calls.push(envelope::encode(&StoreRequest::Abort(abort), &[]).unwrap_or_default());
            let pages = fallback
                .iter()
                .map(|&i| {
                    let mut bytes = Vec::with_capacity(lens[i]);
                    for s in &slices[starts[i]..starts[i] + counts[i]] {
                        bytes.extend_from_slice(s);
                    }
                    (keys[i], lens[i] as u32, bytes)
                })
                .collect();
            calls.push(
                envelope::encode(&StoreRequest::Ingest(pages), &layout_ext).unwrap_or_default(),
            );
            inner.metrics.storage_ingests.add(fallback.len() as u64);
        }
        let rc: Vec<(std::net::SocketAddr, &[u8])> =
            calls.iter().map(|f| (w.control, f.as_slice())).collect();
        let replies = inner.dir.rpc().call_many(&rc, timeout);
        for reply in replies {
            match reply.and_then(|f| rpc::decode_reply::<StoreReply>(&f)) {
                Ok(StoreReply::Committed(locs)) => {
                    let committed = slots.iter().zip(&written).filter(|(_, ok)| **ok);
                    for ((s, _), l) in committed.zip(locs) {
                        if l.is_some() {
                            done[s.0] = true;
                        }
                    }
                }
                Ok(StoreReply::Ingested(locs)) => {
                    for (&i, l) in fallback.iter().zip(locs) {
                        if l.is_some() {
                            done[i] = true;
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "commit or ingest failed"),
            }
        }
    }

    fn page_registered(
        &self,
        bufs: &[peercache_transport::RegionHandle],
        slices: &[&[u8]],
        start: usize,
        count: usize,
    ) -> bool {
        slices[start..start + count].iter().all(|s| {
            self.host_region(bufs, s.as_ptr() as u64, s.len() as u64)
                .is_some()
        })
    }
}

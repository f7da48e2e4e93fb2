//! The inference node's side of a centralized write: prepare at every storage owner at once,
//! write the payloads one-sided, commit, and ingest what failed.

use std::sync::atomic::Ordering;

use peercache_discovery::Membership;
use peercache_transport::{Batch, RemoteRange, Segment};
use peercache_wire::{NodeId, PageKey, envelope, rpc};
use smallvec::SmallVec;

use crate::config::Mode;
use crate::control::{PrepareOutcome, StoreReply, StoreRequest};
use crate::modes::state::StorageMode;
use crate::node::parts::ReadState;
use crate::node::reach::Reach;
use crate::read::scratch::host_region;

/// The writer's side, with what it needs of its node (`Core::storage_writer`).
pub(crate) struct StorageWriter<'a> {
    /// This node's id, directory client, transport, counters, layout and op deadline.
    pub(crate) reach: Reach<'a>,
    pub(crate) st: &'a StorageMode,
    /// The members (each storage server's data endpoint).
    pub(crate) discovery: &'a Membership,
    /// The registered host buffers (zero-copy sources) and the scratch memory (staging).
    pub(crate) reads: &'a ReadState,
    pub(crate) mode: Mode,
    pub(crate) lazy_registration: bool,
}

/// One storage owner's share of a write.
struct OwnerWrite {
    control: std::net::SocketAddr,
    pages: Vec<usize>,
}

impl StorageWriter<'_> {
    /// Writes pages into storage servers. `None` when no storage server is registered.
    pub(crate) fn write(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Option<Vec<bool>> {
        let st = self.st;
        let view = st.view.read().clone();
        let Some(ring) = &view.ring else {
            if !st.no_storage_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    mode = ?self.mode,
                    "no storage server is registered: writes to storage fail (centralized) or \
                     go to the local pool (hybrid) until one joins"
                );
            }
            return None;
        };
        st.no_storage_logged.store(false, Ordering::Relaxed);
        let layout_ext = crate::control::layout_extension(self.reach.layout);
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
                        writer: self.reach.me.clone(),
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
        let replies = self
            .reach
            .dir
            .rpc()
            .call_many(&calls, self.reach.op_timeout);
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
        self.reach.metrics.storage_writes.add(stored);
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
        let timeout = self.reach.op_timeout;
        let layout_ext = crate::control::layout_extension(self.reach.layout);
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
        let bufs = self.reads.host_buffers.read();
        // With `lazy_registration`, unregistered pages are sent straight from the caller's
        // memory (named unregistered); otherwise from a registered staging copy.
        let lazy = self.lazy_registration;
        let direct = |i: usize| lazy || self.page_registered(&bufs, slices, starts[i], counts[i]);
        let staging: usize = slots
            .iter()
            .filter(|(i, ..)| !direct(*i))
            .map(|(i, ..)| lens[*i])
            .sum();
        let Ok(mut scratch) = self
            .reads
            .scratch
            .checkout(self.reach.transport, 0, staging)
        else {
            return;
        };
        let mut batch = Batch::new();
        let mut soff = 0usize;
        for &(i, _, addr, region) in &slots {
            let page = &slices[starts[i]..starts[i] + counts[i]];
            let mut local: SmallVec<[Segment; 4]> = SmallVec::new();
            if direct(i) {
                for s in page {
                    let key = host_region(&bufs, s.as_ptr() as u64, s.len() as u64)
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
        let data_ep = self
            .discovery
            .members()
            .into_iter()
            .find(|m| m.control == w.control)
            .and_then(|m| m.data.first().copied());
        let written: Vec<bool> =
            match data_ep.map(|ep| self.reach.transport.write_batch(ep, &batch)) {
                Some(Ok(r)) => r.iter().map(|x| x.is_ok()).collect(),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "write to storage failed; falling back to ingest");
                    vec![false; slots.len()]
                }
                None => vec![false; slots.len()],
            };
        drop(bufs);
        self.reads.scratch.give_back(scratch);
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
            self.reach
                .metrics
                .storage_ingests
                .add(fallback.len() as u64);
        }
        let rc: Vec<(std::net::SocketAddr, &[u8])> =
            calls.iter().map(|f| (w.control, f.as_slice())).collect();
        let replies = self.reach.dir.rpc().call_many(&rc, timeout);
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
        slices[start..start + count]
            .iter()
            .all(|s| host_region(bufs, s.as_ptr() as u64, s.len() as u64).is_some())
    }
}

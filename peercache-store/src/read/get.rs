//! The read path on the [`ReadWing`]: the I/O shell around the sans-IO [`crate::read::plan::ReadPlan`]
//! — owners from a primed exists, the read cache or the directory; local pages under leases;
//! disk promotions; remote pages one transport batch per owner, verified; replication.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use peercache_directory::{Location, Owners};
use peercache_pool::{HEADER_LEN, PageWrite, PublishScratch, Published, ReplClass};
use peercache_transport::{Batch, RemoteRange, Segment};
use peercache_wire::{NodeId, PageKey};
use smallvec::SmallVec;

use crate::StoreError;
use crate::observe::read_timing::Stage;
use crate::read::dest::PageDest;
use crate::read::local_copy::{LeasedPage, serve_leased};
use crate::read::plan::ReadPlan;
use crate::read::scratch::host_region;
use crate::read::wing::ReadWing;

impl ReadWing<'_> {
    /// The read entry point every host API shares: refuses after shutdown and device memory,
    /// reads, records the latency. Per page: its valid length if served.
    pub(crate) fn get_pages(
        &self,
        keys: &[PageKey],
        dest: &mut PageDest<'_>,
    ) -> Result<Vec<Option<u32>>, StoreError> {
        self.get_pages_hinted(keys, dest, None)
    }

    /// [`ReadWing::get_pages`] with a router's hint: the node that holds the pages, asked first
    /// instead of the directory.
    pub(crate) fn get_pages_hinted(
        &self,
        keys: &[PageKey],
        dest: &mut PageDest<'_>,
        hint: Option<&NodeId>,
    ) -> Result<Vec<Option<u32>>, StoreError> {
        self.check_open()?;
        self.touches_device(dest.all_segs())?;
        let t0 = std::time::Instant::now();
        let whole = Stage::start();
        let r = self.get_impl(keys, dest, hint);
        self.home
            .metrics
            .read_latency
            .record(t0.elapsed().as_secs_f64());
        whole.end(|s| &mut s.total);
        Ok(r)
    }

    /// Where the directory says `keys` live.
    pub(crate) fn locate(&self, keys: &[PageKey]) -> Result<Vec<Option<Owners>>, StoreError> {
        self.home.dir.lookup(keys).map_err(StoreError::from)
    }

    /// Where a request's prefix is: each node's leading run of `keys` (page keys in request
    /// order), from the holders the directory shards name in one fan-out.
    pub(crate) fn prefix_locations(
        &self,
        keys: &[PageKey],
    ) -> Result<Vec<crate::PrefixRun>, StoreError> {
        self.check_open()?;
        let holders = self.home.dir.key_holders(keys)?;
        Ok(crate::prefix_runs_in(&holders))
    }

    /// One host read: the slot map's, or owners, local pages, promotions, remote rounds and
    /// replication.
    fn get_impl(
        &self,
        keys: &[PageKey],
        dest: &mut PageDest<'_>,
        hint: Option<&NodeId>,
    ) -> Vec<Option<u32>> {
        let m = &self.home.metrics;
        let n = keys.len();
        m.read_requests.add(n as u64);
        if let Some(slots) = &self.slots {
            let hit = slots.get(keys, dest);
            let hits = hit.iter().filter(|h| h.is_some()).count() as u64;
            m.read_hits.add(hits);
            m.read_misses.add(n as u64 - hits);
            return hit;
        }
        let lens = dest.lens().to_vec();
        let me = self.me.clone();
        let mut plan = ReadPlan::new(&me, keys, &lens);
        // This node's own pool first when a lookup would cost a round trip (`read/own.rs`).
        let own_first = self.own_pool_first();
        let mut bytes = 0;
        if own_first {
            let stage = Stage::start();
            let all: Vec<usize> = (0..n).collect();
            bytes += self.read_own(keys, &all, dest, &mut plan);
            stage.end(|s| &mut s.local);
        }
        let stage = Stage::start();
        self.find_owners(keys, &mut plan, hint);
        stage.end(|s| &mut s.locate);
        bytes += self.read_local(keys, dest, &mut plan);

        // Pages no owner holds in memory but another node holds on disk: ask it to promote.
        let want = plan.disk_promotions();
        if !want.is_empty() {
            self.promote_remote(&want, keys, &lens, plan.owners_mut());
        }

        let (remote, remote_bytes) = self.remote_rounds(&mut plan, |ep, pages| {
            self.read_remote(ep, pages, keys, dest)
        });
        bytes += remote_bytes;
        if !own_first {
            // The directory went first: a page nobody served may still be in this node's
            // pool, unnamed by the directory.
            let rest = plan.unserved();
            let stage = Stage::start();
            bytes += self.read_own(keys, &rest, dest, &mut plan);
            stage.end(|s| &mut s.local);
        }
        if self.cfg.replicate_on_read && !remote.is_empty() {
            let valid: Vec<u32> = (0..n).map(|i| plan.valid_len(i)).collect();
            self.replicate(&remote, keys, dest, &valid);
        }
        self.close_read(keys, plan, bytes)
    }

    /// The pages the directory names this node for that its own pool did not serve first
    /// ([`ReadWing::read_own`]): leases what is in the pool now, promotes from the disk tier
    /// what is not (the leases keep the first ones from being evicted by that promotion),
    /// copies under leases. Returns the bytes served.
    fn read_local(
        &self,
        keys: &[PageKey],
        dest: &mut PageDest<'_>,
        plan: &mut ReadPlan<'_>,
    ) -> u64 {
        let local = plan.local();
        if local.is_empty() {
            return 0;
        }
        let m = &self.home.metrics;
        let stage = Stage::start();
        let lk: Vec<PageKey> = local.iter().map(|&i| keys[i]).collect();
        let leases = self.home.pool.lease_batch(&lk);
        let mut promoted_at: Vec<Option<usize>> = vec![None; local.len()];
        let mut missing = Vec::new();
        if let Some(disk) = &self.home.disk {
            for (j, k) in lk.iter().enumerate() {
                if leases.location(j).is_none() && disk.holds_or_pending(*k) {
                    promoted_at[j] = Some(missing.len());
                    missing.push(*k);
                }
            }
        }
        let promoted = if missing.is_empty() {
            None
        } else {
            let (got, leased) = self.promotion().promote_and_lease(&missing);
            m.read_disk_hits
                .add(got.iter().filter(|l| l.is_some()).count() as u64);
            leased
        };
        let layout = self.layout;
        let mut jobs = Vec::with_capacity(local.len());
        for (j, &i) in local.iter().enumerate() {
            let (ls, at) = match (promoted_at[j], &promoted) {
                (Some(p), Some(ls)) => (ls, p),
                _ => (&leases, j),
            };
            let Some(at_loc) = ls.location(at) else {
                continue;
            };
            // This node's own copy (or its disk tier's) of another layout: kept pages of an
            // earlier layout are misses, not bytes of the wrong shape.
            if at_loc.layout != layout {
                m.layout_mismatches.add(1);
                continue;
            }
            jobs.push(LeasedPage {
                i,
                leases: ls,
                at,
                valid_len: at_loc.valid_len,
            });
        }
        let (bytes, local_hits) = serve_leased(self.home.pool, keys, &jobs, dest, plan);
        m.read_local_hits.add(local_hits);
        stage.end(|s| &mut s.local);
        bytes
    }

    /// The remote rounds every read shares, host and device: one `fetch` (one transport batch)
    /// per owner and round, owners chosen by the reads in flight from this node; a page whose
    /// read failed goes to its next owner in the next round. Returns the pages served and
    /// their bytes.
    pub(crate) fn remote_rounds(
        &self,
        plan: &mut ReadPlan<'_>,
        mut fetch: impl FnMut(SocketAddr, &[(usize, Location)]) -> Vec<(usize, Option<u32>)>,
    ) -> (Vec<usize>, u64) {
        let m = &self.home.metrics;
        let (mut served, mut bytes) = (Vec::new(), 0u64);
        loop {
            // The round's owners, and its pages counted in flight, under one lock.
            let fetches = {
                let mut load = self.reads.inflight.lock();
                let fetches = plan.next_fetches(&load);
                for (ep, pages) in &fetches {
                    *load.entry(*ep).or_insert(0) += pages.len();
                }
                fetches
            };
            if fetches.is_empty() {
                break;
            }
            for (ep, pages) in fetches {
                let got = fetch(ep, &pages);
                if let Some(c) = self.reads.inflight.lock().get_mut(&ep) {
                    *c = c.saturating_sub(pages.len());
                }
                for (i, valid) in got {
                    match valid {
                        Some(valid) => {
                            plan.served_remote(i, valid);
                            bytes += plan.page_len(i);
                            served.push(i);
                        }
                        None => m.read_failures.add(1),
                    }
                }
            }
        }
        m.read_remote_hits.add(served.len() as u64);
        (served, bytes)
    }

    /// The tail every read shares: drops cached locations that did not serve, counts hits,
    /// misses and bytes, and hands back each page's valid length.
    pub(crate) fn close_read(
        &self,
        keys: &[PageKey],
        plan: ReadPlan<'_>,
        bytes: u64,
    ) -> Vec<Option<u32>> {
        if self.cfg.directory_read_cache_ttl > 0.0 {
            // A cached location that did not serve (slot reused, owner gone) is dropped.
            let mut cache = self.reads.read_cache.lock();
            for i in plan.missed_with_owners() {
                cache.remove(keys[i]);
            }
        }
        let m = &self.home.metrics;
        let hits = plan.hits();
        m.read_hits.add(hits);
        m.read_misses.add(keys.len() as u64 - hits);
        m.bytes_read.add(bytes);
        plan.finish()
    }

    /// Fills `plan` with the owners of the pages of `keys` not yet served: handed over by a
    /// preceding `exists` (primed), else from the read cache (`directory_read_cache_ttl`), else
    /// from the node `hint` names (when given), else one directory fan-out. Pages served
    /// already (by this node's own pool) count as lookups saved.
    pub(crate) fn find_owners(
        &self,
        keys: &[PageKey],
        plan: &mut ReadPlan<'_>,
        hint: Option<&NodeId>,
    ) {
        let mut need = Vec::new();
        {
            let now = Instant::now();
            let mut primed = self.reads.primed.lock();
            for (i, k) in keys.iter().enumerate() {
                // Taken even for a page already served, so its primed entry does not linger.
                let o = primed.take(*k, now);
                if plan.is_served(i) {
                    continue;
                }
                match o {
                    Some(o) => plan.set_owners(i, Some(o)),
                    None => need.push(i),
                }
            }
        }
        let cache_ttl = Duration::from_secs_f64(self.cfg.directory_read_cache_ttl);
        if !cache_ttl.is_zero() && !need.is_empty() {
            let now = Instant::now();
            let cache = self.reads.read_cache.lock();
            need.retain(|&i| match cache.get(keys[i], now) {
                Some(o) => {
                    plan.set_owners(i, Some(o));
                    false
                }
                None => true,
            });
        }
        self.home
            .metrics
            .lookups_saved
            .add((keys.len() - need.len()) as u64);
        if let Some(hint) = hint
            && !need.is_empty()
        {
            need = self.owners_from_hint(hint, keys, need, plan);
        }
        if need.is_empty() {
            return;
        }
        let ks: Vec<PageKey> = need.iter().map(|&i| keys[i]).collect();
        let found = self.home.dir.lookup(&ks);
        if let Err(e) = &found {
            // Every page of the batch misses: counted once per batch, logged once per 10 s.
            self.home.metrics.lookup_failures.add(1);
            if let Some(held) = self.reads.lookup_failed.admit() {
                tracing::warn!(error = %e, pages = ks.len(), failed_since_last = held, "directory lookup failed; the batch misses");
            }
        }
        if let Ok(mut found) = found {
            // Each page present only in another layout is counted once, here: it is never
            // fetched.
            let refused = self.keep_my_layout(&mut found);
            self.home.metrics.layout_mismatches.add(refused as u64);
            if !cache_ttl.is_zero() {
                let now = Instant::now();
                let mut cache = self.reads.read_cache.lock();
                for (k, o) in ks.iter().zip(&found) {
                    if let Some(o) = o {
                        cache.put(*k, o.clone(), cache_ttl, now);
                    }
                }
            }
            for (&i, o) in need.iter().zip(found) {
                plan.set_owners(i, o);
            }
        }
    }

    /// `replicate_on_read`: keeps copies of pages just fetched from peers in the local pool as
    /// *reclaimable* (first to go under pressure) and registers this node as another owner
    /// (off the read path, through the background batcher).
    fn replicate(&self, idx: &[usize], keys: &[PageKey], dest: &PageDest<'_>, valid: &[u32]) {
        let slices = dest.views(idx);
        let mut pages = Vec::with_capacity(idx.len());
        let mut at = 0;
        // The copies were verified against this node's layout on the way in.
        let layout = self.layout;
        for &i in idx {
            let count = dest.segs(i).len();
            pages.push(PageWrite {
                key: keys[i],
                segments: &slices[at..at + count],
                valid_len: (u64::from(valid[i]) != dest.lens()[i]).then_some(valid[i]),
                layout,
            });
            at += count;
        }
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        self.home.pool.publish_batch(
            &pages,
            ReplClass::Reclaimable,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        let entries: Vec<(PageKey, Location)> = out
            .iter()
            .zip(&pages)
            .filter_map(|(p, w)| match p {
                Published::New(loc) => Some((w.key, self.home.stamp.resident(loc))),
                _ => None,
            })
            .collect();
        self.home.metrics.replicas.add(entries.len() as u64);
        let batcher = self.home.tasks.evictions.lock();
        if let Some(b) = batcher.as_ref() {
            b.push(evicted);
            b.publish(entries);
        }
    }

    /// Pages whose only copies live on other owners' disk tiers: asks each owner (one RPC per
    /// owner, all at once) to promote them, and points `owners` at the copies it reports.
    pub(crate) fn promote_remote(
        &self,
        want: &[(NodeId, Vec<usize>)],
        keys: &[PageKey],
        lens: &[u64],
        owners: &mut [Option<Owners>],
    ) {
        let groups: Vec<(NodeId, Vec<PageKey>)> = want
            .iter()
            .map(|(node, idx)| (node.clone(), idx.iter().map(|&i| keys[i]).collect()))
            .collect();
        let answers = self.promotion().ask_promote(&groups);
        for ((_, idx), locs) in want.iter().zip(answers) {
            for (&i, l) in idx.iter().zip(locs) {
                if let Some(l) = l.filter(|l| l.resident && l.len as u64 == lens[i]) {
                    owners[i] = Some(smallvec::smallvec![l]);
                }
            }
        }
    }

    /// Reads `pages` from one owner: header + payload per page, straight into the caller's
    /// registered memory when it is registered, else through staging; verifies every page.
    fn read_remote(
        &self,
        ep: SocketAddr,
        pages: &[(usize, Location)],
        keys: &[PageKey],
        dest: &mut PageDest<'_>,
    ) -> Vec<(usize, Option<u32>)> {
        let stage = Stage::start();
        let bufs = self.reads.host_buffers.read();
        // Which pages land directly, which go through staging.
        // With `lazy_registration` every page lands directly: segments outside registered host
        // buffers are named unregistered (TCP receives into them; RDMA registers them for the
        // batch). Without it they go through registered staging and a copy.
        let lazy = self.cfg.lazy_registration;
        let mut staging_need = 0usize;
        let mut direct = Vec::with_capacity(pages.len());
        for (i, loc) in pages {
            let ok = lazy
                || dest
                    .segs(*i)
                    .iter()
                    .all(|s| host_region(&bufs, s.ptr as u64, s.len as u64).is_some());
            if !ok {
                staging_need += loc.len as usize;
            }
            direct.push(ok);
        }
        let staged = direct.iter().filter(|d| !**d).count() as u64;
        if staged > 0 {
            self.home.metrics.staged_reads.add(staged);
        }
        let scratch = match self
            .reads
            .scratch
            .checkout(self.transport, pages.len(), staging_need)
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no scratch memory for a read batch");
                return pages.iter().map(|(i, _)| (*i, None)).collect();
            }
        };
        let mut batch = Batch::with_capacity(pages.len(), pages.len() * 3);
        let mut staging_off = Vec::with_capacity(pages.len());
        let mut soff = 0usize;
        let mut local: SmallVec<[Segment; 4]> = SmallVec::new();
        for (j, (i, loc)) in pages.iter().enumerate() {
            local.clear();
            local.push(Segment {
                region: scratch.handle.key(),
                addr: scratch.header_addr(j),
                len: HEADER_LEN as u32,
            });
            if direct[j] {
                for s in dest.segs(*i) {
                    let region = host_region(&bufs, s.ptr as u64, s.len as u64)
                        .unwrap_or(peercache_transport::RegionKey::UNREGISTERED);
                    local.push(Segment {
                        region,
                        addr: s.ptr as u64,
                        len: s.len as u32,
                    });
                }
                staging_off.push(usize::MAX);
            } else {
                local.push(Segment {
                    region: scratch.handle.key(),
                    addr: scratch.staging_addr(soff),
                    len: loc.len,
                });
                staging_off.push(soff);
                soff += loc.len as usize;
            }
            batch.push(
                RemoteRange {
                    region: peercache_transport::RegionKey(loc.rails[0].region),
                    addr: loc.addr,
                    len: HEADER_LEN as u32 + loc.len,
                },
                &local,
            );
        }
        if lazy {
            // SAFETY: the unregistered segments are `dest`'s, valid for writes of their length
            // and overlapping no other for `dest`'s life (`PageDest`'s invariant), which spans
            // the batch; `dest` is borrowed exclusively here, so nothing else touches them.
            unsafe { batch.allow_unregistered() };
        }
        stage.end(|s| &mut s.prepare);
        let layout = self.layout;
        // Checks page `j` of the batch once its bytes are in (and copies it out of staging);
        // its valid length if it is the page that was written. A page that landed directly but
        // is not served is scrubbed: a miss never leaves another key's bytes behind.
        let check = |j: usize, dest: &mut PageDest<'_>| -> Option<u32> {
            let (i, loc) = &pages[j];
            let expect = peercache_pool::Expect {
                key: keys[*i],
                generation: loc.generation,
                len: loc.len,
                layout,
            };
            let verdict = if staging_off[j] == usize::MAX {
                peercache_pool::header::verify_segments(scratch.header(j), &dest.page(*i), &expect)
            } else {
                let off = scratch.headers * HEADER_LEN + staging_off[j];
                let staged = &scratch.buf[off..off + loc.len as usize];
                let v = peercache_pool::header::verify(scratch.header(j), staged, &expect);
                if v.is_ok() {
                    dest.fill(*i, staged);
                }
                v
            };
            match verdict {
                // The valid length handed back is the verified header's, not the directory's.
                Ok(h) => Some(h.valid_len),
                Err(reason) => {
                    if staging_off[j] == usize::MAX {
                        dest.scrub(*i);
                        if lazy {
                            // A cached RDMA registration of this memory may predate a
                            // remapping (it pins the pages it was made on, so the bytes went
                            // elsewhere): the next read registers the memory afresh.
                            for s in dest.segs(*i) {
                                self.transport.forget_local(s.ptr, s.len);
                            }
                        }
                    }
                    if reason == peercache_pool::VerifyError::Layout {
                        self.home.metrics.layout_mismatches.add(1);
                    } else {
                        self.home.metrics.verify_rejects.add(1);
                    }
                    tracing::debug!(key = %keys[*i], ?reason, peer = %ep, "remote page rejected by verification");
                    None
                }
            }
        };
        // Over TCP each page is checked as soon as it has landed, while its bytes are still in
        // the CPU's caches (the rest of the batch keeps arriving into the socket meanwhile);
        // pages another path carried are checked after the batch.
        let mut checked: Vec<Option<Option<u32>>> = vec![None; pages.len()];
        let verify_before = crate::observe::read_timing::so_far().verify;
        let stage = Stage::start();
        let res = self.transport.read_batch_landing(ep, &batch, &mut |j| {
            let st = Stage::start();
            checked[j] = Some(check(j, dest));
            st.end(|s| &mut s.verify);
        });
        let inline = crate::observe::read_timing::so_far()
            .verify
            .saturating_sub(verify_before);
        stage.end_less(|s| &mut s.transport, inline);
        let stage = Stage::start();
        drop(bufs);
        let mut out = Vec::with_capacity(pages.len());
        match res {
            Err(e) => {
                tracing::debug!(peer = %ep, error = %e, "remote read batch failed");
                // Part of the batch may have landed before the failure: scrub direct pages,
                // checked or not (a broken batch serves nothing).
                for (j, (i, _)) in pages.iter().enumerate() {
                    if staging_off[j] == usize::MAX {
                        dest.scrub(*i);
                    }
                }
                out.extend(pages.iter().map(|(i, _)| (*i, None)));
            }
            Ok(results) => {
                for (j, ((i, _), r)) in pages.iter().zip(results).enumerate() {
                    if r.is_err() {
                        if staging_off[j] == usize::MAX {
                            dest.scrub(*i);
                        }
                        out.push((*i, None));
                        continue;
                    }
                    out.push((*i, checked[j].unwrap_or_else(|| check(j, dest))));
                }
            }
        }
        self.reads.scratch.give_back(scratch);
        stage.end(|s| &mut s.verify);
        out
    }
}

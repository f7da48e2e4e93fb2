//! [`Store`]: the HiCache-shaped API of a node (blocking, thread-safe).
//!
//! A page is one or more components, each gathered from (set) or scattered to (get) a list of
//! segments; segments are given flattened, with `counts[i]` segments for page `i`, so a batch
//! costs no per-page allocation on the caller's side. Safe slice methods sit on `unsafe`
//! pointer variants ([`RawSeg`]) that the Python facade uses.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peercache_directory::{Location, Owners};
use peercache_pool::{HEADER_LEN, PageWrite, PublishScratch, Published, ReplClass};
use peercache_transport::{Access, Batch, RegionHandle, RemoteRange, Segment};
use peercache_wire::{NodeId, PageKey};
use smallvec::SmallVec;

use crate::StoreError;
use crate::base::Core;
use crate::config::PeerCacheConfig;
use crate::read_plan::ReadPlan;
use crate::scratch::{RawSeg, Scratch};

/// Counters of a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Pages resident in the pool.
    pub pool_pages: u64,
    /// Pages evicted from the pool.
    pub pool_evictions: u64,
    /// Eviction notices queued.
    pub evictions_queued: u64,
    /// Eviction notices delivered.
    pub evictions_notified: u64,
    /// Directory requests sent over the network.
    pub directory_rpcs: u64,
    /// Directory requests answered by the local shard.
    pub directory_local_calls: u64,
    /// Entries in this node's directory shard.
    pub shard_entries: u64,
    /// Bytes read from peers by the transport.
    pub transport_read_bytes: u64,
    /// Of `transport_read_bytes`: bytes copied from a same-host peer's shared memory.
    pub transport_local_read_bytes: u64,
    /// Members known.
    pub members: u64,
    /// Locations primed by `batch_exists` and not yet consumed.
    pub primed: u64,
    /// Remote pages rejected by verification (stale, torn, wrong key or checksum).
    pub verify_rejects: u64,
    /// Pages read through registered staging memory and then copied to the caller, because
    /// the caller's destination lies outside every registered host buffer (or the mode reads
    /// into staging to verify first, as slotmap does). 0 on the zero-copy paths.
    pub staged_reads: u64,
    /// Bytes read over the RDMA path (0 on TCP).
    pub rdma_read_bytes: u64,
    /// Read batches the RDMA path handed to TCP (peers without RDMA).
    pub rdma_fallbacks: u64,
}

/// A PeerCache node and its HiCache-shaped API. Cloning shares the node.
///
/// # Example
///
/// A one-node cluster (the node is its own discovery seed) with a cluster secret: publish two
/// pages, check which are present, read them back byte for byte.
///
/// ```
/// use std::time::Duration;
///
/// use peercache_store::{PeerCacheConfig, Store};
///
/// let meta_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
/// let settings = serde_json::json!({
///     "discovery_addr": format!("127.0.0.1:{meta_port}"),
///     "protocol": "tcp",
///     "global_segment_size": "16mb",
///     "metrics_enabled": false,
///     // Every connection proves it (in production: PEERCACHE_CLUSTER_SECRET or a file).
///     "cluster_secret": "an example secret of 16+ bytes",
/// });
/// let (cfg, warnings) = PeerCacheConfig::from_map(settings.as_object().unwrap())?;
/// assert!(warnings.is_empty(), "{warnings:?}");
///
/// let store = Store::start(cfg)?;
/// store.wait_ready(Some(Duration::from_secs(10)))?;
///
/// let (a, b) = (vec![1u8; 4096], vec![2u8; 4096]);
/// assert_eq!(store.batch_set(&["p0", "p1"], &[&a[..], &b[..]])?, [true, true]);
/// assert_eq!(store.batch_exists(&["p0", "p1", "p2"])?, 2); // the leading present pages
///
/// let (mut x, mut y) = (vec![0u8; 4096], vec![0u8; 4096]);
/// assert_eq!(store.batch_get(&["p0", "p1"], &mut [&mut x[..], &mut y[..]])?, [true, true]);
/// assert_eq!((x, y), (a, b));
/// store.shutdown();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Core>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("node", &self.inner.me)
            .finish()
    }
}

fn check_counts(n: usize, segs: usize, counts: &[usize]) -> Result<(), StoreError> {
    if counts.len() != n {
        return Err(StoreError::BadRequest(format!(
            "{} segment counts for {n} keys",
            counts.len()
        )));
    }
    let total: usize = counts.iter().sum();
    if total != segs {
        return Err(StoreError::BadRequest(format!(
            "segment counts add up to {total}, {segs} segments given"
        )));
    }
    Ok(())
}

impl Store {
    /// Starts a node. Returns at once; see [`Store::wait_ready`].
    pub fn start(cfg: PeerCacheConfig) -> Result<Store, StoreError> {
        Ok(Store {
            inner: Core::start(cfg)?,
        })
    }

    /// Waits until the node is registered and in the directory ring (`None`: forever).
    pub fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), StoreError> {
        self.inner.wait_ready(timeout)
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.me
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &PeerCacheConfig {
        &self.inner.cfg
    }

    /// Members discovery currently sees.
    pub fn members(&self) -> Vec<peercache_discovery::NodeInfo> {
        self.inner.discovery.members()
    }

    /// Waits until discovery sees at least `n` members, then installs them as the directory
    /// ring. Returns whether `n` was reached within `timeout`.
    pub fn wait_members(&self, n: usize, timeout: Duration) -> bool {
        let ok = self.inner.discovery.wait_for(timeout, |m| m.len() >= n);
        self.inner.sync_membership();
        ok
    }

    /// The data endpoint peers read this node's pool from.
    pub fn data_endpoint(&self) -> std::net::SocketAddr {
        self.inner.data_endpoint
    }

    /// The metrics HTTP endpoint, when enabled.
    pub fn metrics_endpoint(&self) -> Option<std::net::SocketAddr> {
        self.inner.metrics_endpoint
    }

    /// The `/cluster` document of this node.
    pub fn cluster_view(&self) -> serde_json::Value {
        crate::observe::cluster_view(&self.inner)
    }

    /// The control endpoint (directory and store RPCs).
    pub fn control_endpoint(&self) -> std::net::SocketAddr {
        self.inner.control_endpoint
    }

    /// Re-reads membership into the directory ring now (it also happens on every change).
    pub fn sync_membership(&self) {
        self.inner.sync_membership();
    }

    /// Registers the caller's KV host memory as a read destination (local-only: peers can
    /// neither read nor write it). Pages read into it land without an intermediate copy.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until the node shuts down.
    pub unsafe fn register_host_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        // SAFETY: forwarded from the caller.
        let h = unsafe { self.inner.transport.register(ptr, len, Access::LocalOnly) }?;
        self.inner.host_buffers.write().push(h);
        Ok(())
    }

    fn page_keys<K: AsRef<str>>(&self, keys: &[K]) -> Vec<PageKey> {
        keys.iter()
            .map(|k| self.inner.keys.page_key(k.as_ref()))
            .collect()
    }

    /// Publishes pages, one contiguous segment each. `true` = stored (or already stored).
    pub fn batch_set<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &[&[u8]],
    ) -> Result<Vec<bool>, StoreError> {
        let counts = vec![1; pages.len()];
        self.batch_set_segments(keys, pages, &counts)
    }

    /// Publishes pages gathered from segments (`counts[i]` segments for page `i`).
    pub fn batch_set_segments<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[&[u8]],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        let raw: Vec<RawSeg> = segs
            .iter()
            .map(|s| RawSeg {
                ptr: s.as_ptr() as *mut u8,
                len: s.len(),
            })
            .collect();
        // SAFETY: the segments are borrowed for the whole call and only read.
        unsafe { self.batch_set_raw(keys, &raw, counts) }
    }

    /// [`Store::batch_set_segments`] on raw segments.
    ///
    /// # Safety
    /// Every segment must be valid for reads of `len` bytes for the duration of the call.
    pub unsafe fn batch_set_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        check_counts(keys.len(), segs.len(), counts)?;
        let t0 = std::time::Instant::now();
        let pkeys = self.page_keys(keys);
        // SAFETY: forwarded from the caller.
        let slices: Vec<&[u8]> = segs
            .iter()
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect();
        let r = self.set_impl(&pkeys, &slices, counts);
        self.inner
            .metrics
            .write_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }

    /// Writes pages of which only the first `valid_lens[i]` bytes hold data — the partial
    /// tail page of a sequence. The whole page is stored (so every page of a layout keeps one
    /// size); [`Store::batch_get_valid`] and [`Store::batch_exists_valid`] report the valid
    /// length. A valid length above the page's size is refused.
    pub fn batch_set_partial<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &[&[u8]],
        valid_lens: &[u32],
    ) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        let counts = vec![1; pages.len()];
        check_counts(keys.len(), pages.len(), &counts)?;
        if valid_lens.len() != pages.len() {
            return Err(StoreError::BadRequest(format!(
                "{} valid lengths for {} pages",
                valid_lens.len(),
                pages.len()
            )));
        }
        if let Some((i, (p, v))) = pages
            .iter()
            .zip(valid_lens)
            .enumerate()
            .find(|(_, (p, v))| **v as usize > p.len())
        {
            return Err(StoreError::BadRequest(format!(
                "page {i}: valid length {v} exceeds its {} bytes",
                p.len()
            )));
        }
        let pkeys = self.page_keys(keys);
        Ok(self.set_impl_valid(&pkeys, pages, &counts, Some(valid_lens)))
    }

    fn set_impl(&self, keys: &[PageKey], slices: &[&[u8]], counts: &[usize]) -> Vec<bool> {
        self.set_impl_valid(keys, slices, counts, None)
    }

    /// Routes a write by mode and write policy: the local pool (p2p), storage servers
    /// (centralized; hybrid `storage`), or both (hybrid `both`).
    fn set_impl_valid(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Vec<bool> {
        use crate::config::{Mode, Role, WritePolicy};
        let cfg = &self.inner.cfg;
        if cfg.mode == Mode::Slotmap {
            return self.slot_set(keys, slices, counts);
        }
        let (to_storage, also_local) = match (cfg.mode, cfg.role, cfg.write_policy) {
            (_, Role::Storage, _) => (false, true),
            (Mode::Centralized, _, _) => (true, false),
            (Mode::Hybrid, _, WritePolicy::Storage) => (true, false),
            (Mode::Hybrid, _, WritePolicy::Both) => (true, true),
            _ => (false, true),
        };
        if !to_storage {
            return self.set_local(keys, slices, counts, valid_lens);
        }
        match self.write_to_storage(keys, slices, counts, valid_lens) {
            Some(stored) if also_local => {
                let local = self.set_local(keys, slices, counts, valid_lens);
                stored.iter().zip(local).map(|(s, l)| *s || l).collect()
            }
            Some(stored) => stored,
            // No storage server registered: hybrid falls back to the local pool; centralized
            // has no pool to fall back to.
            None if cfg.mode == Mode::Hybrid => self.set_local(keys, slices, counts, valid_lens),
            None => vec![false; keys.len()],
        }
    }

    fn set_local(
        &self,
        keys: &[PageKey],
        slices: &[&[u8]],
        counts: &[usize],
        valid_lens: Option<&[u32]>,
    ) -> Vec<bool> {
        let inner = &*self.inner;
        let m = &inner.metrics;
        m.write_requests.add(1);
        let mut pages = Vec::with_capacity(keys.len());
        let mut at = 0;
        for (j, (k, &c)) in keys.iter().zip(counts).enumerate() {
            pages.push(PageWrite {
                key: *k,
                segments: &slices[at..at + c],
                valid_len: valid_lens.map(|v| v[j]),
            });
            at += c;
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut evicted = Vec::new();
        inner.pool.publish_batch(
            &pages,
            ReplClass::Retained,
            &mut PublishScratch::default(),
            &mut out,
            &mut evicted,
        );
        let mut results = vec![false; keys.len()];
        let mut entries: Vec<(PageKey, Location)> = Vec::new();
        let mut entry_of: Vec<usize> = Vec::new();
        let mut written = 0u64;
        for (i, p) in out.iter().enumerate() {
            match p {
                Published::New(loc) => {
                    written += loc.len as u64;
                    if let Some(d) = &inner.disk {
                        d.put(keys[i], pages[i].segments, loc.valid_len, loc.generation);
                    }
                    entries.push((keys[i], inner.resident_location(loc)));
                    entry_of.push(i);
                }
                Published::Duplicate(_) => results[i] = true,
                Published::Failed(e) => tracing::debug!(error = %e, "page not published"),
            }
        }
        m.evictions.add(evicted.len() as u64);
        if let Some(b) = inner.evictions.lock().as_ref() {
            b.push(evicted);
        }
        if entries.is_empty() {
            return results;
        }
        let mut demote = Vec::new();
        let mut undo = Vec::new();
        match inner.dir.insert(&entries) {
            Ok(outcomes) => {
                for ((j, oc), (k, loc)) in outcomes.into_iter().enumerate().zip(&entries) {
                    match oc {
                        Some(oc) => {
                            results[entry_of[j]] = true;
                            if oc.reclaimable {
                                demote.push(*k);
                            }
                        }
                        None => undo.push((*k, Some(loc.generation))),
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "directory insert failed; pages withdrawn");
                undo.extend(entries.iter().map(|(k, l)| (*k, Some(l.generation))));
            }
        }
        if !demote.is_empty() {
            inner.pool.mark_reclaimable(&demote);
        }
        if !undo.is_empty() {
            // Not findable: withdraw, so a retry publishes again instead of being answered
            // "already stored" for a page nobody can find.
            inner.pool.remove_batch(&undo);
        }
        m.bytes_written.add(written);
        results
    }

    /// How many leading pages are present in the cluster. Their locations are primed for the
    /// next [`Store::batch_get`] for `exists_prime_ttl`.
    ///
    /// With `exists_wait_ms` > 0 this waits up to that long for the whole prefix (see
    /// [`Store::wait_for_full_prefix`]).
    pub fn batch_exists<K: AsRef<str>>(&self, keys: &[K]) -> Result<usize, StoreError> {
        self.check_open()?;
        let pkeys = self.page_keys(keys);
        let t0 = std::time::Instant::now();
        let wait = Duration::from_millis(self.inner.cfg.exists_wait_ms);
        let n = if wait.is_zero() {
            self.exists_impl(&pkeys)
        } else {
            self.wait_impl(&pkeys, wait)
        };
        self.inner
            .metrics
            .exists_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(n)
    }

    /// Like [`Store::batch_exists`], but returns the valid length of each leading present page
    /// (the vector's length is the leading count).
    pub fn batch_exists_valid<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<u32>, StoreError> {
        self.check_open()?;
        let pkeys = self.page_keys(keys);
        let Ok(found) = self.inner.dir.lookup(&pkeys) else {
            return Ok(Vec::new());
        };
        Ok(found
            .iter()
            .map_while(|o| o.as_ref().and_then(|o| o.first()).map(|l| l.valid_len))
            .collect())
    }

    /// Waits until every key is present in the cluster, at most `timeout`, and returns how many
    /// leading keys are present at the end — for a decode node that knows a prefill node is
    /// publishing a prefix. Polls the directory (one fan-out per poll) at 1 ms, backing off to
    /// 10 ms; returns at once when the prefix is complete or the node stops.
    pub fn wait_for_full_prefix<K: AsRef<str>>(
        &self,
        keys: &[K],
        timeout: Duration,
    ) -> Result<usize, StoreError> {
        self.check_open()?;
        let pkeys = self.page_keys(keys);
        Ok(self.wait_impl(&pkeys, timeout))
    }

    fn wait_impl(&self, keys: &[PageKey], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            let n = self.exists_impl(keys);
            let now = Instant::now();
            if n == keys.len() || now >= deadline || self.inner.stopping.load(Ordering::Acquire) {
                return n;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Which keys are present anywhere in the cluster, key by key — not only the leading run
    /// (the v2 HiCache calls check sidecar pools whose pages may have holes). One directory
    /// fan-out for the whole batch; every present page's location is primed for the next get,
    /// and disk-only pages start promoting, as with [`Store::batch_exists`].
    pub fn batch_contains<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        let pkeys = self.page_keys(keys);
        let t0 = std::time::Instant::now();
        let r = self.presence(&pkeys, false);
        self.inner
            .metrics
            .exists_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }

    fn exists_impl(&self, keys: &[PageKey]) -> usize {
        self.presence(keys, true).len()
    }

    /// Presence of each key; with `leading` the vector stops at the first missing key.
    fn presence(&self, keys: &[PageKey], leading: bool) -> Vec<bool> {
        let inner = &*self.inner;
        inner.metrics.exists_requests.add(1);
        if inner.cfg.mode == crate::config::Mode::Slotmap {
            let mut p = self.slot_contains(keys);
            if leading {
                let n = p.iter().take_while(|p| **p).count();
                p.truncate(n);
            }
            inner
                .metrics
                .exists_pages_found
                .add(p.iter().filter(|p| **p).count() as u64);
            return p;
        }
        let Ok(found) = inner.dir.lookup(keys) else {
            return if leading {
                Vec::new()
            } else {
                vec![false; keys.len()]
            };
        };
        let mut present: Vec<bool> = found
            .iter()
            .map(|o| o.as_ref().is_some_and(|o| !o.is_empty()))
            .collect();
        if leading {
            let n = present.iter().take_while(|p| **p).count();
            present.truncate(n);
        }
        let n = present.len();
        // Present only on some disk tier: start promoting now, so the get that follows finds
        // the pages in memory.
        if let Some(p) = inner.promoter.get() {
            // At most half a pool's worth, so a long prefix cannot thrash the pool.
            let mut budget = inner.pool.len() as u64 / 2;
            let mut job: Vec<(NodeId, Vec<PageKey>)> = Vec::new();
            let mut queued = 0;
            for (k, o) in keys.iter().zip(&found).take(n) {
                let Some(o) = o.as_ref().filter(|o| !o.is_empty()) else {
                    continue;
                };
                if o.iter().any(|l| l.resident) {
                    continue;
                }
                let need = u64::from(o[0].len) + peercache_pool::HEADER_LEN as u64;
                if queued >= crate::promote::MAX_KEYS || need > budget {
                    break;
                }
                budget -= need;
                let owner = &o[0].node;
                match job.iter_mut().find(|j| j.0 == *owner) {
                    Some(j) => j.1.push(*k),
                    None => job.push((owner.clone(), vec![*k])),
                }
                queued += 1;
            }
            if !job.is_empty() {
                p.offer(job);
            }
        }
        let ttl = Duration::from_secs_f64(inner.cfg.exists_prime_ttl);
        if !ttl.is_zero() && n > 0 {
            let now = Instant::now();
            let mut primed = inner.primed.lock();
            for (k, o) in keys.iter().zip(found).take(n) {
                if let Some(o) = o.filter(|o| !o.is_empty()) {
                    primed.put(*k, o, ttl, now);
                }
            }
        }
        inner
            .metrics
            .exists_pages_found
            .add(present.iter().filter(|p| **p).count() as u64);
        present
    }

    /// Reads pages into one contiguous buffer each. `true` = the buffer holds the page.
    pub fn batch_get<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, StoreError> {
        let counts = vec![1; pages.len()];
        self.batch_get_segments(keys, pages, &counts)
    }

    /// Reads pages scattered into segments (`counts[i]` segments for page `i`).
    pub fn batch_get_segments<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &mut [&mut [u8]],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        let raw: Vec<RawSeg> = segs
            .iter_mut()
            .map(|s| RawSeg {
                ptr: s.as_mut_ptr(),
                len: s.len(),
            })
            .collect();
        // SAFETY: the segments are exclusively borrowed for the whole call.
        unsafe { self.batch_get_raw(keys, &raw, counts) }
    }

    /// [`Store::batch_get_segments`] on raw segments.
    ///
    /// # Safety
    /// Every segment must be valid for writes of `len` bytes for the duration of the call and
    /// not overlap another segment of the call.
    pub unsafe fn batch_get_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        check_counts(keys.len(), segs.len(), counts)?;
        let pkeys = self.page_keys(keys);
        let t0 = std::time::Instant::now();
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.get_impl(&pkeys, segs, counts) };
        self.inner
            .metrics
            .read_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r.into_iter().map(|v| v.is_some()).collect())
    }

    /// Like [`Store::batch_get`], but reports each page's valid length (`None` = miss): a
    /// partial tail page (see [`Store::batch_set_partial`]) is served whole, and its valid
    /// length says how many leading bytes hold data.
    pub fn batch_get_valid<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &mut [&mut [u8]],
    ) -> Result<Vec<Option<u32>>, StoreError> {
        self.check_open()?;
        let counts = vec![1; pages.len()];
        check_counts(keys.len(), pages.len(), &counts)?;
        let raw: Vec<RawSeg> = pages
            .iter_mut()
            .map(|s| RawSeg {
                ptr: s.as_mut_ptr(),
                len: s.len(),
            })
            .collect();
        let pkeys = self.page_keys(keys);
        // SAFETY: the pages are exclusively borrowed for the whole call.
        Ok(unsafe { self.get_impl(&pkeys, &raw, &counts) })
    }

    /// # Safety
    /// As [`Store::batch_get_raw`].
    unsafe fn get_impl(
        &self,
        keys: &[PageKey],
        segs: &[RawSeg],
        counts: &[usize],
    ) -> Vec<Option<u32>> {
        let inner = &*self.inner;
        let m = &inner.metrics;
        let n = keys.len();
        m.read_requests.add(n as u64);
        if inner.cfg.mode == crate::config::Mode::Slotmap {
            // SAFETY: forwarded from the caller.
            let hit = unsafe { self.slot_get(keys, segs, counts) };
            let hits = hit.iter().filter(|h| h.is_some()).count() as u64;
            m.read_hits.add(hits);
            m.read_misses.add(n as u64 - hits);
            return hit;
        }
        let mut starts = Vec::with_capacity(n);
        let mut lens = Vec::with_capacity(n);
        let mut at = 0usize;
        for &c in counts {
            starts.push(at);
            lens.push(segs[at..at + c].iter().map(|s| s.len as u64).sum::<u64>());
            at += c;
        }
        let me = inner.me.clone();
        let mut plan = ReadPlan::new(&me, keys, &lens);
        self.find_owners(keys, &mut plan);
        let mut bytes = 0u64;

        // Local pages: lease what is in the pool, promote from the disk tier what is not (the
        // leases keep the first ones from being evicted by that promotion), copy under leases.
        let local = plan.local();
        if !local.is_empty() {
            let lk: Vec<PageKey> = local.iter().map(|&i| keys[i]).collect();
            let leases = inner.pool.lease_batch(&lk);
            let mut promoted_at: Vec<Option<usize>> = vec![None; local.len()];
            let mut missing = Vec::new();
            if let Some(disk) = &inner.disk {
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
                let (got, leased) = inner.promote_and_lease(&missing);
                m.read_disk_hits
                    .add(got.iter().filter(|l| l.is_some()).count() as u64);
                leased
            };
            let mut local_hits = 0u64;
            for (j, &i) in local.iter().enumerate() {
                let (ls, at) = match (promoted_at[j], &promoted) {
                    (Some(p), Some(ls)) => (ls, p),
                    _ => (&leases, j),
                };
                let Some(at_loc) = ls.location(at) else {
                    continue;
                };
                let mut dst: SmallVec<[&mut [u8]; 4]> = segs[starts[i]..starts[i] + counts[i]]
                    .iter()
                    // SAFETY: the caller guarantees each segment is valid and unaliased.
                    .map(|s| unsafe { std::slice::from_raw_parts_mut(s.ptr, s.len) })
                    .collect();
                if inner.pool.read_leased(ls, at, keys[i], &mut dst).is_ok() {
                    plan.served_local(i, at_loc.valid_len);
                    bytes += lens[i];
                    local_hits += 1;
                }
            }
            m.read_local_hits.add(local_hits);
        }

        // Pages no owner holds in memory but another node holds on disk: ask it to promote.
        let want = plan.disk_promotions();
        if !want.is_empty() {
            self.promote_remote(&want, keys, &lens, plan.owners_mut());
        }

        // Remote pages: one transport batch per owner and round, then verification; a page
        // whose read failed goes to its next owner in the next round.
        let mut remote_hits = 0u64;
        let mut remote_hit_idx: Vec<usize> = Vec::new();
        loop {
            let load = inner.inflight.lock().clone();
            let fetches = plan.next_fetches(&load);
            if fetches.is_empty() {
                break;
            }
            for (ep, pages) in fetches {
                *inner.inflight.lock().entry(ep).or_insert(0) += pages.len();
                // SAFETY: forwarded from the caller.
                let got = unsafe { self.read_remote(ep, &pages, keys, segs, &starts, counts) };
                if let Some(c) = inner.inflight.lock().get_mut(&ep) {
                    *c = c.saturating_sub(pages.len());
                }
                for (i, ok) in got {
                    if ok {
                        plan.served_remote(i);
                        bytes += lens[i];
                        remote_hits += 1;
                        remote_hit_idx.push(i);
                    } else {
                        m.read_failures.add(1);
                    }
                }
            }
        }
        m.read_remote_hits.add(remote_hits);
        if inner.cfg.replicate_on_read && !remote_hit_idx.is_empty() {
            let valid: Vec<u32> = (0..n).map(|i| plan.valid_len(i)).collect();
            // SAFETY: the caller's segments hold the verified pages and stay valid for the call.
            unsafe { self.replicate(&remote_hit_idx, keys, segs, &starts, counts, &valid) };
        }
        if inner.cfg.directory_read_cache_ttl > 0.0 {
            // A cached location that did not serve (slot reused, owner gone) is dropped.
            let mut cache = inner.read_cache.lock();
            for i in plan.missed_with_owners() {
                cache.remove(keys[i]);
            }
        }
        let hits = plan.hits();
        m.read_hits.add(hits);
        m.read_misses.add(n as u64 - hits);
        m.bytes_read.add(bytes);
        plan.finish()
    }

    /// Fills `plan` with the owners of `keys`: handed over by a preceding `exists` (primed),
    /// else from the read cache (`directory_read_cache_ttl`), else one directory fan-out.
    fn find_owners(&self, keys: &[PageKey], plan: &mut ReadPlan<'_>) {
        let inner = &*self.inner;
        let mut need = Vec::new();
        {
            let now = Instant::now();
            let mut primed = inner.primed.lock();
            for (i, k) in keys.iter().enumerate() {
                match primed.take(*k, now) {
                    Some(o) => plan.set_owners(i, Some(o)),
                    None => need.push(i),
                }
            }
        }
        let cache_ttl = Duration::from_secs_f64(inner.cfg.directory_read_cache_ttl);
        if !cache_ttl.is_zero() && !need.is_empty() {
            let now = Instant::now();
            let cache = inner.read_cache.lock();
            need.retain(|&i| match cache.get(keys[i], now) {
                Some(o) => {
                    plan.set_owners(i, Some(o));
                    false
                }
                None => true,
            });
        }
        inner
            .metrics
            .lookups_saved
            .add((keys.len() - need.len()) as u64);
        if need.is_empty() {
            return;
        }
        let ks: Vec<PageKey> = need.iter().map(|&i| keys[i]).collect();
        if let Ok(found) = inner.dir.lookup(&ks) {
            if !cache_ttl.is_zero() {
                let now = Instant::now();
                let mut cache = inner.read_cache.lock();
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
    ///
    /// # Safety
    /// The segments of `idx` must be valid for reads for the duration of the call.
    unsafe fn replicate(
        &self,
        idx: &[usize],
        keys: &[PageKey],
        segs: &[RawSeg],
        starts: &[usize],
        counts: &[usize],
        valid: &[u32],
    ) {
        let inner = &*self.inner;
        let slices: Vec<&[u8]> = idx
            .iter()
            .flat_map(|&i| segs[starts[i]..starts[i] + counts[i]].iter())
            // SAFETY: forwarded from the caller.
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect();
        let mut pages = Vec::with_capacity(idx.len());
        let mut at = 0;
        for &i in idx {
            let len: usize = segs[starts[i]..starts[i] + counts[i]]
                .iter()
                .map(|s| s.len)
                .sum();
            pages.push(PageWrite {
                key: keys[i],
                segments: &slices[at..at + counts[i]],
                valid_len: (valid[i] as usize != len).then_some(valid[i]),
            });
            at += counts[i];
        }
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        inner.pool.publish_batch(
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
                Published::New(loc) => Some((w.key, inner.resident_location(loc))),
                _ => None,
            })
            .collect();
        inner.metrics.replicas.add(entries.len() as u64);
        let batcher = inner.evictions.lock();
        if let Some(b) = batcher.as_ref() {
            b.push(evicted);
            b.publish(entries);
        }
    }

    /// Pages whose only copies live on other owners' disk tiers: asks each owner (one RPC per
    /// owner, all at once) to promote them, and points `owners` at the copies it reports.
    fn promote_remote(
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
        let answers = self.inner.ask_promote(&groups);
        for ((_, idx), locs) in want.iter().zip(answers) {
            for (&i, l) in idx.iter().zip(locs) {
                if let Some(l) = l.filter(|l| l.resident && l.len as u64 == lens[i]) {
                    owners[i] = Some(smallvec::smallvec![l]);
                }
            }
        }
    }

    pub(crate) fn host_region(
        &self,
        bufs: &[RegionHandle],
        ptr: u64,
        len: u64,
    ) -> Option<peercache_transport::RegionKey> {
        bufs.iter()
            .find(|h| ptr >= h.base() && ptr + len <= h.base() + h.len())
            .map(|h| h.key())
    }

    pub(crate) fn checkout_scratch(
        &self,
        headers: usize,
        staging: usize,
    ) -> Result<Scratch, StoreError> {
        let mut pool = self.inner.scratch.lock();
        if let Some(pos) = pool.iter().position(|s| s.fits(headers, staging)) {
            return Ok(pool.swap_remove(pos));
        }
        drop(pool);
        Scratch::new(&self.inner.transport, headers.max(64), staging.max(1 << 20))
    }

    /// Reads `pages` from one owner: header + payload per page, straight into the caller's
    /// registered memory when it is registered, else through staging; verifies every page.
    ///
    /// # Safety
    /// As [`Store::batch_get_raw`].
    unsafe fn read_remote(
        &self,
        ep: std::net::SocketAddr,
        pages: &[(usize, Location)],
        keys: &[PageKey],
        segs: &[RawSeg],
        starts: &[usize],
        counts: &[usize],
    ) -> Vec<(usize, bool)> {
        let inner = &*self.inner;
        let bufs = inner.host_buffers.read();
        // Which pages land directly, which go through staging.
        // With `lazy_registration` every page lands directly: segments outside registered host
        // buffers are named unregistered (TCP receives into them; RDMA registers them for the
        // batch). Without it they go through registered staging and a copy.
        let lazy = inner.cfg.lazy_registration;
        let mut staging_need = 0usize;
        let mut direct = Vec::with_capacity(pages.len());
        for (i, loc) in pages {
            let ok = lazy
                || segs[starts[*i]..starts[*i] + counts[*i]].iter().all(|s| {
                    self.host_region(&bufs, s.ptr as u64, s.len as u64)
                        .is_some()
                });
            if !ok {
                staging_need += loc.len as usize;
            }
            direct.push(ok);
        }
        let staged = direct.iter().filter(|d| !**d).count() as u64;
        if staged > 0 {
            inner.metrics.staged_reads.add(staged);
        }
        let scratch = match self.checkout_scratch(pages.len(), staging_need) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no scratch memory for a read batch");
                return pages.iter().map(|(i, _)| (*i, false)).collect();
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
                for s in &segs[starts[*i]..starts[*i] + counts[*i]] {
                    let region = self
                        .host_region(&bufs, s.ptr as u64, s.len as u64)
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
            // SAFETY: the caller's segments are valid for writes of their length and do not
            // overlap for the whole call (`batch_get_raw`'s contract); the batch runs within it.
            unsafe { batch.allow_unregistered() };
        }
        let res = inner.transport.read_batch(ep, &batch);
        drop(bufs);
        // A page that landed directly but is not served (failed op, rejected by verification,
        // broken batch) is scrubbed: a miss never leaves another key's bytes behind.
        let scrub = |i: usize| {
            for s in &segs[starts[i]..starts[i] + counts[i]] {
                // SAFETY: the caller's segment, valid for `len` writes.
                unsafe { std::ptr::write_bytes(s.ptr, 0, s.len) };
            }
        };
        let mut out = Vec::with_capacity(pages.len());
        match res {
            Err(e) => {
                tracing::debug!(peer = %ep, error = %e, "remote read batch failed");
                // Part of the batch may have landed before the failure: scrub direct pages.
                for (j, (i, _)) in pages.iter().enumerate() {
                    if staging_off[j] == usize::MAX {
                        scrub(*i);
                    }
                }
                out.extend(pages.iter().map(|(i, _)| (*i, false)));
            }
            Ok(results) => {
                for (j, ((i, loc), r)) in pages.iter().zip(results).enumerate() {
                    if r.is_err() {
                        if staging_off[j] == usize::MAX {
                            scrub(*i);
                        }
                        out.push((*i, false));
                        continue;
                    }
                    let expect = peercache_pool::Expect {
                        key: keys[*i],
                        generation: loc.generation,
                        len: loc.len,
                    };
                    let page_segs = &segs[starts[*i]..starts[*i] + counts[*i]];
                    let verdict = if staging_off[j] == usize::MAX {
                        let views: SmallVec<[&[u8]; 4]> =
                            // SAFETY: the caller's segments, just written by the transport.
                            page_segs.iter().map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) }).collect();
                        peercache_pool::header::verify_segments(scratch.header(j), &views, &expect)
                    } else {
                        let off = scratch.headers * HEADER_LEN + staging_off[j];
                        let staged = &scratch.buf[off..off + loc.len as usize];
                        let v = peercache_pool::header::verify(scratch.header(j), staged, &expect);
                        if v.is_ok() {
                            let mut at = 0;
                            for s in page_segs {
                                // SAFETY: the caller's segment, valid for `len` writes.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        staged[at..].as_ptr(),
                                        s.ptr,
                                        s.len,
                                    )
                                };
                                at += s.len;
                            }
                        }
                        v
                    };
                    match verdict {
                        Ok(_) => out.push((*i, true)),
                        Err(reason) => {
                            if staging_off[j] == usize::MAX {
                                scrub(*i);
                            }
                            inner.metrics.verify_rejects.add(1);
                            tracing::debug!(key = %keys[*i], ?reason, peer = %ep, "remote page rejected by verification");
                            out.push((*i, false));
                        }
                    }
                }
            }
        }
        inner.scratch.lock().push(scratch);
        out
    }

    /// Removes every page this node published from its pool and the directory (HiCache's
    /// `clear`). Returns how many pages were removed.
    pub fn clear(&self) -> usize {
        let gone = self.inner.pool.clear();
        let n = gone.len();
        if let Some(b) = self.inner.evictions.lock().as_ref() {
            b.push(gone);
        }
        self.flush_evictions(self.inner.cfg.op_timeout() * 4);
        n
    }

    /// Checks the directory entries of `keys` that name this node against its pool: returns
    /// (entries naming this node, of which stale — pointing at a slot this node no longer
    /// holds with that generation). A healthy node has 0 stale entries once eviction notices
    /// are flushed.
    pub fn audit<K: AsRef<str>>(&self, keys: &[K]) -> Result<(usize, usize), StoreError> {
        let pk = self.page_keys(keys);
        let (mut named, mut stale) = (0, 0);
        for chunk in pk.chunks(4096) {
            let found = self
                .inner
                .dir
                .lookup(chunk)
                .map_err(|e| StoreError::BadRequest(e.to_string()))?;
            for (k, o) in chunk.iter().zip(found) {
                for l in o
                    .iter()
                    .flatten()
                    .filter(|l| l.node == self.inner.me && l.resident)
                {
                    named += 1;
                    if self.inner.pool.generation_of(*k) != Some(l.generation) {
                        stale += 1;
                    }
                }
            }
        }
        Ok((named, stale))
    }

    /// Waits until every page written through to the disk tier is on disk (no-op without a
    /// disk tier).
    pub fn flush_disk(&self) {
        if let Some(d) = &self.inner.disk {
            d.flush();
        }
    }

    /// Waits until queued eviction notices reached the directory.
    pub fn flush_evictions(&self, timeout: Duration) -> bool {
        self.inner
            .evictions
            .lock()
            .as_ref()
            .is_some_and(|b| b.flush(timeout))
    }

    /// Counters.
    pub fn stats(&self) -> StoreStats {
        let inner = &*self.inner;
        let p = inner.pool.stats();
        let d = inner.dir.stats();
        let t = inner.transport.stats();
        let (q, nfd) = inner
            .evictions
            .lock()
            .as_ref()
            .map(|b| (b.counters.queued.get(), b.counters.notified.get()))
            .unwrap_or_default();
        StoreStats {
            pool_pages: p.retained + p.reclaimable,
            pool_evictions: p.evicted_retained + p.evicted_reclaimable,
            evictions_queued: q,
            evictions_notified: nfd,
            directory_rpcs: d.rpcs,
            directory_local_calls: d.local_calls,
            shard_entries: inner.dir_service.with_shard(|s, _| s.len() as u64),
            transport_read_bytes: t.read_bytes,
            transport_local_read_bytes: t.local_read_bytes,
            rdma_read_bytes: t.rdma_read_bytes,
            rdma_fallbacks: t.rdma_fallbacks,
            members: inner.discovery.members().len() as u64,
            primed: inner.primed.lock().len() as u64,
            verify_rejects: inner.metrics.verify_rejects.get(),
            staged_reads: inner.metrics.staged_reads.get(),
        }
    }

    /// Looks keys up in the directory without reading them (diagnostics and tests).
    pub fn locate<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<Option<Owners>>, StoreError> {
        let pk = self.page_keys(keys);
        self.inner
            .dir
            .lookup(&pk)
            .map_err(|e| StoreError::BadRequest(e.to_string()))
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.inner.stopping.load(Ordering::Acquire) {
            Err(StoreError::Shutdown)
        } else {
            Ok(())
        }
    }

    /// Where this node serves the client API (`client_enabled`), if it does.
    pub fn client_endpoint(&self) -> Option<std::net::SocketAddr> {
        self.inner.client_endpoint
    }

    /// Leaves the cluster and releases everything; idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

//! [`Store`]: the HiCache-shaped API of a node (blocking, thread-safe).
//!
//! A page is one or more components, each gathered from (set) or scattered to (get) a list of
//! segments; segments are given flattened, with `counts[i]` segments for page `i`, so a batch
//! costs no per-page allocation on the caller's side. Safe slice methods sit on `unsafe`
//! pointer variants ([`RawSeg`]) that the Python facade uses.

use std::sync::Arc;
use std::time::Duration;

use peercache_transport::Access;
use peercache_wire::{NodeId, PageKey};

use crate::StoreError;
use crate::config::PeerCacheConfig;
use crate::node::core::Core;
use crate::node::stats::StoreStats;
use crate::read::dest::check_counts;
use crate::read::scratch::RawSeg;

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
            .field("node", &self.inner.id.me)
            .finish()
    }
}

impl Store {
    /// Starts a node. Returns at once; see [`Store::wait_ready`].
    pub fn start(cfg: PeerCacheConfig) -> Result<Store, StoreError> {
        Ok(Store {
            inner: crate::node::start::start(cfg)?,
        })
    }

    /// Waits until the node is registered and in the directory ring (`None`: forever).
    pub fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), StoreError> {
        self.inner.wait_ready(timeout)
    }

    /// How much of the node's pool is faulted in. A node serves (reads, `exists`, publishes
    /// into its ready part) from the start; a large pool warms in the background and its
    /// slabs join as they are resident.
    pub fn pool_readiness(&self) -> peercache_pool::Readiness {
        self.inner.pool.readiness()
    }

    /// Waits at most `timeout` until the whole pool is faulted in (a bench measuring the
    /// steady state waits for this); returns how far it got.
    pub fn wait_pool_ready(&self, timeout: Duration) -> peercache_pool::Readiness {
        self.inner.pool.wait_ready(timeout)
    }

    /// This node's id.
    pub fn node_id(&self) -> &NodeId {
        &self.inner.id.me
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
        self.sync_membership();
        ok
    }

    /// The data endpoint peers read this node's pool from.
    pub fn data_endpoint(&self) -> std::net::SocketAddr {
        self.inner.id.data
    }

    /// The metrics HTTP endpoint, when enabled.
    pub fn metrics_endpoint(&self) -> Option<std::net::SocketAddr> {
        self.inner.id.http
    }

    /// The `/cluster` document of this node.
    pub fn cluster_view(&self) -> serde_json::Value {
        crate::observe::cluster_view(&self.inner)
    }

    /// The control endpoint (directory and store RPCs).
    pub fn control_endpoint(&self) -> std::net::SocketAddr {
        self.inner.id.control
    }

    /// Re-reads membership into the directory ring now (it also happens on every change).
    pub fn sync_membership(&self) {
        self.inner.membership_sync().sync();
        crate::node::threads::start_republish(&self.inner);
    }

    /// Declares the shape of the pages this node writes and reads (model, KV dtype, ranks,
    /// every registered pool's geometry). From now on every page it writes carries the
    /// spec's fingerprint, and every read path — local pool, same-host copy, TCP, RDMA, disk
    /// tier, slot regions, storage servers — refuses a page carrying another one as a miss,
    /// counted in [`StoreStats::layout_mismatches`]. A node that never declares a layout
    /// writes and reads [`Layout::NONE`](peercache_wire::Layout::NONE) pages only.
    ///
    /// Pages this node holds under another layout are replaced when the same key is written
    /// again. Returns the fingerprint.
    ///
    /// ```no_run
    /// # fn run(store: &peercache_store::Store) -> Result<(), Box<dyn std::error::Error>> {
    /// use peercache_store::layout::page::LayoutSpec;
    /// let spec = LayoutSpec::from_json(r#"{"model": "m", "kv_dtype": "bfloat16",
    ///     "pools": [{"name": "kv", "tokens_per_page": 64, "host_layout": "layer_first",
    ///                "bytes_per_page": 4096}]}"#)?;
    /// let layout = store.set_layout(&spec);
    /// assert_eq!(store.layout(), layout);
    /// # Ok(()) }
    /// ```
    pub fn set_layout(&self, spec: &crate::layout::page::LayoutSpec) -> peercache_wire::Layout {
        let l = spec.fingerprint();
        let old = self
            .inner
            .layout
            .swap(l.0, std::sync::atomic::Ordering::AcqRel);
        if old != l.0 {
            tracing::info!(layout = %l, model = %spec.model, kv_dtype = %spec.kv_dtype,
                pools = spec.pools.len(), "page layout declared");
        }
        l
    }

    /// The layout fingerprint this node writes and expects ([`Store::set_layout`]).
    pub fn layout(&self) -> peercache_wire::Layout {
        self.inner.layout()
    }

    /// Registers the caller's KV host memory as a read destination (local-only: peers can
    /// neither read nor write it). Pages read into it land without an intermediate copy.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until the node shuts down.
    pub unsafe fn register_host_buffer(&self, ptr: *mut u8, len: usize) -> Result<(), StoreError> {
        // SAFETY: forwarded from the caller.
        let h = unsafe { self.inner.transport.register(ptr, len, Access::LocalOnly) }?;
        self.inner.reads.host_buffers.write().push(h);
        Ok(())
    }

    pub(crate) fn page_keys<K: AsRef<str>>(&self, keys: &[K]) -> Vec<PageKey> {
        self.inner.page_keys(keys)
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
        // Device memory is a read destination only: publishing copies with the CPU.
        self.inner.read_wing().touches_device(segs)?;
        let pkeys = self.page_keys(keys);
        // SAFETY: forwarded from the caller.
        let slices: Vec<&[u8]> = segs
            .iter()
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect();
        self.inner.write_wing().set_pages(&pkeys, &slices, counts)
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
        self.batch_set_partial_segments(keys, pages, &vec![1; pages.len()], valid_lens)
    }

    /// [`Store::batch_set_partial`] for pages gathered from segments (`counts[i]` segments for
    /// page `i`; `valid_lens[i]` counts bytes over all of them).
    pub fn batch_set_partial_segments<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[&[u8]],
        counts: &[usize],
        valid_lens: &[u32],
    ) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        check_counts(keys.len(), segs.len(), counts)?;
        if valid_lens.len() != keys.len() {
            return Err(StoreError::BadRequest(format!(
                "{} valid lengths for {} pages",
                valid_lens.len(),
                keys.len()
            )));
        }
        let mut at = 0;
        for (i, (&n, &v)) in counts.iter().zip(valid_lens).enumerate() {
            let bytes: usize = segs[at..at + n].iter().map(|s| s.len()).sum();
            at += n;
            if v as usize > bytes {
                return Err(StoreError::BadRequest(format!(
                    "page {i}: valid length {v} exceeds its {bytes} bytes"
                )));
            }
        }
        let pkeys = self.page_keys(keys);
        Ok(self.inner.write_wing().write(crate::node::write::Writes {
            keys: &pkeys,
            slices: segs,
            counts,
            valid_lens: Some(valid_lens),
        }))
    }

    /// [`Store::batch_set_partial_segments`] on raw segments.
    ///
    /// # Safety
    /// Every segment must be valid for reads of `len` bytes for the duration of the call.
    pub unsafe fn batch_set_partial_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
        valid_lens: &[u32],
    ) -> Result<Vec<bool>, StoreError> {
        // SAFETY: forwarded from the caller.
        let slices: Vec<&[u8]> = segs
            .iter()
            .map(|s| unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) })
            .collect();
        self.batch_set_partial_segments(keys, &slices, counts, valid_lens)
    }

    /// Removes every page this node published from its pool and the directory (HiCache's
    /// `clear`). Returns how many pages were removed.
    pub fn clear(&self) -> usize {
        let gone = self.inner.pool.clear();
        let n = gone.len();
        if let Some(b) = self.inner.tasks.evictions.lock().as_ref() {
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
            let found = self.inner.dir.lookup(chunk).map_err(StoreError::from)?;
            for (k, o) in chunk.iter().zip(found) {
                for l in o
                    .iter()
                    .flatten()
                    .filter(|l| l.node == self.inner.id.me && l.resident)
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
            .tasks
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
            .tasks
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
            primed: inner.reads.primed.lock().len() as u64,
            verify_rejects: inner.metrics.verify_rejects.get(),
            layout_mismatches: inner.metrics.layout_mismatches.get(),
            staged_reads: inner.metrics.staged_reads.get(),
            identity_refused: inner.metrics.identity_refused.get()
                + inner.dir_service.refusals().identity.get(),
            layouts_refused: inner.metrics.layouts_refused.get(),
            disk_republished: inner.metrics.republishes.get(),
            read_hint_hits: inner.metrics.read_hint_hits.get(),
            read_hint_misses: inner.metrics.read_hint_misses.get(),
        }
    }

    pub(crate) fn check_open(&self) -> Result<(), StoreError> {
        self.inner.check_open()
    }

    /// Where this node serves the client API (`client_enabled`), if it does.
    pub fn client_endpoint(&self) -> Option<std::net::SocketAddr> {
        self.inner.id.client
    }

    /// Leaves the cluster and releases everything; idempotent.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

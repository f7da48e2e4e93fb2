//! An SGLang-shaped workload: a simulator of SGLang's host KV pool and of HiCache's prefetch
//! and backup calls, so `throughput` and `drive` measure what a serving engine would see.
//!
//! * The pool: MLA (one latent vector per token per layer) or MHA (K and V per KV head), laid
//!   out `page_first` (a page's layers contiguous: one segment for MLA, K and V for MHA) or
//!   `layer_first` (one segment per layer, and per K/V for MHA) — the pointer tables SGLang's
//!   `get_page_buffer_meta` hands the backend. The whole pool is one buffer registered with the
//!   node, as `register_mem_pool_host` does.
//! * Keys: page hashes chained like SGLang's (each page's hash covers the previous one), keyed
//!   the way the Python facade keys them (`<model>|<hash>|mla` or `|tp<r>of<s>`).
//! * Calls: a prefetch is `batch_exists` over a request's pages, then `batch_get` of the leading
//!   run straight into host slots; a backup is `batch_set` from host slots.
//! * Check: the first 16 bytes of every page carry a stamp of its key; readers count pages
//!   whose stamp is wrong (always 0 unless something is broken).

use std::sync::Arc;

use anyhow::{Result, bail};
use peercache_store::{RawSeg, Store};

use crate::load::rawtcp;
use crate::load::runner::CallOutcome;

/// KV layout of the simulated model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Multi-head latent attention: one component per token, shared by every TP rank.
    Mla,
    /// Multi-head attention: K and V per KV head, split across TP ranks.
    Mha,
}

/// SGLang's host-pool layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostLayout {
    /// A page's layers are contiguous.
    PageFirst,
    /// Each layer is its own region; a page is one slice per layer.
    LayerFirst,
}

/// The model and host-pool shape (`--layout`, `--host-layout`, `--tokens-per-page`…).
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct ShapeArgs {
    /// KV layout: mla or mha.
    #[arg(long, value_enum, default_value_t = Layout::Mha)]
    pub layout: Layout,
    /// Host pool layout: page_first or layer_first.
    #[arg(long, value_enum, default_value_t = HostLayout::PageFirst)]
    pub host_layout: HostLayout,
    /// Tokens per page (SGLang's `--page-size`).
    #[arg(long, default_value_t = 16)]
    pub tokens_per_page: u64,
    /// Layers of the model (on this pipeline stage).
    #[arg(long, default_value_t = 32)]
    pub layers: u64,
    /// MHA: KV heads on this TP rank.
    #[arg(long, default_value_t = 1)]
    pub kv_heads: u64,
    /// MHA: head dimension.
    #[arg(long, default_value_t = 128)]
    pub head_dim: u64,
    /// MLA: latent plus rope width per token.
    #[arg(long, default_value_t = 576)]
    pub mla_dim: u64,
    /// Bytes per element (2 = fp16/bf16, 1 = fp8).
    #[arg(long, default_value_t = 2)]
    pub dtype_bytes: u64,
    /// Model name in the keys.
    #[arg(long, default_value = "bench-model")]
    pub model: String,
}

impl ShapeArgs {
    /// Bytes of one layer's slice of one component of a page (K, V or the MLA latent).
    pub fn item_bytes(&self) -> u64 {
        let per_token = match self.layout {
            Layout::Mla => self.mla_dim,
            Layout::Mha => self.kv_heads * self.head_dim,
        };
        self.tokens_per_page * per_token * self.dtype_bytes
    }

    /// Components per page: 1 (MLA) or 2 (K and V).
    pub fn components(&self) -> u64 {
        match self.layout {
            Layout::Mla => 1,
            Layout::Mha => 2,
        }
    }

    /// Bytes of a page.
    pub fn page_bytes(&self) -> u64 {
        self.components() * self.layers * self.item_bytes()
    }

    /// Segments the backend gets per page.
    pub fn segments_per_page(&self) -> u64 {
        match self.host_layout {
            HostLayout::PageFirst => self.components(),
            HostLayout::LayerFirst => self.components() * self.layers,
        }
    }

    /// Checks the shape is usable.
    pub fn validate(&self) -> Result<()> {
        if self.tokens_per_page == 0 || self.layers == 0 || self.dtype_bytes == 0 {
            bail!("--tokens-per-page, --layers and --dtype-bytes must be positive");
        }
        if self.item_bytes() < 16 {
            bail!("a page's layer slice must hold at least 16 bytes (the check stamp)");
        }
        if self.page_bytes() > u32::MAX as u64 {
            bail!("a page of {} bytes is too large", self.page_bytes());
        }
        Ok(())
    }

    /// The facade's key for page hash `h`.
    pub fn key(&self, h: &str) -> String {
        match self.layout {
            Layout::Mla => format!("{}|{h}|mla", self.model),
            Layout::Mha => format!("{}|{h}|tp0of1", self.model),
        }
    }

    /// The byte spans (offset, length) of slot `slot`'s segments in a pool of `slots` pages, in
    /// `get_page_buffer_meta` order: `page_first` gives one span per component (its layers
    /// contiguous), `layer_first` one per layer and component. A host pool and a device pool
    /// share this geometry.
    pub fn slot_spans(&self, slots: usize, slot: usize, mut f: impl FnMut(usize, usize)) {
        let item = self.item_bytes() as usize;
        let layers = self.layers as usize;
        let comps = self.components() as usize;
        let comp_region = slots * layers * item;
        match self.host_layout {
            HostLayout::PageFirst => {
                for c in 0..comps {
                    f(c * comp_region + slot * layers * item, layers * item);
                }
            }
            HostLayout::LayerFirst => {
                for l in 0..layers {
                    for c in 0..comps {
                        f(c * comp_region + (l * slots + slot) * item, item);
                    }
                }
            }
        }
    }

    /// Byte offset of slot `slot`'s first segment, where its 16-byte check stamp lives.
    pub fn stamp_offset(&self, slot: usize) -> usize {
        slot * self.stamp_pitch()
    }

    /// Bytes between the stamps of consecutive slots (their first segments).
    pub fn stamp_pitch(&self) -> usize {
        let item = self.item_bytes() as usize;
        match self.host_layout {
            HostLayout::PageFirst => self.layers as usize * item,
            HostLayout::LayerFirst => item,
        }
    }

    /// The keys of request `r`'s `pages` pages: hashes chained from the request's first tokens.
    pub fn request_keys(&self, r: u64, pages: usize) -> Vec<String> {
        let mut prev = xxhash_rust::xxh3::xxh3_128(&r.to_le_bytes());
        (0..pages)
            .map(|i| {
                let mut buf = [0u8; 24];
                buf[..16].copy_from_slice(&prev.to_le_bytes());
                buf[16..].copy_from_slice(&(i as u64).to_le_bytes());
                prev = xxhash_rust::xxh3::xxh3_128(&buf);
                let lo = xxhash_rust::xxh3::xxh3_128(&prev.to_be_bytes());
                self.key(&format!("{prev:032x}{lo:032x}"))
            })
            .collect()
    }
}

/// Appends slot `slot`'s segments of a pool of `slots` pages of `shape` to `out`, in
/// `get_page_buffer_meta` order, each at the address `at(offset)` gives for its byte offset.
///
/// # Panics
/// If `slot` is not a slot of the pool.
pub fn push_slot_segments(
    shape: &ShapeArgs,
    slots: usize,
    slot: usize,
    out: &mut Vec<RawSeg>,
    at: impl Fn(usize) -> *mut u8,
) {
    assert!(slot < slots, "slot {slot} of a {slots}-slot pool");
    shape.slot_spans(slots, slot, |off, len| {
        out.push(RawSeg { ptr: at(off), len })
    });
}

/// SGLang's host KV pool, simulated: `slots` pages in one prefaulted buffer. Like SGLang's,
/// it is plain memory that the node writes into by address; it is only ever touched through
/// raw pointers, so it can be shared (`Arc`) by the thread that issues reads into it.
pub struct HostPool {
    ptr: *mut u8,
    len: usize,
    shape: ShapeArgs,
    slots: usize,
}

// SAFETY: the pool owns its allocation and is only accessed through raw pointers; callers give
// each thread its own slots (one pool per caller), as SGLang gives each transfer its own.
unsafe impl Send for HostPool {}
// SAFETY: as above.
unsafe impl Sync for HostPool {}

impl Drop for HostPool {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

impl HostPool {
    /// A pool of `slots` pages of `shape`.
    pub fn new(shape: &ShapeArgs, slots: usize) -> HostPool {
        let len = slots * shape.page_bytes() as usize;
        let buf = rawtcp::prefaulted(len, 7).into_boxed_slice();
        HostPool {
            ptr: Box::into_raw(buf) as *mut u8,
            len,
            shape: shape.clone(),
            slots,
        }
    }

    /// The pool's bytes at `off..off + 16`.
    fn bytes16(&self, off: usize) -> [u8; 16] {
        assert!(off + 16 <= self.len);
        let mut out = [0u8; 16];
        // SAFETY: in bounds (checked); plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), 16) };
        out
    }

    /// Pages the pool holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Registers the whole pool with `store` as a zero-copy destination.
    ///
    /// # Safety
    /// The pool must outlive the store (shut the store down before dropping the pool).
    pub unsafe fn register(&self, store: &Store) -> Result<()> {
        // SAFETY: forwarded from the caller: the buffer outlives the node.
        unsafe { store.register_host_buffer(self.ptr, self.len) }?;
        Ok(())
    }

    /// Appends slot `slot`'s segments in `get_page_buffer_meta` order.
    pub fn segments(&self, slot: usize, out: &mut Vec<RawSeg>) {
        let base = self.ptr;
        // SAFETY: `push_slot_segments` passes offsets inside a pool of `self.slots` pages.
        push_slot_segments(&self.shape, self.slots, slot, out, |off| unsafe {
            base.add(off)
        });
    }

    /// Writes `key`'s stamp at the start of slot `slot` (its first segment).
    pub fn stamp(&mut self, slot: usize, key: &str) {
        let off = self.shape.stamp_offset(slot);
        assert!(slot < self.slots && off + 16 <= self.len);
        // SAFETY: in bounds (checked); `&mut self` excludes other users of the pool.
        unsafe { std::ptr::copy_nonoverlapping(stamp_of(key).as_ptr(), self.ptr.add(off), 16) };
    }

    /// Whether slot `slot` carries `key`'s stamp.
    pub fn stamped(&self, slot: usize, key: &str) -> bool {
        slot < self.slots && self.bytes16(self.shape.stamp_offset(slot)) == stamp_of(key)
    }
}

/// The 16-byte check stamp of `key` (what the first bytes of its page carry).
pub fn stamp_of(key: &str) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(key.as_bytes()).to_le_bytes()
}

/// The working set: `requests` requests of `pages` pages each.
pub fn working_set(shape: &ShapeArgs, requests: u64, pages: usize) -> Arc<Vec<Vec<String>>> {
    Arc::new(
        (0..requests)
            .map(|r| shape.request_keys(r, pages))
            .collect(),
    )
}

/// Backs up every request of `set` from `pool` (stamping each page first), one `batch_set`
/// per request — HiCache's write-back path.
pub fn backup_all(store: &Store, pool: &mut HostPool, set: &[Vec<String>]) -> Result<()> {
    let mut segs = Vec::new();
    for keys in set {
        if keys.len() > pool.slots() {
            bail!("a request has more pages than the host pool has slots");
        }
        segs.clear();
        for (slot, k) in keys.iter().enumerate() {
            pool.stamp(slot, k);
            pool.segments(slot, &mut segs);
        }
        let per = pool.shape.segments_per_page() as usize;
        let counts = vec![per; keys.len()];
        // SAFETY: the segments point into `pool`, borrowed mutably for the whole call.
        let ok = unsafe { store.batch_set_raw(keys, &segs, &counts) }?;
        if !ok.iter().all(|&x| x) {
            bail!("{}: could not back up the working set", store.node_id());
        }
    }
    Ok(())
}

/// Counters a prefetch caller keeps beside its row.
#[derive(Default)]
pub struct Checks {
    /// Pages whose stamp did not match their key.
    pub wrong: std::sync::atomic::AtomicU64,
}

/// What a read caller does per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadKind {
    /// exists, then get of the leading run (HiCache's prefetch).
    Prefetch,
    /// get of every page, no exists first.
    Get,
    /// exists only.
    Exists,
}

/// A read caller's next request after request `r` (which it advances), and how many of its
/// leading pages to read into `slots` slots: all ([`ReadKind::Get`]) or the run `batch_exists`
/// finds. `Err` carries the call's outcome when nothing is to be read: an exists-only call, or
/// a lookup that failed.
pub fn next_request<'a>(
    kind: ReadKind,
    store: &Store,
    set: &'a [Vec<String>],
    r: &mut u64,
    slots: usize,
) -> Result<(&'a [String], usize), CallOutcome> {
    *r = (*r + 1) % set.len() as u64;
    let keys = &set[*r as usize];
    let n = match kind {
        ReadKind::Get => keys.len(),
        ReadKind::Prefetch | ReadKind::Exists => match store.batch_exists(keys) {
            Ok(n) => n,
            Err(_) => return Err(CallOutcome::done(0, keys.len() as u64, true)),
        },
    };
    if kind == ReadKind::Exists {
        return Err(CallOutcome::done(n as u64, (keys.len() - n) as u64, false));
    }
    Ok((keys, n.min(slots)))
}

/// One read caller: for the next request, `batch_exists` then `batch_get` of the leading run
/// ([`ReadKind::Prefetch`]), `batch_get` of every page ([`ReadKind::Get`]) or `batch_exists`
/// alone ([`ReadKind::Exists`]), into this caller's own host pool (registered with `store`),
/// then a stamp check of every page read.
///
/// # Safety
/// `pool` must stay registered with `store` and alive while the caller runs; each caller gets
/// its own pool.
pub unsafe fn read_caller(
    kind: ReadKind,
    store: Store,
    pool: Arc<HostPool>,
    set: Arc<Vec<Vec<String>>>,
    start: u64,
    checks: Arc<Checks>,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let per = pool.shape.segments_per_page() as usize;
    let mut r = start;
    let mut segs: Vec<RawSeg> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    move || {
        let (keys, n) = match next_request(kind, &store, &set, &mut r, pool.slots) {
            Ok(next) => next,
            Err(done) => return done,
        };
        segs.clear();
        for slot in 0..n {
            pool.segments(slot, &mut segs);
        }
        counts.clear();
        counts.resize(n, per);
        // SAFETY: the segments point into this caller's own registered pool.
        let got = match unsafe { store.batch_get_raw(&keys[..n], &segs, &counts) } {
            Ok(g) => g,
            Err(_) => return CallOutcome::done(0, keys.len() as u64, true),
        };
        let mut hits = 0u64;
        for (slot, ok) in got.iter().enumerate() {
            if *ok {
                hits += 1;
                if !pool.stamped(slot, &keys[slot]) {
                    checks
                        .wrong
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        CallOutcome::done(hits, keys.len() as u64 - hits, false)
    }
}

/// A small shape for unit tests (3 layers, 4 tokens per page).
#[cfg(test)]
pub(crate) fn test_shape(layout: Layout, host: HostLayout) -> ShapeArgs {
    ShapeArgs {
        layout,
        host_layout: host,
        tokens_per_page: 4,
        layers: 3,
        kv_heads: 2,
        head_dim: 8,
        mla_dim: 16,
        dtype_bytes: 2,
        model: "m".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::test_shape as shape;
    use super::*;

    #[test]
    fn segments_tile_the_pool_exactly_once() {
        for layout in [Layout::Mla, Layout::Mha] {
            for host in [HostLayout::PageFirst, HostLayout::LayerFirst] {
                let s = shape(layout, host);
                let pool = HostPool::new(&s, 5);
                let mut segs = Vec::new();
                for slot in 0..5 {
                    let before = segs.len();
                    pool.segments(slot, &mut segs);
                    assert_eq!((segs.len() - before) as u64, s.segments_per_page());
                    let bytes: usize = segs[before..].iter().map(|g| g.len).sum();
                    assert_eq!(bytes as u64, s.page_bytes());
                }
                let mut spans: Vec<(usize, usize)> =
                    segs.iter().map(|g| (g.ptr as usize, g.len)).collect();
                spans.sort();
                let base = pool.ptr as usize;
                let mut at = base;
                for (p, l) in spans {
                    assert_eq!(p, at, "{layout:?} {host:?}: gap or overlap");
                    at += l;
                }
                assert_eq!(at, base + pool.len);
            }
        }
    }

    #[test]
    fn keys_chain_and_follow_the_facade() {
        let s = shape(Layout::Mla, HostLayout::PageFirst);
        let a = s.request_keys(1, 3);
        let b = s.request_keys(1, 4);
        assert_eq!(a[..], b[..3], "a longer prefix extends the same chain");
        assert_ne!(s.request_keys(2, 1)[0], a[0]);
        assert!(a[0].starts_with("m|") && a[0].ends_with("|mla"));
        assert_eq!(a[0].split('|').nth(1).unwrap().len(), 64);
        let m = shape(Layout::Mha, HostLayout::PageFirst);
        assert!(m.request_keys(1, 1)[0].ends_with("|tp0of1"));
    }
}

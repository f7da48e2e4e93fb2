//! The operations the store benchmarks repeat: publishing a key set, and the caller loops of a
//! `get` or `exists` row over it.

use std::sync::Arc;

use anyhow::{Result, bail};
use peercache_store::Store;

use crate::load::rawtcp;
use crate::load::runner::CallOutcome;

/// Publishes `keys` on `store` in batches, every page a slice of `src` (`batch` pages long).
pub fn publish(
    store: &Store,
    keys: &[String],
    src: &[u8],
    page: usize,
    batch: usize,
) -> Result<()> {
    for chunk in keys.chunks(batch) {
        let pages: Vec<&[u8]> = (0..chunk.len())
            .map(|j| &src[j * page..(j + 1) * page])
            .collect();
        if !store.batch_set(chunk, &pages)?.iter().all(|&x| x) {
            bail!("{}: could not publish the key set", store.node_id());
        }
    }
    Ok(())
}

/// The next `batch` keys of a walk through `keys` from position `*k`.
fn next_keys<'a>(keys: &'a [String], k: &mut u64, batch: usize) -> Vec<&'a str> {
    let n = keys.len() as u64;
    (0..batch)
        .map(|_| {
            *k = (*k + 1) % n;
            keys[*k as usize].as_str()
        })
        .collect()
}

/// One caller of a `get` row: `batch_get` of the next `batch` keys into its own buffers;
/// errors when any page misses.
pub fn get_caller(
    store: Store,
    keys: Arc<Vec<String>>,
    page: usize,
    batch: usize,
    start: u64,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let mut bufs = rawtcp::prefaulted(batch * page, 3);
    let mut k = start;
    move || {
        let ks = next_keys(&keys, &mut k, batch);
        let mut dst: Vec<&mut [u8]> = bufs.chunks_mut(page).collect();
        let found = store
            .batch_get(&ks, &mut dst)
            .map(|r| r.iter().filter(|&&x| x).count() as u64)
            .unwrap_or(0);
        CallOutcome::done(found, batch as u64 - found, found != batch as u64)
    }
}

/// One caller of an `exists` row over the next `batch` keys.
pub fn exists_caller(
    store: Store,
    keys: Arc<Vec<String>>,
    batch: usize,
    start: u64,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let mut k = start;
    move || {
        let ks = next_keys(&keys, &mut k, batch);
        let found = store.batch_exists(&ks).unwrap_or(0) as u64;
        CallOutcome::done(found, batch as u64 - found, found != batch as u64)
    }
}

/// One caller of a `raw-tcp` row: batches of `batch` pages from the baseline server at `addr`,
/// walking its `pages` pages from position `start`.
pub fn raw_caller(
    addr: std::net::SocketAddr,
    page: usize,
    batch: usize,
    pages: u64,
    start: u64,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let mut cl = rawtcp::RawClient::connect(addr).expect("raw-tcp connect");
    let mut dst = rawtcp::prefaulted(batch * page, 1);
    let mut offs = vec![0u64; batch];
    let mut k = start;
    move || {
        for o in offs.iter_mut() {
            *o = (k % pages) * page as u64;
            k += 1;
        }
        let error = cl.batch(&offs, page, &mut dst).is_err();
        CallOutcome::done(if error { 0 } else { batch as u64 }, 0, error)
    }
}

/// One caller of a `set` row: fresh keys `<prefix>/<n>` from a shared counter, pages from
/// `src` (this caller's `batch`-page slice at `t`).
pub fn set_caller(
    store: Store,
    src: Arc<Vec<u8>>,
    prefix: String,
    next: Arc<std::sync::atomic::AtomicU64>,
    page: usize,
    batch: usize,
    t: usize,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    move || {
        let base = next.fetch_add(batch as u64, std::sync::atomic::Ordering::Relaxed);
        let keys: Vec<String> = (base..base + batch as u64)
            .map(|i| format!("{prefix}/{i}"))
            .collect();
        let off = t * batch * page;
        let pages: Vec<&[u8]> = (0..batch)
            .map(|j| &src[off + j * page..off + (j + 1) * page])
            .collect();
        match store.batch_set(&keys, &pages) {
            Ok(v) => {
                let ok = v.iter().filter(|&&x| x).count() as u64;
                CallOutcome::done(ok, 0, ok != batch as u64)
            }
            Err(_) => CallOutcome::done(0, 0, true),
        }
    }
}

/// Destination memory for store reads, one disjoint slice per caller thread, registered with
/// the reading node — SGLang's registered host pool, in the simplest shape.
pub struct CallerBuffers {
    ptr: *mut u8,
    len: usize,
    per_caller: usize,
}

// SAFETY: the buffers own their allocation and are only accessed through raw pointers; each
// caller writes its own disjoint slice (`seg(t, …)`).
unsafe impl Send for CallerBuffers {}
// SAFETY: as above.
unsafe impl Sync for CallerBuffers {}

impl Drop for CallerBuffers {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

impl CallerBuffers {
    /// `callers` slices of `per_caller` bytes, pre-faulted.
    pub fn new(callers: usize, per_caller: usize) -> CallerBuffers {
        let len = callers * per_caller;
        let buf = rawtcp::prefaulted(len, 13).into_boxed_slice();
        CallerBuffers {
            ptr: Box::into_raw(buf) as *mut u8,
            len,
            per_caller,
        }
    }

    /// Registers every slice with `store` as a zero-copy destination.
    ///
    /// # Safety
    /// The buffers must outlive the store (shut it down before dropping them).
    pub unsafe fn register(&self, store: &Store) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { store.register_host_buffer(self.ptr, self.len) }?;
        Ok(())
    }

    /// Page `i` (of `page` bytes) of caller `caller`'s slice.
    pub fn seg(&self, caller: usize, i: usize, page: usize) -> peercache_store::RawSeg {
        let off = caller * self.per_caller + i * page;
        assert!(
            off + page <= self.len,
            "page {i} of caller {caller} is outside the buffers"
        );
        peercache_store::RawSeg {
            // SAFETY: in bounds (checked above).
            ptr: unsafe { self.ptr.add(off) },
            len: page,
        }
    }
}

/// One caller of a `get` row into registered memory: `batch_get` of the next `batch` keys
/// straight into caller `t`'s slice of `bufs`, which must be registered with `store`.
pub fn registered_get_caller(
    store: Store,
    keys: Arc<Vec<String>>,
    bufs: Arc<CallerBuffers>,
    page: usize,
    batch: usize,
    t: usize,
    start: u64,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let mut k = start;
    let mut segs = Vec::with_capacity(batch);
    let counts = vec![1usize; batch];
    move || {
        segs.clear();
        segs.extend((0..batch).map(|i| bufs.seg(t, i, page)));
        let ks = next_keys(&keys, &mut k, batch);
        // SAFETY: the segments are this caller's own slice of the registered buffers.
        let found = unsafe { store.batch_get_raw(&ks, &segs, &counts) }
            .map(|r| r.iter().filter(|&&x| x).count() as u64)
            .unwrap_or(0);
        CallOutcome::done(found, batch as u64 - found, found != batch as u64)
    }
}

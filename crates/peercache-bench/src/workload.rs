//! The operations the store benchmarks repeat: publishing a key set, and the caller loops of a
//! `get` or `exists` row over it.

use std::sync::Arc;

use anyhow::{Result, bail};
use peercache_store::Store;

use crate::rawtcp;
use crate::runner::CallOutcome;

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

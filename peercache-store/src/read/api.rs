//! The store's read API: `exists` and its waiting, hinted and valid-length forms, `contains`,
//! `get` in its slice, segment and raw forms, `locate` and prefix locations — each a thin
//! checked entry into the [`crate::read::wing::ReadWing`].

use std::time::Duration;

use peercache_directory::Owners;

use crate::StoreError;
use crate::node::store::Store;
use crate::read::dest::PageDest;
use crate::read::scratch::RawSeg;

impl Store {
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
            self.inner.read_wing().exists_impl(&pkeys)
        } else {
            self.inner.read_wing().wait_impl(&pkeys, wait)
        };
        self.inner
            .metrics
            .exists_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(n)
    }

    /// [`Store::batch_exists`] with a router hint: `holder` names the node a router says holds
    /// the request's KV. That node is asked where its pool holds the keys (one RPC); when it
    /// holds all of them no directory request is sent, otherwise the directory is asked about
    /// the keys past its run. A wrong hint costs one round trip, never a wrong answer. Counted
    /// in `peercache_read_hint_{hits,misses}_total`; `exists_wait_ms` does not apply. A `holder`
    /// that is no valid node id is a [`StoreError::BadRequest`].
    pub fn batch_exists_hinted<K: AsRef<str>>(
        &self,
        keys: &[K],
        holder: &str,
    ) -> Result<usize, StoreError> {
        self.check_open()?;
        let hint = peercache_wire::NodeId::new(holder)
            .map_err(|e| StoreError::BadRequest(format!("hint {holder:?}: {e}")))?;
        let pkeys = self.page_keys(keys);
        let t0 = std::time::Instant::now();
        let n = self.inner.read_wing().exists_hinted(&pkeys, &hint);
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
        Ok(self.inner.read_wing().leading_valid_lens(&pkeys))
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
        Ok(self.inner.read_wing().wait_impl(&pkeys, timeout))
    }

    /// Which keys are present anywhere in the cluster, key by key — not only the leading run
    /// (the v2 HiCache calls check sidecar pools whose pages may have holes). One directory
    /// fan-out for the whole batch; every present page's location is primed for the next get,
    /// and disk-only pages start promoting, as with [`Store::batch_exists`].
    pub fn batch_contains<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<bool>, StoreError> {
        self.inner.read_wing().contains(&self.page_keys(keys))
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

    /// [`Store::batch_get`] with a router's hint: `holder` names the node that holds the pages
    /// (vLLM's `kv_transfer_params`, a KV-hint envelope). That node is asked where its pool
    /// holds them — one RPC, no directory lookup — and what it does not hold is looked up in
    /// the directory as always; counted in `peercache_read_hint_{hits,misses}_total`. The pages
    /// are verified like any other: a wrong hint costs a round trip, never a page. A `holder`
    /// that is no valid node id is a [`StoreError::BadRequest`].
    ///
    /// ```no_run
    /// # fn demo(store: &peercache_store::Store) -> Result<(), peercache_store::StoreError> {
    /// let mut page = vec![0u8; 4096];
    /// let got = store.batch_get_hinted(&["req-17/0"], &mut [&mut page[..]], "node-a")?;
    /// # Ok(()) }
    /// ```
    pub fn batch_get_hinted<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &mut [&mut [u8]],
        holder: &str,
    ) -> Result<Vec<bool>, StoreError> {
        let counts = vec![1; pages.len()];
        let raw = RawSeg::of_mut(pages);
        // SAFETY: the pages are exclusively borrowed for the whole call and do not overlap.
        unsafe { self.batch_get_raw_hinted(keys, &raw, &counts, Some(holder)) }
    }

    /// [`Store::batch_get_raw`] with an optional router hint (see [`Store::batch_get_hinted`]).
    ///
    /// # Safety
    /// As [`Store::batch_get_raw`].
    pub unsafe fn batch_get_raw_hinted<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
        holder: Option<&str>,
    ) -> Result<Vec<bool>, StoreError> {
        let hint = holder
            .map(|h| {
                peercache_wire::NodeId::new(h)
                    .map_err(|e| StoreError::BadRequest(format!("hint {h:?}: {e}")))
            })
            .transpose()?;
        let pkeys = self.page_keys(keys);
        // SAFETY: forwarded from the caller.
        let mut dest = unsafe { PageDest::new(pkeys.len(), segs, counts) }?;
        let r = self
            .inner
            .read_wing()
            .get_pages_hinted(&pkeys, &mut dest, hint.as_ref())?;
        Ok(r.into_iter().map(|v| v.is_some()).collect())
    }

    /// Reads pages scattered into segments (`counts[i]` segments for page `i`).
    pub fn batch_get_segments<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &mut [&mut [u8]],
        counts: &[usize],
    ) -> Result<Vec<bool>, StoreError> {
        let raw = RawSeg::of_mut(segs);
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
        // SAFETY: forwarded from the caller.
        unsafe { self.batch_get_raw_hinted(keys, segs, counts, None) }
    }

    /// Like [`Store::batch_get`], but reports each page's valid length (`None` = miss): a
    /// partial tail page (see [`Store::batch_set_partial`]) is served whole, and its valid
    /// length says how many leading bytes hold data.
    pub fn batch_get_valid<K: AsRef<str>>(
        &self,
        keys: &[K],
        pages: &mut [&mut [u8]],
    ) -> Result<Vec<Option<u32>>, StoreError> {
        let counts = vec![1; pages.len()];
        let raw = RawSeg::of_mut(pages);
        // SAFETY: the pages are exclusively borrowed for the whole call.
        unsafe { self.batch_get_valid_raw(keys, &raw, &counts) }
    }

    /// [`Store::batch_get_valid`] for pages scattered into raw segments (`counts[i]` for page
    /// `i`); the valid length counts bytes over all of a page's segments.
    ///
    /// # Safety
    /// As [`Store::batch_get_raw`].
    pub unsafe fn batch_get_valid_raw<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
    ) -> Result<Vec<Option<u32>>, StoreError> {
        let pkeys = self.page_keys(keys);
        // SAFETY: forwarded from the caller.
        let mut dest = unsafe { PageDest::new(pkeys.len(), segs, counts) }?;
        self.inner.read_wing().get_pages(&pkeys, &mut dest)
    }

    /// Looks keys up in the directory without reading them (diagnostics and tests).
    pub fn locate<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<Option<Owners>>, StoreError> {
        self.inner.read_wing().locate(&self.page_keys(keys))
    }

    /// Where a request's prefix is: for the page keys of one request, in order, every node
    /// that holds the first page with the length of the leading run it holds (and of the part
    /// in memory), longest first — one directory fan-out. What a cache-aware router asks to
    /// send the request where its KV already is.
    pub fn prefix_locations<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> Result<Vec<crate::PrefixRun>, StoreError> {
        self.inner
            .read_wing()
            .prefix_locations(&self.page_keys(keys))
    }
}

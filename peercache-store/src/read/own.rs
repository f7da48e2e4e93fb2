//! This node's own pool beside the directory: a read or an `exists` answers the pages the
//! node holds in memory itself without the directory when asking it would cost a round trip,
//! and falls back to the pool for the pages the directory does not name.
//!
//! The pool is the authority on its own pages (a page is in it, in this node's layout, or it is
//! not); the directory is how *other* nodes find them. Asking the pool first saves the
//! directory's round trip for a batch of the node's own pages — the common case of an engine
//! reading back what it offloaded, or of a request routed to the node that holds its prefix.
//! Where this node's shard holds every entry (no more members than replicas) a lookup costs no
//! round trip and the directory goes first; the pool is then asked only about the pages it
//! does not name. Either way a node's own pages stay readable while the directory cannot name
//! them: a shard over its entry cap, a lookup past its deadline, a membership change whose
//! hand-off is still in flight.

use std::borrow::Cow;

use peercache_directory::Owners;
use peercache_wire::PageKey;

use crate::read::dest::PageDest;
use crate::read::local_copy::{LeasedPage, serve_leased};
use crate::read::plan::ReadPlan;
use crate::read::wing::ReadWing;

/// Per key: this node's own copy's valid length (when its pool holds the page) and the
/// owners the directory named (`None` when it named none, was not asked, or failed).
pub(crate) struct Presence {
    pub(crate) own: Vec<Option<u32>>,
    pub(crate) owners: Vec<Option<Owners>>,
}

impl Presence {
    /// Whether page `i` is present for this node: its own copy, or a copy in its layout the
    /// directory named.
    pub(crate) fn present(&self, i: usize) -> bool {
        self.own[i].is_some() || self.owners[i].as_ref().is_some_and(|o| !o.is_empty())
    }

    /// Page `i`'s valid length: its own copy's, else the best copy the directory named.
    pub(crate) fn valid_len(&self, i: usize) -> Option<u32> {
        self.own[i].or_else(|| {
            self.owners[i]
                .as_ref()
                .and_then(|o| o.first())
                .map(|l| l.valid_len)
        })
    }
}

impl ReadWing<'_> {
    /// Whether a read asks this node's pool before the directory: when a lookup would cost a
    /// round trip (this node's shard does not hold every entry).
    pub(crate) fn own_pool_first(&self) -> bool {
        !self.home.dir.holds_every_entry()
    }

    /// Serves from this node's pool the pages `idx` (increasing indices into `keys`) it holds
    /// in memory in this node's layout with the length asked: leased under one lock, copied
    /// under the leases (side by side for a large batch), each verified by its seqlock, and
    /// marked served in `plan`. Returns the bytes served.
    pub(crate) fn read_own(
        &self,
        keys: &[PageKey],
        idx: &[usize],
        dest: &mut PageDest<'_>,
        plan: &mut ReadPlan<'_>,
    ) -> u64 {
        if idx.is_empty() {
            return 0;
        }
        let asked: Cow<'_, [PageKey]> = if idx.len() == keys.len() {
            Cow::Borrowed(keys)
        } else {
            Cow::Owned(idx.iter().map(|&i| keys[i]).collect())
        };
        let leases = self.home.pool.lease_batch(&asked);
        let layout = self.layout;
        let lens = dest.lens();
        let jobs: Vec<LeasedPage<'_, '_>> = idx
            .iter()
            .enumerate()
            .filter_map(|(at, &i)| {
                let loc = leases.location(at)?;
                // Another layout's copy, or a length the caller did not ask for: the
                // directory path decides (and counts) what such a page is.
                (loc.layout == layout && u64::from(loc.len) == lens[i]).then_some(LeasedPage {
                    i,
                    leases: &leases,
                    at,
                    valid_len: loc.valid_len,
                })
            })
            .collect();
        if jobs.is_empty() {
            return 0;
        }
        let (bytes, hits) = serve_leased(self.home.pool, keys, &jobs, dest, plan);
        self.home.metrics.read_local_hits.add(hits);
        bytes
    }

    /// Which of `keys` are present for this node and where: its own pool first when a lookup
    /// would cost a round trip (then the directory is asked only about the rest, and not at
    /// all when the pool holds every page), else the directory first and the pool only for
    /// the pages it does not name. Copies of another layout are dropped from the owners.
    pub(crate) fn presence_of(&self, keys: &[PageKey]) -> Presence {
        if self.own_pool_first() {
            let own = self.own_valid_lens(keys);
            let owners = self.owners_of_the_rest(keys, &own);
            return Presence { own, owners };
        }
        let owners = self
            .lookup_my_layout(keys)
            .unwrap_or_else(|| vec![None; keys.len()]);
        let mut own = vec![None; keys.len()];
        let unnamed: Vec<usize> = (0..keys.len()).filter(|&i| owners[i].is_none()).collect();
        if !unnamed.is_empty() {
            let ask: Vec<PageKey> = unnamed.iter().map(|&i| keys[i]).collect();
            for (&i, l) in unnamed.iter().zip(self.own_valid_lens(&ask)) {
                own[i] = l;
            }
        }
        Presence { own, owners }
    }

    /// Per key: the valid length of this node's own copy, when its pool holds the page in
    /// memory in this node's layout (one pool lock for the batch; counts as a use of each
    /// page held).
    fn own_valid_lens(&self, keys: &[PageKey]) -> Vec<Option<u32>> {
        let mut found = Vec::with_capacity(keys.len());
        self.home.pool.lookup_batch(keys, &mut found);
        let layout = self.layout;
        found
            .into_iter()
            .map(|l| l.filter(|l| l.layout == layout).map(|l| l.valid_len))
            .collect()
    }

    /// Drops from `found` the copies of another layout than this node's (the directory keeps
    /// each owner's layout fingerprint): reading them would only be refused by the slot-header
    /// check. Returns how many keys had copies, all of another layout — now misses. One compare
    /// per copy when every copy is of this node's layout.
    pub(crate) fn keep_my_layout(&self, found: &mut [Option<Owners>]) -> usize {
        let layout = self.layout;
        let mut refused = 0;
        for o in found.iter_mut() {
            let Some(owners) = o else { continue };
            if owners.iter().all(|l| l.layout == layout) {
                continue;
            }
            owners.retain(|l| l.layout == layout);
            if owners.is_empty() {
                *o = None;
                refused += 1;
            }
        }
        refused
    }

    /// The directory's owners of `keys`, copies of another layout dropped (a get counts them
    /// as layout mismatches); `None` when the lookup failed.
    fn lookup_my_layout(&self, keys: &[PageKey]) -> Option<Vec<Option<Owners>>> {
        let mut got = self.home.dir.lookup(keys).ok()?;
        self.keep_my_layout(&mut got);
        Some(got)
    }

    /// The directory's owners of the pages of `keys` that `own` does not hold; `None` for
    /// this node's own pages, and for every other page when the lookup failed. One fan-out
    /// for the rest, none when the node holds every page.
    fn owners_of_the_rest(&self, keys: &[PageKey], own: &[Option<u32>]) -> Vec<Option<Owners>> {
        let held = own.iter().filter(|l| l.is_some()).count();
        self.home.metrics.lookups_saved.add(held as u64);
        if held == keys.len() {
            return vec![None; keys.len()];
        }
        if held == 0 {
            return self
                .lookup_my_layout(keys)
                .unwrap_or_else(|| vec![None; keys.len()]);
        }
        let need: Vec<usize> = (0..keys.len()).filter(|&i| own[i].is_none()).collect();
        let ask: Vec<PageKey> = need.iter().map(|&i| keys[i]).collect();
        let mut found = vec![None; keys.len()];
        for (&i, o) in need
            .iter()
            .zip(self.lookup_my_layout(&ask).into_iter().flatten())
        {
            found[i] = o;
        }
        found
    }
}

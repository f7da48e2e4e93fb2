//! Router hints on the read path. A read whose hint names the node that holds its KV (a
//! router's `kv_transfer_params`) asks that node where its pool holds the pages, one RPC per
//! 4096 keys, instead of the directory shards. What the node does not hold goes to the
//! directory as always, so a wrong or stale hint costs one round trip, never a page. A hint is
//! never trusted for correctness: the pages it locates are read and verified like any other.

use peercache_directory::Location;
use peercache_wire::envelope;
use peercache_wire::rpc;
use peercache_wire::{NodeId, PageKey};

use crate::control::{MAX_PROMOTE_KEYS, StoreReply, StoreRequest};
use crate::read::plan::ReadPlan;
use crate::read::wing::ReadWing;

impl ReadWing<'_> {
    /// Owners of the keys `need` indexes, from the node `hint` names; returns the indices it
    /// did not locate (for the directory). Counts each page once: located by the hint, or
    /// missed by it.
    pub(crate) fn owners_from_hint(
        &self,
        hint: &NodeId,
        keys: &[PageKey],
        need: Vec<usize>,
        plan: &mut ReadPlan<'_>,
    ) -> Vec<usize> {
        let ks: Vec<PageKey> = need.iter().map(|&i| keys[i]).collect();
        let mut rest = Vec::new();
        for (&i, l) in need.iter().zip(self.located_by(hint, &ks)) {
            match l {
                Some(l) => plan.set_owners(i, Some(smallvec::smallvec![l])),
                None => rest.push(i),
            }
        }
        let m = &self.home.metrics;
        m.read_hint_hits.add((need.len() - rest.len()) as u64);
        m.read_hint_misses.add(rest.len() as u64);
        rest
    }

    /// How many leading keys are present, asking the node `hint` names first: the run it holds
    /// in its pool ends the answer when it covers every key (no directory request); past it,
    /// the directory is asked about the rest as [`ReadWing::exists_impl`] does. Counted like the
    /// hinted read: each key the hinted node located is a hit, each other key a miss. The
    /// located run is primed for the get that follows, as the directory's answer would be.
    pub(crate) fn exists_hinted(&self, keys: &[PageKey], hint: &NodeId) -> usize {
        if self.slots.is_some() || keys.is_empty() {
            return self.exists_impl(keys);
        }
        let found = self.located_by(hint, keys);
        let held = found.iter().take_while(|l| l.is_some()).count();
        let m = &self.home.metrics;
        m.read_hint_hits.add(held as u64);
        m.read_hint_misses.add((keys.len() - held) as u64);
        m.exists_pages_found.add(held as u64);
        // Primed like the directory's answer: a get on this node that follows skips the lookup.
        let ttl = std::time::Duration::from_secs_f64(self.cfg.exists_prime_ttl);
        if !ttl.is_zero() && held > 0 {
            let now = std::time::Instant::now();
            let mut primed = self.reads.primed.lock();
            for (k, l) in keys.iter().zip(found).take(held) {
                if let Some(l) = l {
                    primed.put(*k, smallvec::smallvec![l], ttl, now);
                }
            }
        }
        if held == keys.len() {
            m.exists_requests.add(1);
            return held;
        }
        // One exists request, counted there.
        held + self.exists_impl(&keys[held..])
    }

    /// Per key, the copy the node `hint` names holds in its pool in this node's layout (None:
    /// not held there, another layout, or no answer) — this node's own pool when it is the one
    /// named, else one `Locate` on that node.
    fn located_by(&self, hint: &NodeId, keys: &[PageKey]) -> Vec<Option<Location>> {
        let found = if hint == self.me {
            self.resident_locations(keys)
        } else {
            self.ask_locate(hint, keys)
        };
        let layout = self.layout;
        found
            .into_iter()
            .map(|l| l.filter(|l| l.node == *hint && l.layout == layout))
            .collect()
    }

    /// `Locate` on `node`'s control port, every chunk in flight at once, bounded by
    /// `op_timeout`: per key its resident copy there (None: not held, or no answer).
    fn ask_locate(&self, node: &NodeId, keys: &[PageKey]) -> Vec<Option<Location>> {
        let mut out = vec![None; keys.len()];
        let Some(ep) = self.home.dir.control_of(node) else {
            return out;
        };
        let frames: Vec<Vec<u8>> = keys
            .chunks(MAX_PROMOTE_KEYS)
            .filter_map(|c| envelope::encode(&StoreRequest::Locate(c.to_vec()), &[]).ok())
            .collect();
        if frames.len() != keys.len().div_ceil(MAX_PROMOTE_KEYS) {
            return out;
        }
        let calls: Vec<_> = frames.iter().map(|f| (ep, f.as_slice())).collect();
        let replies = self.home.dir.rpc().call_many(&calls, self.cfg.op_timeout());
        for (c, r) in replies.into_iter().enumerate() {
            let at = c * MAX_PROMOTE_KEYS;
            let want = (keys.len() - at).min(MAX_PROMOTE_KEYS);
            if let Ok(StoreReply::Located(locs)) = r.and_then(|f| rpc::decode_reply(&f))
                && locs.len() == want
            {
                for (j, l) in locs.into_iter().enumerate() {
                    out[at + j] = l;
                }
            }
        }
        out
    }
}

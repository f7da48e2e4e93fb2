//! What a node does to resident pages besides writing and reading them: refreshing recency,
//! demoting to reclaimable, listing them for a directory re-announce, and removing them.

use peercache_wire::PageKey;

use super::{Evicted, PageLocation, Pool, ReplClass};
use crate::state::SlotState;

impl Pool {
    /// Refreshes recency of resident pages (cache hits served elsewhere).
    pub fn touch(&self, keys: &[PageKey]) {
        let mut st = self.state.lock();
        for k in keys {
            if let Some(&r) = st.index.get(&k.0) {
                st.refresh(r);
            }
        }
    }

    /// Demotes resident retained pages to reclaimable. Returns how many moved.
    pub fn mark_reclaimable(&self, keys: &[PageKey]) -> usize {
        let mut st = self.state.lock();
        let mut n = 0;
        for k in keys {
            if let Some(&r) = st.index.get(&k.0) {
                n += st.demote(r) as usize;
            }
        }
        self.publish_gauges(&st);
        n
    }

    /// Appends every live page and its location to `out` (one pass under the state lock) — for
    /// re-announcing this pool's pages to the directory after a ring change.
    pub fn live_pages(&self, out: &mut Vec<(PageKey, PageLocation)>) {
        let st = self.state.lock();
        out.reserve(st.index.len());
        for (&k, &r) in st.index.iter() {
            if st.meta(r).state == SlotState::Live {
                out.push((PageKey(k), self.location(&st, r)));
            }
        }
    }

    /// Removes pages (only of the given generation, when given). Leased pages stay.
    pub fn remove_batch(&self, keys: &[(PageKey, Option<u64>)]) -> usize {
        let mut st = self.state.lock();
        let n = keys.iter().filter(|(k, g)| st.remove(*k, *g)).count();
        self.publish_gauges(&st);
        n
    }

    /// Removes every unleased page; returns them (for the caller to tell the directory).
    pub fn clear(&self) -> Vec<Evicted> {
        let mut st = self.state.lock();
        let keys: Vec<(PageKey, u64, ReplClass)> = st
            .index
            .values()
            .map(|&r| {
                let m = st.meta(r);
                (m.key, m.generation, m.repl)
            })
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for (key, generation, class) in keys {
            if st.remove(key, Some(generation)) {
                out.push(Evicted {
                    key,
                    generation,
                    class,
                });
            }
        }
        self.publish_gauges(&st);
        out
    }
}

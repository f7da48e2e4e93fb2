//! `exists` on the [`ReadWing`]: which leading pages are present (this node's own pool first,
//! then the directory — other pools and disk tiers — or the slot regions), priming the owners
//! the directory named for the get that follows.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peercache_wire::{NodeId, PageKey};

use crate::StoreError;
use crate::read::wing::ReadWing;

impl ReadWing<'_> {
    /// Which of `keys` are present, each on its own (not only the leading ones); records the
    /// latency.
    pub(crate) fn contains(&self, keys: &[PageKey]) -> Result<Vec<bool>, StoreError> {
        self.check_open()?;
        let t0 = std::time::Instant::now();
        let r = self.presence(keys, false);
        self.home
            .metrics
            .exists_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }

    pub(crate) fn wait_impl(&self, keys: &[PageKey], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            let n = self.exists_impl(keys);
            let now = Instant::now();
            if n == keys.len() || now >= deadline || self.stopping.load(Ordering::Acquire) {
                return n;
            }
            std::thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// The valid length of each leading present page: this node's own copies as its pool
    /// holds them, the others as the directory names them (no priming, no promotion).
    pub(crate) fn leading_valid_lens(&self, keys: &[PageKey]) -> Vec<u32> {
        let p = self.presence_of(keys);
        (0..keys.len()).map_while(|i| p.valid_len(i)).collect()
    }

    pub(crate) fn exists_impl(&self, keys: &[PageKey]) -> usize {
        self.presence(keys, true).len()
    }

    /// Presence of each key; with `leading` the vector stops at the first missing key.
    pub(crate) fn presence(&self, keys: &[PageKey], leading: bool) -> Vec<bool> {
        self.home.metrics.exists_requests.add(1);
        if let Some(slots) = &self.slots {
            let mut p = slots.contains(keys);
            if leading {
                let n = p.iter().take_while(|p| **p).count();
                p.truncate(n);
            }
            self.home
                .metrics
                .exists_pages_found
                .add(p.iter().filter(|p| **p).count() as u64);
            return p;
        }
        // This node's own pool and the directory, the cheaper first (`read/own.rs`).
        let p = self.presence_of(keys);
        let mut present: Vec<bool> = (0..keys.len()).map(|i| p.present(i)).collect();
        let found = p.owners;
        if leading {
            let n = present.iter().take_while(|p| **p).count();
            present.truncate(n);
        }
        let n = present.len();
        // Present only on some disk tier: start promoting now, so the get that follows finds
        // the pages in memory.
        if let Some(p) = self.home.tasks.promoter.get() {
            // At most half a pool's worth, so a long prefix cannot thrash the pool.
            let mut budget = self.home.pool.len() as u64 / 2;
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
                if queued >= crate::tasks::promoter::MAX_KEYS || need > budget {
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
        let ttl = Duration::from_secs_f64(self.cfg.exists_prime_ttl);
        if !ttl.is_zero() && n > 0 {
            let now = Instant::now();
            let mut primed = self.reads.primed.lock();
            for (k, o) in keys.iter().zip(found).take(n) {
                if let Some(o) = o.filter(|o| !o.is_empty()) {
                    primed.put(*k, o, ttl, now);
                }
            }
        }
        self.home
            .metrics
            .exists_pages_found
            .add(present.iter().filter(|p| **p).count() as u64);
        present
    }
}

//! Short-lived location maps: the exists → get hand-off (locations found by `batch_exists`,
//! consumed by the next `batch_get`) and the optional directory read cache
//! (`directory_read_cache_ttl`), which is safe by construction — a cached location whose slot
//! was reused fails verification, counts as a miss and is dropped from the cache.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use peercache_directory::Owners;
use peercache_wire::PageKey;

/// Swept of expired entries once it holds more than this.
const SWEEP_ABOVE: usize = 65_536;

/// Short-lived owners by key.
#[derive(Debug, Default)]
pub(crate) struct PrimeMap {
    map: HashMap<PageKey, (Instant, Owners)>,
}

impl PrimeMap {
    /// Primes `owners` for `ttl`.
    pub(crate) fn put(&mut self, key: PageKey, owners: Owners, ttl: Duration, now: Instant) {
        if self.map.len() > SWEEP_ABOVE {
            self.map.retain(|_, (t, _)| *t > now);
        }
        self.map.insert(key, (now + ttl, owners));
    }

    /// Takes the primed owners of `key`, if still valid.
    pub(crate) fn take(&mut self, key: PageKey, now: Instant) -> Option<Owners> {
        match self.map.remove(&key) {
            Some((t, o)) if t > now => Some(o),
            _ => None,
        }
    }

    /// The owners of `key` without consuming them, if still valid.
    pub(crate) fn get(&self, key: PageKey, now: Instant) -> Option<Owners> {
        match self.map.get(&key) {
            Some((t, o)) if *t > now => Some(o.clone()),
            _ => None,
        }
    }

    /// Forgets `key`.
    pub(crate) fn remove(&mut self, key: PageKey) {
        self.map.remove(&key);
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

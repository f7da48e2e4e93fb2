//! A shard's side of a paced hand-off: whether it is still receiving the ranges the last ring
//! change gave it, and for a key it misses meanwhile, who held it before.
//!
//! A ring change makes this shard an owner of ranges other members held. Their entries arrive
//! by hand-off, paced, so for a while a lookup here misses keys that exist. Instead of a miss
//! the reader is told where to ask ([`crate::msg::EXT_MOVING`]): the first owner of the key on
//! the previous ring that is still a member — the one member that hands it off, and keeps it
//! until its hand-off is done. The shard counts itself as receiving during `grace` after the
//! change (senders learn of a change at slightly different times) and then for as long as a
//! sender that is still a member announced more entries ([`crate::msg::EXT_HANDOFF_MORE`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use peercache_wire::{NodeId, PageKey};

use crate::admission::Holders;
use crate::msg::Moving;

/// The receive state of one shard.
#[derive(Debug)]
pub(crate) struct Receiving {
    /// This shard's node (None until a directory client configured it: no hints).
    me: Option<NodeId>,
    grace: Duration,
    /// When the ring last changed.
    since: Option<Instant>,
    /// Senders of the current change and how many entries each still announced.
    more: HashMap<NodeId, u64>,
}

impl Default for Receiving {
    fn default() -> Self {
        Receiving {
            me: None,
            grace: Duration::from_secs(5),
            since: None,
            more: HashMap::new(),
        }
    }
}

impl Receiving {
    /// Names this shard's node and the time senders get to announce their hand-off.
    pub(crate) fn configure(&mut self, me: NodeId, grace: Duration) {
        self.me = Some(me);
        self.grace = grace;
    }

    /// A ring change: a new hand-off begins; what senders announced for the last one is moot.
    pub(crate) fn ring_changed(&mut self, now: Instant) {
        self.since = Some(now);
        self.more.clear();
    }

    /// `sender` will hand `more` further entries after the request that said so.
    pub(crate) fn announced(&mut self, sender: &NodeId, more: u64) {
        if more == 0 {
            self.more.remove(sender);
        } else {
            self.more.insert(sender.clone(), more);
        }
    }

    /// Whether the last ring change's hand-off is surely over (past the grace and no sender
    /// announced more): the cheap check before any other work.
    pub(crate) fn idle(&self, now: Instant) -> bool {
        self.more.is_empty()
            && self
                .since
                .is_none_or(|since| now.duration_since(since) >= self.grace)
    }

    /// Whether the hand-off of the last ring change may still bring entries.
    pub(crate) fn open(&self, holders: &Holders, now: Instant) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        now.duration_since(since) < self.grace
            || self
                .more
                .keys()
                .any(|sender| holders.current.contains(sender))
    }

    /// For each missed key (`missed` yields (index in the request, key)) that this shard gained
    /// in the last ring change, the member that held it before and hands it off. Empty when
    /// the hand-off is over.
    pub(crate) fn hints(
        &self,
        holders: &Holders,
        now: Instant,
        missed: impl Iterator<Item = (u32, PageKey)>,
    ) -> Moving {
        let mut out = Moving::default();
        let Some(me) = &self.me else { return out };
        if !self.open(holders, now) || holders.previous.is_empty() {
            return out;
        }
        let replicas = holders.replicas.max(1);
        let mut idx = Vec::with_capacity(replicas);
        for (i, key) in missed {
            holders.previous.owner_indices(key, replicas, &mut idx);
            let before = idx.iter().map(|&m| holders.previous.member(m));
            if before.clone().any(|n| n == me) {
                // This shard held the key before the change: a miss here is a miss.
                continue;
            }
            if let Some(sender) = before
                .clone()
                .find(|n| holders.current.contains(n))
                .cloned()
            {
                out.keys.push((i, sender));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Ring;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    fn holders(prev: &[&str], cur: &[&str]) -> Holders {
        Holders {
            previous: Ring::new(prev.iter().map(|s| id(s)), 64),
            current: Ring::new(cur.iter().map(|s| id(s)), 64),
            replicas: 1,
        }
    }

    #[test]
    fn a_newcomer_names_the_previous_holder_until_every_sender_is_done() {
        let h = holders(&["a", "b"], &["a", "b", "c"]);
        let mut r = Receiving::default();
        r.configure(id("c"), Duration::from_millis(10));
        let t0 = Instant::now();
        r.ring_changed(t0);
        // Keys c gained: their previous owner is a or b, and that one is named.
        let keys: Vec<(u32, PageKey)> = (0..2000u32)
            .map(|i| (i, PageKey::from_key(&format!("k{i}"))))
            .filter(|(_, k)| {
                let mut idx = Vec::new();
                h.current.owner_indices(*k, 1, &mut idx);
                h.current.member(idx[0]) == &id("c")
            })
            .collect();
        assert!(keys.len() > 300, "c owns about a third of the keys");
        let got = r.hints(&h, t0, keys.iter().copied());
        assert_eq!(got.keys.len(), keys.len());
        for ((i, k), (j, sender)) in keys.iter().zip(&got.keys) {
            let mut idx = Vec::new();
            h.previous.owner_indices(*k, 1, &mut idx);
            assert_eq!(i, j);
            assert_eq!(sender, h.previous.member(idx[0]));
        }
        // Past the grace with a sender still announcing more: still open.
        r.announced(&id("a"), 500);
        let later = t0 + Duration::from_millis(50);
        assert!(r.open(&h, later));
        assert_eq!(
            r.hints(&h, later, keys.iter().copied()).keys.len(),
            keys.len()
        );
        // The sender finished: closed, no hints.
        r.announced(&id("a"), 0);
        assert!(!r.open(&h, later));
        assert!(r.hints(&h, later, keys.iter().copied()).keys.is_empty());
        // A sender that left the ring mid-hand-off does not keep it open.
        r.announced(&id("z"), 9);
        assert!(!r.open(&h, later));
    }

    #[test]
    fn keys_the_shard_held_before_and_unconfigured_shards_get_no_hints() {
        let h = holders(&["a", "c"], &["a", "c"]);
        let mut r = Receiving::default();
        let t0 = Instant::now();
        r.ring_changed(t0);
        let keys = (0..100u32).map(|i| (i, PageKey::from_key(&format!("k{i}"))));
        assert!(
            r.hints(&h, t0, keys.clone()).keys.is_empty(),
            "no node: no hints"
        );
        r.configure(id("c"), Duration::from_secs(1));
        let got = r.hints(&h, t0, keys);
        assert!(
            got.keys.iter().all(|(_, n)| n == &id("a")),
            "only keys a held before are moving to c: {got:?}"
        );
    }
}

//! A shard's side of a paced hand-off: whether it is still receiving the ranges the last ring
//! change gave it, and for a key it misses meanwhile, who held it before.
//!
//! A ring change makes this shard an owner of ranges other members held. Their entries arrive
//! by hand-off, paced, so for a while a lookup here misses keys that exist. Instead of a miss
//! the reader is told where to ask ([`crate::msg::EXT_MOVING`]): the first owner of the key on
//! the previous ring that is still a member — the one member that hands it off, and keeps it
//! until its hand-off is done.
//!
//! How long the shard counts as receiving: during `grace` after the change (senders learn of
//! a change at slightly different times), then for as long as a sender that is still a member
//! announced more entries ([`crate::msg::EXT_HANDOFF_MORE`]). A shard new to the ring gains
//! from every earlier member, and each of them says when it is done (its last chunk, or an
//! empty one when it had nothing for the newcomer), so a newcomer also waits for every earlier
//! member that has not said so yet — at most [`SENDER_WAIT`] (or `grace`, if longer), in case
//! one never does (a release before these announcements, or a word lost before the newcomer
//! had a ring). One sender finishing before another started is then no reason to stop.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use peercache_wire::{NodeId, PageKey};

use crate::admission::Holders;
use crate::msg::Moving;

/// Longest a shard new to the ring waits for an earlier member to say its hand-off is done
/// (when `handoff_grace` is shorter).
pub const SENDER_WAIT: Duration = Duration::from_secs(10);

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
    /// Earlier members a newcomer has not heard "done" from (empty for a shard that was a
    /// member before the change).
    expected: HashSet<NodeId>,
    /// Senders that said they are done since the last change.
    done: HashSet<NodeId>,
}

impl Default for Receiving {
    fn default() -> Self {
        Receiving {
            me: None,
            grace: Duration::from_secs(5),
            since: None,
            more: HashMap::new(),
            expected: HashSet::new(),
            done: HashSet::new(),
        }
    }
}

impl Receiving {
    /// Names this shard's node and the time senders get to announce their hand-off.
    pub(crate) fn configure(&mut self, me: NodeId, grace: Duration) {
        self.me = Some(me);
        self.grace = grace;
    }

    /// A ring change to `holders`: a new hand-off begins; what senders announced for the last
    /// one is moot — unless this is the shard's `first` ring, whose senders may have spoken
    /// before it arrived.
    pub(crate) fn ring_changed(&mut self, holders: &Holders, first: bool, now: Instant) {
        self.since = Some(now);
        if !first {
            self.more.clear();
            self.done.clear();
        }
        self.expected.clear();
        if let Some(me) = &self.me
            && !holders.previous.contains(me)
        {
            self.expected.extend(
                holders
                    .previous
                    .members()
                    .iter()
                    .filter(|n| *n != me && holders.current.contains(n) && !self.done.contains(*n))
                    .cloned(),
            );
        }
    }

    /// `sender` will hand `more` further entries after the request that said so.
    pub(crate) fn announced(&mut self, sender: &NodeId, more: u64) {
        if more == 0 {
            self.more.remove(sender);
            self.expected.remove(sender);
            self.done.insert(sender.clone());
        } else {
            self.more.insert(sender.clone(), more);
        }
    }

    /// Whether the last ring change's hand-off is surely over (past the grace, no sender
    /// announced more, none is awaited): the cheap check before any other work.
    pub(crate) fn idle(&self, now: Instant) -> bool {
        self.more.is_empty()
            && self.since.is_none_or(|since| {
                let waited = now.duration_since(since);
                waited >= self.grace && (self.expected.is_empty() || waited >= self.wait())
            })
    }

    /// How long a newcomer waits for an earlier member's word.
    fn wait(&self) -> Duration {
        self.grace.max(SENDER_WAIT)
    }

    /// Whether the hand-off of the last ring change may still bring entries.
    pub(crate) fn open(&self, holders: &Holders, now: Instant) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        let waited = now.duration_since(since);
        let live = |sender: &NodeId| holders.current.contains(sender);
        waited < self.grace
            || self.more.keys().any(live)
            || (waited < self.wait() && self.expected.iter().any(live))
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
        r.ring_changed(&h, false, t0);
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
        // One sender finished; the other has not said a word yet: still open (it may have
        // learned of the change later), and not idle.
        r.announced(&id("a"), 0);
        assert!(r.open(&h, later));
        assert!(!r.idle(later));
        // Both finished: closed, no hints, idle.
        r.announced(&id("b"), 0);
        assert!(!r.open(&h, later));
        assert!(r.idle(later));
        assert!(r.hints(&h, later, keys.iter().copied()).keys.is_empty());
        // A sender that left the ring mid-hand-off does not keep it open.
        r.announced(&id("z"), 9);
        assert!(!r.open(&h, later));
    }

    #[test]
    fn a_newcomer_stops_waiting_for_a_silent_member_after_the_sender_wait() {
        let h = holders(&["a", "b"], &["a", "b", "c"]);
        let mut r = Receiving::default();
        r.configure(id("c"), Duration::from_millis(10));
        let t0 = Instant::now();
        r.ring_changed(&h, false, t0);
        r.announced(&id("a"), 0);
        assert!(r.open(&h, t0 + SENDER_WAIT - Duration::from_millis(1)));
        assert!(!r.open(&h, t0 + SENDER_WAIT));
        assert!(r.idle(t0 + SENDER_WAIT));
        // A silent member that left is not waited for at all.
        let gone = holders(&["a", "b"], &["a", "c"]);
        r.ring_changed(&gone, false, t0);
        r.announced(&id("a"), 0);
        assert!(!r.open(&gone, t0 + Duration::from_millis(20)));
    }

    #[test]
    fn a_member_that_gains_ranges_waits_only_for_the_grace_and_announced_senders() {
        // b leaves: a gains b's ranges; a was a member before, so it does not wait for c.
        let h = holders(&["a", "b", "c"], &["a", "c"]);
        let mut r = Receiving::default();
        r.configure(id("a"), Duration::from_millis(10));
        let t0 = Instant::now();
        r.ring_changed(&h, false, t0);
        assert!(r.open(&h, t0));
        assert!(!r.open(&h, t0 + Duration::from_millis(20)));
        r.announced(&id("c"), 5);
        assert!(r.open(&h, t0 + Duration::from_millis(20)));
    }

    #[test]
    fn a_first_ring_keeps_what_senders_said_before_it_arrived() {
        let h = holders(&["a", "b"], &["a", "b", "c"]);
        let mut r = Receiving::default();
        r.configure(id("c"), Duration::from_millis(10));
        // a and b were quicker than c's own ring.
        r.announced(&id("a"), 0);
        r.announced(&id("b"), 0);
        let t0 = Instant::now();
        r.ring_changed(&h, true, t0);
        assert!(!r.open(&h, t0 + Duration::from_millis(20)));
        // A later change forgets them: b must speak again.
        r.ring_changed(&h, false, t0);
        r.announced(&id("a"), 0);
        assert!(r.open(&h, t0 + Duration::from_millis(20)));
    }

    #[test]
    fn keys_the_shard_held_before_and_unconfigured_shards_get_no_hints() {
        let h = holders(&["a", "c"], &["a", "c"]);
        let mut r = Receiving::default();
        let t0 = Instant::now();
        r.ring_changed(&h, false, t0);
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

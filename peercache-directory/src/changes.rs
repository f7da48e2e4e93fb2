//! What a shard's entries gained and lost, for whoever republishes it (a node's KV-event
//! stream): while recording is on, the shard appends one [`Change`] per copy that appears in
//! it, goes from it or moves between memory and disk, to a bounded journal its reader drains.
//!
//! The journal is this shard's view: an entry handed off to another shard goes from this one
//! (and appears in the other), so a subscriber keeps each shard's copies apart and counts a
//! copy as listed while any shard lists it.
//!
//! Only copies of owners the shard counts live are its state (what a late subscriber is sent):
//! a copy written by a node before this shard saw it join appears in the journal when the node
//! is counted live, not when it was written. A going of a copy never told may be recorded (it
//! changes nothing for a subscriber).

use peercache_wire::{NodeId, PageKey};

/// Whether a copy appeared or went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// The copy is now listed (a new owner, or an owner's copy that moved to another tier).
    Stored,
    /// The copy is no longer listed here (removed, evicted from the directory, its owner
    /// gone, handed off to another shard, or it moved to another tier).
    Removed,
}

/// One copy of one page that appeared or went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The page.
    pub key: PageKey,
    /// The node holding (or that held) the copy.
    pub node: NodeId,
    /// In the owner's memory (true) or only on its disk tier.
    pub resident: bool,
    /// Appeared or went.
    pub kind: ChangeKind,
}

/// The shard's journal: at most `cap` changes between two drains; the rest are counted lost.
#[derive(Debug)]
pub(crate) struct Journal {
    changes: Vec<Change>,
    cap: usize,
    lost: u64,
}

impl Journal {
    pub(crate) fn new(cap: usize) -> Journal {
        Journal {
            changes: Vec::new(),
            cap: cap.max(1),
            lost: 0,
        }
    }

    pub(crate) fn note(&mut self, key: PageKey, node: &NodeId, resident: bool, kind: ChangeKind) {
        if self.changes.len() < self.cap {
            self.changes.push(Change {
                key,
                node: node.clone(),
                resident,
                kind,
            });
        } else {
            self.lost += 1;
        }
    }

    /// Moves the changes into `into` (appended, in order) and returns how many were lost to
    /// the cap since the last drain.
    pub(crate) fn drain(&mut self, into: &mut Vec<Change>) -> u64 {
        into.append(&mut self.changes);
        std::mem::take(&mut self.lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_cap_changes_are_counted_lost_and_a_drain_starts_over() {
        let mut j = Journal::new(2);
        let n = NodeId::new("a").unwrap();
        for k in 0..5u128 {
            j.note(PageKey(k), &n, true, ChangeKind::Stored);
        }
        let mut out = Vec::new();
        assert_eq!(j.drain(&mut out), 3);
        assert_eq!(out.iter().map(|c| c.key.0).collect::<Vec<_>>(), vec![0, 1]);
        j.note(PageKey(9), &n, false, ChangeKind::Removed);
        assert_eq!(j.drain(&mut out), 0);
        assert_eq!(out.len(), 3);
    }
}

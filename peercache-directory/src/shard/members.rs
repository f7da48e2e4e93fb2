//! The live member set: copies of owners that left or restarted are swept, owners that come
//! back are revived.

use std::collections::HashSet;

use peercache_wire::NodeId;

use crate::changes::ChangeKind;
use crate::owner_table::OwnerTable;

use super::Shard;
use super::entry::{Copy36, join};

impl Shard {
    /// Drops every copy for which `gone` holds, over the whole shard; empty entries go too.
    fn sweep(&mut self, mut gone: impl FnMut(&OwnerTable, &Copy36) -> bool) -> usize {
        let mut dropped = 0;
        let mut empty = Vec::new();
        let ids: Vec<u32> = self.index.iter().collect();
        for i in ids {
            let Shard {
                entries,
                owners,
                journal,
                ..
            } = self;
            let e = entries.get_mut(i);
            let key = join(e.key);
            let copies = &mut e.copies;
            let before = copies.len();
            copies.retain(|c| {
                let c = *c;
                if gone(owners, &c) {
                    if let Some(j) = journal.as_mut() {
                        j.note(
                            key,
                            &owners.get(c.id()).node,
                            c.resident(),
                            ChangeKind::Removed,
                        );
                    }
                    owners.release(c.id());
                    false
                } else {
                    true
                }
            });
            dropped += before - copies.len();
            if copies.is_empty() {
                empty.push(i);
            }
        }
        for i in empty {
            self.drop_entry(i);
        }
        self.stats.gc_locations += dropped as u64;
        dropped
    }

    /// Sets the live member set and drops every location whose owner is not in it. Copies
    /// of an owner that was not live and now is (written before this shard saw it join) are
    /// recorded as appearing: they were not part of the shard's state until now.
    pub fn set_live(&mut self, members: impl IntoIterator<Item = NodeId>) -> usize {
        let live: HashSet<NodeId> = members.into_iter().collect();
        let (dead, revived) = self.owners.set_live(&live);
        self.dead_records = dead;
        self.live = Some(live);
        if !revived.is_empty() && self.journal.is_some() {
            self.note_revived(&revived);
        }
        if self.dead_records == 0 {
            // Every copy names a live owner: nothing to collect.
            return 0;
        }
        let dropped = self.sweep(|owners, c| !owners.get(c.id()).live);
        self.dead_records = 0;
        dropped
    }

    /// Records every copy of the owner records `revived` as appearing.
    fn note_revived(&mut self, revived: &[u32]) {
        let Shard {
            index,
            entries,
            owners,
            journal,
            ..
        } = self;
        let Some(j) = journal.as_mut() else { return };
        for i in index.iter() {
            let e = entries.get(i);
            for c in &e.copies {
                if revived.contains(&c.id()) {
                    let r = owners.get(c.id());
                    j.note(join(e.key), &r.node, c.resident(), ChangeKind::Stored);
                }
            }
        }
    }

    /// Drops every location of `node` older than `incarnation` (a restarted node's old life).
    pub fn drop_incarnations_before(
        &mut self,
        node: &NodeId,
        incarnation: peercache_wire::Incarnation,
    ) -> usize {
        if !self.owners.has_other_incarnation(node, incarnation) {
            return 0;
        }
        self.sweep(|owners, c| {
            let r = owners.get(c.id());
            r.node == *node && r.incarnation != incarnation
        })
    }
}

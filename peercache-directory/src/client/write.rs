//! Writes to the directory: inserts (routed by the ring, or to the shards a caller names),
//! removals and the non-resident mark, each sent to every replica of its key.

use peercache_wire::{NodeId, PageKey};

use crate::DirError;
use crate::location::Location;
use crate::msg::{DirReply, DirRequest, OwnerRef};
use crate::shard::InsertOutcome;

use super::{Chunk, DirectoryClient};

impl DirectoryClient {
    /// Records locations on every replica owner. Returns, per entry, the primary's outcome
    /// (or a replica's when the primary failed); `None` if no owner took it.
    pub fn insert(
        &self,
        entries: &[(PageKey, Location)],
    ) -> Result<Vec<Option<InsertOutcome>>, DirError> {
        self.own("insert", entries.iter().map(|(_, l)| &l.node))?;
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut out: Vec<Option<InsertOutcome>> = vec![None; entries.len()];
        let mut from_primary = vec![false; entries.len()];
        let mut chunks = Vec::new();
        let mut ranks = Vec::new();
        for rank in 0..self.cfg.replicas {
            for c in self.group(&view, entries.iter().map(|e| e.0).enumerate(), rank, false) {
                chunks.push(c);
                ranks.push(rank);
            }
        }
        let replies = self.fan_out(&view, &chunks, |items| {
            DirRequest::Insert(
                items
                    .iter()
                    .map(|&i| entries[i].clone())
                    .collect::<Vec<_>>()
                    .into(),
            )
        });
        for (((_, items), rank), reply) in chunks.iter().zip(ranks).zip(replies) {
            if let Ok(DirReply::Inserted(v)) = reply {
                for (&i, oc) in items.iter().zip(v) {
                    if rank == 0 || (!from_primary[i] && out[i].is_none()) {
                        out[i] = Some(oc);
                        from_primary[i] = rank == 0;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Records entries on given owners only: `routes` lists, per node, indices into `entries`
    /// (split at the request size limit). Returns how many entries some node accepted. For an
    /// owner re-announcing its pages to the replicas a ring change added.
    pub fn insert_routed(
        &self,
        entries: &[(PageKey, Location)],
        routes: &[(NodeId, Vec<usize>)],
    ) -> usize {
        if self
            .own("insert", entries.iter().map(|(_, l)| &l.node))
            .is_err()
        {
            return 0;
        }
        let view = self.view();
        let chunks: Vec<Chunk> = routes
            .iter()
            .flat_map(|(node, idx)| {
                idx.chunks(self.cfg.max_keys_per_request.max(1))
                    .map(move |c| (node.clone(), c.to_vec()))
            })
            .collect();
        let replies = self.fan_out(&view, &chunks, |items| {
            DirRequest::Insert(
                items
                    .iter()
                    .map(|&i| entries[i].clone())
                    .collect::<Vec<_>>()
                    .into(),
            )
        });
        replies
            .into_iter()
            .filter_map(|r| match r {
                Ok(DirReply::Inserted(v)) => Some(v.len()),
                _ => None,
            })
            .sum()
    }

    fn to_replicas(&self, items: &[OwnerRef], mark: bool) -> Result<u32, DirError> {
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut chunks = Vec::new();
        for rank in 0..self.cfg.replicas {
            chunks.extend(self.group(&view, items.iter().map(|r| r.key).enumerate(), rank, false));
        }
        let replies = self.fan_out(&view, &chunks, |idx| {
            let v: Vec<OwnerRef> = idx.iter().map(|&i| items[i].clone()).collect();
            if mark {
                DirRequest::MarkNonResident(v.into())
            } else {
                DirRequest::Remove(v.into())
            }
        });
        Ok(replies
            .into_iter()
            .map(|r| match r {
                Ok(DirReply::Applied(n)) => n,
                _ => 0,
            })
            .sum())
    }

    /// Fails with [`DirError::NotYours`] unless every node named is this one.
    fn own<'n>(
        &self,
        action: &'static str,
        mut nodes: impl Iterator<Item = &'n NodeId>,
    ) -> Result<(), DirError> {
        match nodes.find(|n| **n != self.me) {
            None => Ok(()),
            Some(n) => Err(DirError::NotYours {
                action,
                target: n.clone(),
                me: self.me.clone(),
            }),
        }
    }

    /// Removes this node's copies on every replica (owner-conditional by generation).
    pub fn remove(&self, items: &[OwnerRef]) -> Result<u32, DirError> {
        self.own("remove", items.iter().map(|r| &r.node))?;
        self.to_replicas(items, false)
    }

    /// Marks this node's copies disk-only on every replica.
    pub fn mark_nonresident(&self, items: &[OwnerRef]) -> Result<u32, DirError> {
        self.own("mark", items.iter().map(|r| &r.node))?;
        self.to_replicas(items, true)
    }
}

//! Queries: lookup, holders and exists, each asked of a key's primary and retried on its
//! replicas (and, while a hand-off may be in flight, on every member) when it misses.

use std::cell::RefCell;
use std::collections::HashMap;

use peercache_wire::{NodeId, PageKey};
use smallvec::SmallVec;

use crate::DirError;
use crate::holding::{Holding, KeyHolders};
use crate::location::Owners;
use crate::msg::{DirReply, DirRequest};

use super::{Chunk, DirectoryClient, View};

impl DirectoryClient {
    /// Owners of each key, best first; misses and failures come back as `None`. Within
    /// `handoff_grace` of a ring change, a key no owner has is looked for on every member.
    pub fn lookup(&self, keys: &[PageKey]) -> Result<Vec<Option<Owners>>, DirError> {
        self.replica_query(
            keys,
            false,
            None,
            |items| DirRequest::Lookup(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Found(v) => Some(v),
                _ => None,
            },
            Option::is_some,
        )
    }

    /// Which nodes hold each key and whether in memory, without the locations: the compact
    /// form of [`Self::lookup`] a router's prefix query needs (a few bytes per key on the wire
    /// instead of a location per copy). Same replicas, fallbacks and hand-off grace as
    /// [`Self::lookup`]; a shard of a release before holders answers with full owners, which
    /// are folded here. A key nobody holds (or whose shards failed) is empty.
    pub fn holders(&self, keys: &[PageKey]) -> Result<Vec<Holding>, DirError> {
        self.key_holders(keys)?
            .into_holdings(keys.len())
            .map_err(DirError::Wire)
    }

    /// [`Self::holders`] as one [`KeyHolders`] in `keys`' order: every shard's answer merged
    /// under one node table, each copy a small index into it — no per-key allocation and no
    /// node id cloned per copy, the form a prefix query walks. A shard's reply that
    /// [`KeyHolders::check`] refuses counts as a failed shard (its keys go to the next replica).
    pub fn key_holders(&self, keys: &[PageKey]) -> Result<KeyHolders, DirError> {
        /// One key's copies, as indices into the merged node table (inline up to three).
        type Copies = SmallVec<[u32; 3]>;
        let table = RefCell::new(Vec::<NodeId>::new());
        let index_of = |node: &NodeId| -> u32 {
            let mut t = table.borrow_mut();
            match t.iter().position(|n| n == node) {
                Some(i) => i as u32,
                None => {
                    t.push(node.clone());
                    (t.len() - 1) as u32
                }
            }
        };
        let per_key = self.replica_query(
            keys,
            true,
            Copies::new(),
            |items| DirRequest::Lookup(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Holders(h) => {
                    let n = h.len();
                    h.check(n).ok()?;
                    let map: SmallVec<[u32; 8]> = h.nodes.iter().map(index_of).collect();
                    Some(
                        (0..n)
                            .map(|i| {
                                h.copies(i)
                                    .iter()
                                    .map(|&c| (map[(c >> 1) as usize] << 1) | (c & 1))
                                    .collect()
                            })
                            .collect(),
                    )
                }
                DirReply::Found(v) => Some(
                    v.iter()
                        .map(|o| {
                            o.iter()
                                .flatten()
                                .map(|l| (index_of(&l.node) << 1) | u32::from(l.resident))
                                .collect()
                        })
                        .collect(),
                ),
                _ => None,
            },
            |h| !h.is_empty(),
        )?;
        let mut out = KeyHolders {
            nodes: table.into_inner(),
            ends: Vec::with_capacity(keys.len()),
            copies: Vec::with_capacity(keys.len() * self.cfg.replicas),
        };
        for copies in &per_key {
            out.copies.extend_from_slice(copies);
            out.ends.push(out.copies.len() as u32);
        }
        Ok(out)
    }

    /// Presence of each key (memory or disk of a live owner). Within `handoff_grace` of a ring
    /// change, a key no owner has is asked about on every member, as [`Self::lookup`] does.
    pub fn exists(&self, keys: &[PageKey]) -> Result<Vec<bool>, DirError> {
        self.replica_query(
            keys,
            false,
            false,
            |items| DirRequest::Exists(items.iter().map(|&i| keys[i]).collect::<Vec<_>>().into()),
            |reply| match reply {
                DirReply::Exists(v) => Some(v),
                _ => None,
            },
            |present| *present,
        )
    }

    /// The one replica query behind [`Self::lookup`] and [`Self::exists`]: asks each key's
    /// owner at replica rank 0 (this node's own shard when it is one of the key's owners),
    /// then — for keys whose owner failed or (within
    /// `handoff_grace` of a ring change) did not have them — the owner at the next rank, and
    /// so on; within the grace, keys still missing are asked about on every member. `build`
    /// makes the request for a chunk of key indices, `decode` takes the per-key answers out
    /// of a reply (`None`: not the reply asked for), `found` says whether an answer is a hit.
    fn replica_query<'a, T: Clone>(
        &self,
        keys: &[PageKey],
        holders: bool,
        missing: T,
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        decode: impl Fn(DirReply) -> Option<Vec<T>>,
        found: impl Fn(&T) -> bool,
    ) -> Result<Vec<T>, DirError> {
        let view = self.view();
        if view.ring.is_empty() {
            return Err(DirError::NoMembers);
        }
        let mut out = vec![missing; keys.len()];
        let retry_misses = view.changed_at.elapsed() < self.cfg.handoff_grace;
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        // Keys a shard missed because it is still receiving them, with their previous holder.
        let mut hinted: Vec<(usize, NodeId)> = Vec::new();
        for rank in 0..self.cfg.replicas {
            if pending.is_empty() {
                break;
            }
            if rank > 0 {
                self.c.fallbacks.add(pending.len() as u64);
            }
            let chunks = self.group(&view, pending.iter().map(|&i| (i, keys[i])), rank, true);
            let replies = self.fan_out_hinted(&view, &chunks, &build, holders);
            let mut next = Vec::new();
            for ((node, items), (reply, moving)) in chunks.iter().zip(replies) {
                for (j, holder) in moving.keys {
                    if let Some(&i) = items.get(j as usize)
                        && holder != *node
                    {
                        hinted.push((i, holder));
                    }
                }
                match reply.ok().and_then(&decode) {
                    Some(v) if v.len() == items.len() => {
                        for (&i, answer) in items.iter().zip(v) {
                            if found(&answer) {
                                out[i] = answer;
                            } else if retry_misses {
                                next.push(i);
                            }
                        }
                    }
                    _ => next.extend_from_slice(items),
                }
            }
            pending = next;
        }
        // Within the grace every member is asked below (the previous holders among them);
        // past it, only the holders a receiving shard named.
        hinted.retain(|(i, _)| !retry_misses && !found(&out[*i]));
        if !hinted.is_empty() {
            self.c.redirects.add(hinted.len() as u64);
            let mut by_node: HashMap<NodeId, Vec<usize>> = HashMap::new();
            for (i, holder) in hinted {
                by_node.entry(holder).or_default().push(i);
            }
            let max = self.cfg.max_keys_per_request.max(1);
            let chunks: Vec<Chunk> = by_node
                .into_iter()
                .flat_map(|(node, items)| {
                    items
                        .chunks(max)
                        .map(|c| (node.clone(), c.to_vec()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let replies = self.fan_out_as(&view, &chunks, &build, holders);
            for ((_, items), reply) in chunks.iter().zip(replies) {
                if let Some(v) = reply.ok().and_then(&decode)
                    && v.len() == items.len()
                {
                    for (&i, answer) in items.iter().zip(v) {
                        if found(&answer) {
                            out[i] = answer;
                        }
                    }
                }
            }
            pending.retain(|&i| !found(&out[i]));
        }
        if retry_misses && !pending.is_empty() {
            for (items, reply) in self.ask_every_member(&view, &pending, &build, holders) {
                if let Some(v) = reply.ok().and_then(&decode)
                    && v.len() == items.len()
                {
                    for (&i, answer) in items.iter().zip(v) {
                        if !found(&out[i]) {
                            out[i] = answer;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Shortly after a ring change, a writer whose ring lagged may have put entries on nodes
    /// that are no owners in this ring, and the hand-off to the owners may not have landed
    /// yet: asks every member once about the `pending` keys (in chunks of at most
    /// `max_keys_per_request`) and returns each chunk's key indices with its reply.
    fn ask_every_member<'a>(
        &self,
        view: &View,
        pending: &[usize],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<(Vec<usize>, Result<DirReply, DirError>)> {
        self.c.fallbacks.add(pending.len() as u64);
        let max = self.cfg.max_keys_per_request.max(1);
        let chunks: Vec<Chunk> = view
            .ring
            .members()
            .iter()
            .flat_map(|m| pending.chunks(max).map(move |c| (m.clone(), c.to_vec())))
            .collect();
        let replies = self.fan_out_as(view, &chunks, build, holders);
        chunks
            .into_iter()
            .map(|(_, items)| items)
            .zip(replies)
            .collect()
    }
}

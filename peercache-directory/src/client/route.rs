//! The fan-out: keys grouped by the shard that answers them, one request per shard, shards in
//! parallel under one deadline, the local shard called directly.

use std::net::SocketAddr;

use peercache_wire::PageKey;
use peercache_wire::envelope::{self, Extension};
use peercache_wire::rpc;

use crate::DirError;
use crate::msg::{DirReply, DirRequest, EXT_HOLDERS_ONLY, EXT_MOVING, LayoutRuns, Moving};

use super::{Chunk, DirectoryClient, View};

impl DirectoryClient {
    /// Groups item indices by the owner at replica position `rank` (items without one skip).
    /// With `local_first` (queries), this node counts as rank 0 of every key it is an owner of
    /// (the others keep their order): a query answered by the local shard needs no round trip;
    /// and a key it does not own has its owners ordered by this node's fixed preference among
    /// the members, so the keys two owners share go to the same one: fewer shards asked per
    /// query (with three members and two replicas, one), while each member prefers others.
    pub(super) fn group(
        &self,
        view: &View,
        keys: impl Iterator<Item = (usize, PageKey)>,
        rank: usize,
        local_first: bool,
    ) -> Vec<Chunk> {
        // (member, item) pairs sorted by member: no hashing, and items keep their order
        // within a member (they are unique, so the unstable sort cannot reorder them).
        let mut picked: Vec<(u32, usize)> = Vec::with_capacity(keys.size_hint().0);
        let mut idx = Vec::with_capacity(self.cfg.replicas);
        let me = if local_first {
            view.ring.index_of(&self.me)
        } else {
            None
        };
        for (i, k) in keys {
            view.ring.owner_indices(k, self.cfg.replicas, &mut idx);
            if let Some(me) = me {
                match idx.iter().position(|&m| m == me) {
                    Some(p) => idx[..=p].rotate_right(1),
                    None => idx.sort_unstable_by_key(|&m| peer_preference(me, m)),
                }
            }
            if let Some(&m) = idx.get(rank) {
                picked.push((m, i));
            }
        }
        picked.sort_unstable();
        let max = self.cfg.max_keys_per_request.max(1);
        let mut out = Vec::new();
        for run in picked.chunk_by(|a, b| a.0 == b.0) {
            let node = view.ring.member(run[0].0);
            for chunk in run.chunks(max) {
                out.push((node.clone(), chunk.iter().map(|&(_, i)| i).collect()));
            }
        }
        out
    }

    /// Sends one request per chunk (local shard inline, peers in parallel).
    pub(super) fn fan_out<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
    ) -> Vec<Result<DirReply, DirError>> {
        self.fan_out_as(view, chunks, build, false)
    }

    /// [`Self::fan_out`]; with `holders`, lookups ask for holders only
    /// ([`crate::msg::EXT_HOLDERS_ONLY`]).
    pub(super) fn fan_out_as<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<Result<DirReply, DirError>> {
        self.fan_out_hinted(view, chunks, build, holders)
            .into_iter()
            .map(|(r, _)| r)
            .collect()
    }

    /// [`Self::fan_out_as`], with each reply's [`Moving`] hints (empty unless a shard is still
    /// receiving a hand-off of keys it missed).
    pub(super) fn fan_out_hinted<'a>(
        &self,
        view: &View,
        chunks: &[Chunk],
        build: impl Fn(&[usize]) -> DirRequest<'a>,
        holders: bool,
    ) -> Vec<(Result<DirReply, DirError>, Moving)> {
        let mut results: Vec<Option<(Result<DirReply, DirError>, Moving)>> =
            (0..chunks.len()).map(|_| None).collect();
        let mut frames = Vec::new();
        let mut remote = Vec::new();
        // This node's own chunks are answered while the remote requests are in flight.
        let mut local = Vec::new();
        for (ci, (node, items)) in chunks.iter().enumerate() {
            if *node == self.me {
                local.push(ci);
                continue;
            }
            let req = build(items);
            let Some(&addr) = view.addrs.get(node) else {
                results[ci] = Some((
                    Err(DirError::UnknownMember(node.clone())),
                    Moving::default(),
                ));
                continue;
            };
            let frame = LayoutRuns::extension(&req).and_then(|layouts| {
                let mut ext: Vec<Extension> = layouts.into_iter().collect();
                if holders {
                    ext.push(Extension::of(EXT_HOLDERS_ONLY, &1u8)?);
                }
                envelope::encode(&req, &ext)
            });
            match frame {
                Ok(f) => {
                    frames.push((addr, f));
                    remote.push(ci);
                }
                Err(e) => results[ci] = Some((Err(DirError::Wire(e)), Moving::default())),
            }
        }
        let answer_local = |results: &mut Vec<Option<(Result<DirReply, DirError>, Moving)>>| {
            for &ci in &local {
                let req = build(&chunks[ci].1);
                self.c.local_calls.add(1);
                let reply = match &req {
                    DirRequest::Lookup(keys) if holders => self.local.apply_holders(keys),
                    _ => self.local.apply(&req),
                };
                let moving = self.local.moving(&req, &reply);
                results[ci] = Some((Ok(reply), moving));
            }
        };
        if frames.is_empty() {
            answer_local(&mut results);
        } else {
            let calls: Vec<(SocketAddr, &[u8])> =
                frames.iter().map(|(a, f)| (*a, f.as_slice())).collect();
            self.c.rpcs.add(calls.len() as u64);
            let replies = self
                .rpc
                .call_many_then(&calls, self.cfg.timeout, || answer_local(&mut results));
            for (ci, r) in remote.into_iter().zip(replies) {
                let r = r.and_then(|f| decode_hinted(&f)).map_err(DirError::Wire);
                if r.is_err() {
                    self.c.errors.add(1);
                }
                results[ci] = Some(match r {
                    Ok((reply, moving)) => (Ok(reply), moving),
                    Err(e) => (Err(e), Moving::default()),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or((Err(DirError::NoMembers), Moving::default())))
            .collect()
    }
}

/// How much member `me` prefers asking member `m` about a key both can answer: a fixed
/// pseudo-random order of the members per asking node.
fn peer_preference(me: u32, m: u32) -> u64 {
    let mut x = (u64::from(me) << 32 | u64::from(m)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Decodes a shard's reply frame with its [`Moving`] hints (a reply without them, as an older
/// shard sends, has none).
fn decode_hinted(frame: &[u8]) -> Result<(DirReply, Moving), peercache_wire::WireError> {
    let env = envelope::Envelope::parse(frame)?;
    if env.kind == <rpc::RpcError as envelope::Message>::KIND {
        let e: rpc::RpcError = env.decode()?;
        return Err(peercache_wire::WireError::Remote {
            code: e.code,
            message: e.message,
        });
    }
    let mut reply: DirReply = env.decode()?;
    LayoutRuns::read(&env, &mut reply)?;
    let moving = env
        .extension_value::<Moving>(EXT_MOVING)?
        .unwrap_or_default();
    Ok((reply, moving))
}

//! Slotmap mode: no directory. A key's owner is its primary on the ring of all members; inside
//! the owner's slotmap region its bucket comes from a hash of the key (`peercache_pool::slotmap`).
//!
//! * Layouts: every node announces its region (key, base, geometry) in its discovery record;
//!   readers cache them per membership change — no lookup RPC on the read path.
//! * Writes go to the owner, which writes its own region under one lock (`SlotWrite` control
//!   RPC for remote owners): two writers never race on a slot, so a reader can only ever see a
//!   slot that is complete, being rewritten (odd seq, or a changed seq/checksum: rejected), or
//!   another key (not matched).
//! * `exists` reads each key's bucket header block (ways × 64 bytes) one-sided — one batch per
//!   owner; `get` reads the header block, then the matching way's payload and its header again,
//!   and accepts the page only if the header is unchanged and the checksum matches.
//! * Keys whose owner moved after a membership change are misses (nothing migrates).

use std::net::SocketAddr;

use peercache_pool::slotmap::{self, HEADER, SlotHeader};
use peercache_transport::{Batch, RegionKey, RemoteRange, Segment};
use peercache_wire::{Layout, NodeId, PageKey, envelope, rpc};

use crate::control::{StoreReply, StoreRequest};
use crate::modes::state::SlotMode;
use crate::node::reach::Reach;
use crate::read::dest::PageDest;
use crate::read::scratch::ScratchPool;

/// The discovery attribute that carries a node's slotmap layout.
pub(crate) use crate::layout::slot::{LAYOUT_ATTR, encode_layout, layouts};

/// Slot mode's reads and writes, with what they need of their node (`Core::slot_io`).
pub(crate) struct SlotIo<'a> {
    /// This node's id, directory client, transport, counters, layout and op deadline.
    pub(crate) reach: Reach<'a>,
    pub(crate) slots: &'a SlotMode,
    pub(crate) scratch: &'a ScratchPool,
}

impl SlotIo<'_> {
    /// Serves a `SlotWrite`: writes each page into this node's region.
    pub(crate) fn write(&self, pages: &[(PageKey, Vec<u8>)], layout: Layout) -> Vec<bool> {
        let map = &self.slots.map;
        pages
            .iter()
            .map(|(k, bytes)| map.write(*k, &[bytes.as_slice()], layout).is_ok())
            .collect()
    }
}

/// One owner's share of a request: (owner, page indices).
type Groups = Vec<(NodeId, Vec<usize>)>;

fn group(owners: &[Option<NodeId>], me: &NodeId) -> (Vec<usize>, Groups) {
    let (mut local, mut remote): (Vec<usize>, Groups) = (Vec::new(), Vec::new());
    for (i, o) in owners.iter().enumerate() {
        match o {
            Some(n) if n == me => local.push(i),
            Some(n) => match remote.iter_mut().find(|(m, _)| m == n) {
                Some((_, v)) => v.push(i),
                None => remote.push((n.clone(), vec![i])),
            },
            None => {}
        }
    }
    (local, remote)
}

impl SlotIo<'_> {
    /// Slotmap writes: local keys into this region, the others by `SlotWrite` to their owners
    /// (all owners at once).
    pub(crate) fn set(&self, keys: &[PageKey], slices: &[&[u8]], counts: &[usize]) -> Vec<bool> {
        let slots = self.slots;
        let map = &slots.map;
        let mut starts = Vec::with_capacity(keys.len());
        let mut at = 0;
        for &c in counts {
            starts.push(at);
            at += c;
        }
        let owners = self.reach.dir.primaries(keys);
        let (local, remote) = group(&owners, self.reach.me);
        let mut done = vec![false; keys.len()];
        let layout = self.reach.layout;
        for i in local {
            done[i] = map
                .write(keys[i], &slices[starts[i]..starts[i] + counts[i]], layout)
                .is_ok();
        }
        let layout_ext = crate::control::layout_extension(self.reach.layout);
        let layouts = slots.layouts.read().clone();
        let mut reqs: Vec<(SocketAddr, Vec<u8>, &Vec<usize>)> = Vec::new();
        for (node, idx) in &remote {
            let Some(l) = layouts.get(node) else { continue };
            let pages: Vec<(PageKey, Vec<u8>)> = idx
                .iter()
                .map(|&i| (keys[i], slices[starts[i]..starts[i] + counts[i]].concat()))
                .collect();
            if let Ok(f) = envelope::encode(&StoreRequest::SlotWrite(pages), &layout_ext) {
                reqs.push((l.control, f, idx));
            }
        }
        let calls: Vec<(SocketAddr, &[u8])> =
            reqs.iter().map(|(ep, f, _)| (*ep, f.as_slice())).collect();
        for ((_, _, idx), r) in reqs.iter().zip(
            self.reach
                .dir
                .rpc()
                .call_many(&calls, self.reach.op_timeout),
        ) {
            if let Ok(StoreReply::SlotWritten(ok)) =
                r.and_then(|f| rpc::decode_reply::<StoreReply>(&f))
            {
                for (&i, ok) in idx.iter().zip(ok) {
                    done[i] = ok;
                }
            }
        }
        done
    }

    /// Reads the header block of every key's bucket on its owner; returns the blocks (None:
    /// owner unknown or unreachable). Local keys are read in place.
    fn header_blocks(&self, keys: &[PageKey], owners: &[Option<NodeId>]) -> Vec<Option<Vec<u8>>> {
        let slots = self.slots;
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let (local, remote) = group(owners, self.reach.me);
        if let Some(map) = Some(&slots.map) {
            let g = map.geometry();
            for i in local {
                let b = g.bucket_of(keys[i]);
                // SAFETY: the header block lies inside the mapped region.
                let block = unsafe {
                    std::slice::from_raw_parts(
                        map.base().add(g.bucket_offset(b) as usize),
                        g.header_block() as usize,
                    )
                };
                out[i] = Some(block.to_vec());
            }
        }
        let layouts = slots.layouts.read().clone();
        for (node, idx) in remote {
            let Some(l) = layouts.get(&node) else {
                continue;
            };
            let hb = l.geo.header_block() as usize;
            let Ok(mut scratch) = self
                .scratch
                .checkout(self.reach.transport, 0, hb * idx.len())
            else {
                continue;
            };
            let mut batch = Batch::new();
            for (j, &i) in idx.iter().enumerate() {
                let b = l.geo.bucket_of(keys[i]);
                batch.push(
                    RemoteRange {
                        region: RegionKey(l.region),
                        addr: l.base + l.geo.bucket_offset(b),
                        len: hb as u32,
                    },
                    &[Segment {
                        region: scratch.key(),
                        addr: scratch.staging_addr(j * hb),
                        len: hb as u32,
                    }],
                );
            }
            if let Ok(res) = self.reach.transport.read_batch(l.data, &batch) {
                for (j, (&i, r)) in idx.iter().zip(res).enumerate() {
                    if r.is_ok() {
                        out[i] = Some(scratch.staging_mut(j * hb, hb).to_vec());
                    }
                }
            }
            self.scratch.give_back(scratch);
        }
        out
    }

    /// Slotmap exists: the leading keys whose bucket holds them.
    /// Per-key presence in slotmap mode (one header-block fetch per owner).
    pub(crate) fn contains(&self, keys: &[PageKey]) -> Vec<bool> {
        let owners = self.reach.dir.primaries(keys);
        let blocks = self.header_blocks(keys, &owners);
        keys.iter()
            .zip(&blocks)
            .map(|(k, b)| {
                b.as_ref()
                    .is_some_and(|b| slotmap::find_way(b, *k, None).is_some())
            })
            .collect()
    }

    /// Slotmap get: header block, then the matching way's payload and header again; verified.
    pub(crate) fn get(&self, keys: &[PageKey], dest: &mut PageDest<'_>) -> Vec<Option<u32>> {
        let slots = self.slots;
        let n = keys.len();
        let lens: Vec<usize> = dest.lens().iter().map(|&l| l as usize).collect();
        let mut hit: Vec<Option<u32>> = vec![None; n];
        let layout = self.reach.layout;
        let owners = self.reach.dir.primaries(keys);
        let (local, remote) = group(&owners, self.reach.me);
        if let Some(map) = Some(&slots.map) {
            for i in local {
                match map.read(keys[i], &mut dest.page_mut(i), layout) {
                    Ok(()) => hit[i] = Some(lens[i] as u32),
                    Err(slotmap::SlotMiss::Torn) => {
                        self.reach.metrics.verify_rejects.add(1);
                    }
                    Err(slotmap::SlotMiss::Layout) => {
                        self.reach.metrics.layout_mismatches.add(1);
                    }
                    Err(slotmap::SlotMiss::Absent) => {}
                }
            }
        }
        let remote_keys: Vec<usize> = remote.iter().flat_map(|(_, v)| v.iter().copied()).collect();
        if remote_keys.is_empty() {
            return hit;
        }
        let blocks = self.header_blocks(keys, &owners);
        let layouts = slots.layouts.read().clone();
        for (node, idx) in remote {
            let Some(l) = layouts.get(&node) else {
                continue;
            };
            // Phase 2: payload + header of the matching way, per key.
            let found: Vec<(usize, u32, SlotHeader)> = idx
                .iter()
                .filter_map(|&i| {
                    let b = blocks[i].as_ref()?;
                    slotmap::find_way(b, keys[i], Some(lens[i] as u32)).map(|(w, h)| (i, w, h))
                })
                .collect();
            if found.is_empty() {
                continue;
            }
            let staging: usize = found.iter().map(|(i, ..)| lens[*i] + HEADER).sum();
            let Ok(mut scratch) = self.scratch.checkout(self.reach.transport, 0, staging) else {
                continue;
            };
            // Slotmap reads stage every payload: a slot may be rewritten under the read, so
            // the bytes reach the caller only after the re-read header proves them whole.
            self.reach.metrics.staged_reads.add(found.len() as u64);
            let mut batch = Batch::new();
            let mut offs = Vec::with_capacity(found.len());
            let mut off = 0usize;
            for &(i, w, _) in &found {
                let b = l.geo.bucket_of(keys[i]);
                batch.push(
                    RemoteRange {
                        region: RegionKey(l.region),
                        addr: l.base + l.geo.payload_offset(b, w),
                        len: lens[i] as u32,
                    },
                    &[Segment {
                        region: scratch.key(),
                        addr: scratch.staging_addr(off),
                        len: lens[i] as u32,
                    }],
                );
                // The header again, after the payload (ops of a batch are served in order).
                batch.push(
                    RemoteRange {
                        region: RegionKey(l.region),
                        addr: l.base + l.geo.header_offset(b, w),
                        len: HEADER as u32,
                    },
                    &[Segment {
                        region: scratch.key(),
                        addr: scratch.staging_addr(off + lens[i]),
                        len: HEADER as u32,
                    }],
                );
                offs.push(off);
                off += lens[i] + HEADER;
            }
            if let Ok(res) = self.reach.transport.read_batch(l.data, &batch) {
                for (j, &(i, _, before)) in found.iter().enumerate() {
                    if res[2 * j].is_err() || res[2 * j + 1].is_err() {
                        continue;
                    }
                    let staged = scratch.staging_mut(offs[j], lens[i] + HEADER);
                    let (payload, after) = staged.split_at(lens[i]);
                    match slotmap::accept(&before, payload, after, keys[i], lens[i] as u32, layout)
                    {
                        Ok(()) => {
                            dest.fill(i, payload);
                            hit[i] = Some(lens[i] as u32);
                        }
                        Err(slotmap::SlotMiss::Layout) => {
                            self.reach.metrics.layout_mismatches.add(1);
                        }
                        Err(_) => {
                            self.reach.metrics.verify_rejects.add(1);
                        }
                    }
                }
            }
            self.scratch.give_back(scratch);
        }
        hit
    }
}

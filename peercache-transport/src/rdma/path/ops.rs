//! A batch carried one-sided: its ops checked against the peer's table, caller memory
//! covered by lazy registrations (cached, pinned while a batch uses them), engine ops built
//! and executed, results counted.

use std::collections::HashMap;
use std::net::SocketAddr;

use smallvec::SmallVec;

use super::RdmaPath;
use super::peers::{CHUNK_REFRESH, RemoteTable};
use super::plane::{RailKeys, Registrar};
use crate::rdma::bootstrap::{ChunkedRegion, Responder};
use crate::rdma::engine::{EngineOp, LocalSge, MAX_RAILS, RdmaOp, RdmaOpError, Verbs};
use crate::rdma::mr_cache::Pin;
use crate::{Access, Batch, OpError, OpResults, RegionKey};

impl<V: Verbs + Registrar + Responder> RdmaPath<V> {
    /// Carries `batch` one-sided as `kind`, or `None` when it must go over TCP.
    pub(super) fn one_sided(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        kind: RdmaOp,
    ) -> Option<OpResults> {
        let fallback = || {
            self.counters.fallbacks.add(1);
            None
        };
        let Some(mut remote) = self.peer_regions(peer, false) else {
            return fallback();
        };
        let unknown = batch
            .ops()
            .iter()
            .any(|o| !remote.regions.contains_key(&o.remote.region.0));
        // A region registered after our last fetch (or the peer restarted), or a chunk the
        // peer was still registering then (asked again at most every `CHUNK_REFRESH`).
        if unknown
            || (remote.incomplete
                && remote.fetched.elapsed() >= CHUNK_REFRESH
                && remote.awaits_chunks(batch))
        {
            match self.peer_regions(peer, true) {
                Some(t) => remote = t,
                None => return fallback(),
            }
        }
        // A write needs every target registered remote-writable on the peer's NIC; otherwise
        // the TCP server (and its guard) decides.
        if kind == RdmaOp::Write
            && batch.ops().iter().any(|o| {
                !remote
                    .regions
                    .get(&o.remote.region.0)
                    .is_some_and(|r| r.writable)
            })
        {
            return fallback();
        }
        // Ops the peer's table rejects fail here with the TCP server's typed errors; the rest
        // go over RDMA.
        let mut results: OpResults = (0..batch.len())
            .map(|i| check_op(batch, i, &remote.regions))
            .collect();
        // Caller memory outside registered regions: covered by cached registrations or
        // registered now (pinned until the engine has drained every request that targets it).
        let Some(lazy) = self.lazy_register(batch) else {
            return fallback();
        };
        let idx: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_ok()).collect();
        let Some(ops) = self.build(batch, &idx, &remote, kind, &lazy) else {
            return fallback();
        };
        let done = self.engine.execute(&peer.to_string(), &ops, self.timeout);
        if !done.is_empty() && done.iter().all(|r| *r == Err(RdmaOpError::Post)) {
            // No queue pair could be connected: leave this peer on TCP for a while.
            self.mark_unavailable(peer, "no queue pair could be connected".into());
            return fallback();
        }
        let (mut ok_ops, mut ok_bytes) = (0u64, 0u64);
        for (&i, r) in idx.iter().zip(done) {
            let len = u64::from(batch.ops()[i].remote.len);
            results[i] = match r {
                Ok(()) => {
                    ok_ops += 1;
                    ok_bytes += len;
                    Ok(())
                }
                Err(e) => {
                    self.counters.op_errors.add(1);
                    Err(match e {
                        RdmaOpError::Wc(10) => OpError::AccessDenied(batch.ops()[i].remote.region),
                        other => OpError::Batch(format!("rdma: {other}")),
                    })
                }
            };
        }
        if kind == RdmaOp::Write {
            self.counters.write_ops.add(ok_ops);
            self.counters.write_bytes.add(ok_bytes);
        } else {
            self.counters.read_ops.add(ok_ops);
            self.counters.read_bytes.add(ok_bytes);
        }
        Some(results)
    }

    /// Engine ops for the ops of `batch` numbered `idx`, or None when one cannot go over
    /// RDMA (a chunk the peer had not registered, an op across two chunks, local memory no
    /// registration covers).
    fn build(
        &self,
        batch: &Batch,
        idx: &[usize],
        remote: &RemoteTable,
        kind: RdmaOp,
        lazy: &LazyRegs<'_, V>,
    ) -> Option<Vec<EngineOp>> {
        let local = self.local.read();
        let mut ops = Vec::with_capacity(idx.len());
        for &i in idx {
            let op = &batch.ops()[i];
            let r = remote.regions.get(&op.remote.region.0)?;
            let c = r.chunk_of(op.remote.addr, u64::from(op.remote.len))?;
            let mut rkeys: SmallVec<[u32; 2]> = SmallVec::new();
            rkeys.extend(r.rkeys[c].iter().copied());
            let mut segs: SmallVec<[LocalSge; 4]> = SmallVec::new();
            for s in batch.op_segments(op) {
                let lkeys = if s.region == RegionKey::UNREGISTERED && batch.allows_unregistered() {
                    lazy.keys_for(s.addr, u64::from(s.len))?
                } else {
                    local.get(&s.region.0)?.lkeys(s.addr, u64::from(s.len))?
                };
                segs.push(LocalSge {
                    addr: s.addr,
                    len: s.len,
                    lkeys,
                });
            }
            ops.push(EngineOp {
                op: kind,
                local: segs,
                remote_addr: op.remote.addr,
                rkeys,
            });
        }
        Some(ops)
    }

    /// Covers the batch's [`RegionKey::UNREGISTERED`] segments with registrations: their
    /// page-aligned ranges, merged (so the many segments of one caller buffer cost one), each
    /// taken from the lazy-MR cache or registered and cached. None when a registration fails
    /// (the batch then goes over TCP, which needs none).
    fn lazy_register(&self, batch: &Batch) -> Option<LazyRegs<'_, V>> {
        let mut regs = LazyRegs {
            path: self,
            regs: SmallVec::new(),
            pins: SmallVec::new(),
            any: Registrar::local_any(self.engine.verbs()),
        };
        if !batch.allows_unregistered() || regs.any.is_some() {
            return Some(regs);
        }
        let mut ranges: Vec<(u64, u64)> = batch
            .segments()
            .iter()
            .filter(|s| s.region == RegionKey::UNREGISTERED && s.len > 0)
            .filter_map(|s| page_range(s.addr, u64::from(s.len)))
            .collect();
        if ranges.is_empty() {
            return Some(regs);
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        let mut missed = Vec::new();
        {
            let mut cache = self.mrs.lock();
            for (a, b) in merged {
                match cache.get(a, b) {
                    Some((pin, keys)) => {
                        regs.pins.push(pin);
                        regs.regs.push((a, b, keys.lkeys));
                    }
                    None => missed.push((a, b)),
                }
            }
        }
        let hits = regs.pins.len();
        if hits > 0 {
            self.counters.lazy_hits.add(hits as u64);
        }
        for (a, b) in missed {
            // SAFETY: the range covers segments the caller promised valid for the batch
            // (`Batch::allow_unregistered`), rounded out to whole pages, which stay mapped as
            // long as any byte of them is. Cached afterwards: the cache keeps it pinned while
            // any batch uses it and deregisters it only after that batch's engine drained.
            let keys = unsafe {
                Registrar::register(
                    self.engine.verbs(),
                    a as *mut u8,
                    (b - a) as usize,
                    Access::LocalOnly,
                )
            };
            match keys {
                Ok(keys) => {
                    self.counters.lazy_registrations.add(1);
                    regs.regs.push((a, b, keys.lkeys));
                    let (pin, out, held) = {
                        let mut cache = self.mrs.lock();
                        let (pin, out) = cache.insert(a, b, keys);
                        (pin, out, cache.len())
                    };
                    regs.pins.push(pin);
                    self.release_mrs(out, held);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "lazy registration failed; this batch goes over TCP");
                    return None;
                }
            }
        }
        Some(regs)
    }

    /// Deregisters what the lazy-MR cache let go, and updates its gauge.
    fn release_mrs(&self, keys: Vec<RailKeys>, held: usize) {
        for k in &keys {
            Registrar::deregister(self.engine.verbs(), k);
        }
        self.counters.lazy_mrs.set(held as f64);
    }
    /// [`RdmaPlane::forget_local`]: drops cached lazy registrations overlapping the range.
    pub(super) fn forget_lazy(&self, addr: u64, len: u64) {
        let Some((a, b)) = page_range(addr, len) else {
            return;
        };
        let (out, held) = {
            let mut cache = self.mrs.lock();
            let out = cache.invalidate(a, b);
            (out, cache.len())
        };
        self.release_mrs(out, held);
    }
}

/// The registrations covering one batch's caller memory, pinned in the lazy-MR cache until
/// dropped (after the engine drained), or the implicit on-demand-paging keys that cover it
/// without registering.
pub(super) struct LazyRegs<'a, V: Verbs + Registrar + Responder> {
    path: &'a RdmaPath<V>,
    /// (start, end, local keys) of each page-aligned range.
    regs: SmallVec<[(u64, u64, [u32; MAX_RAILS]); 2]>,
    pins: SmallVec<[Pin; 2]>,
    /// Keys of an implicit on-demand-paging registration (covers every address).
    any: Option<[u32; MAX_RAILS]>,
}

impl<V: Verbs + Registrar + Responder> LazyRegs<'_, V> {
    /// The local keys of the registration holding `[addr, addr+len)`.
    fn keys_for(&self, addr: u64, len: u64) -> Option<[u32; MAX_RAILS]> {
        let end = addr.checked_add(len)?;
        if let Some(any) = self.any {
            return Some(any);
        }
        self.regs
            .iter()
            .find(|(a, b, _)| addr >= *a && end <= *b)
            .map(|(_, _, k)| *k)
    }
}

impl<V: Verbs + Registrar + Responder> Drop for LazyRegs<'_, V> {
    fn drop(&mut self) {
        if self.pins.is_empty() {
            return;
        }
        let (out, held) = {
            let mut cache = self.path.mrs.lock();
            let out = cache.release(&self.pins);
            (out, cache.len())
        };
        self.path.release_mrs(out, held);
    }
}

/// `[addr, addr+len)` rounded out to whole 4 KiB pages; None if it wraps.
fn page_range(addr: u64, len: u64) -> Option<(u64, u64)> {
    const PAGE: u64 = 4096;
    let end = addr.checked_add(len)?.checked_add(PAGE - 1)?;
    Some((addr & !(PAGE - 1), end & !(PAGE - 1)))
}

/// The per-op checks the TCP server would make, done here against the peer's table (the NIC
/// would only say "remote access error").
fn check_op(batch: &Batch, i: usize, remote: &HashMap<u64, ChunkedRegion>) -> Result<(), OpError> {
    let op = &batch.ops()[i];
    let key = op.remote.region;
    let r = remote.get(&key.0).ok_or(OpError::UnknownRegion(key))?;
    crate::validate::range(key, r.base, r.len, op.remote.addr, u64::from(op.remote.len))?;
    crate::validate::segments_add_up(batch, op)
}

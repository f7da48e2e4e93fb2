//! This node's regions as the NIC knows them: registered whole or in chunks — the first
//! before `register` returns, the rest on a background thread, each once its memory is in —
//! and the region table peers fetch.

use crate::rdma::RdmaError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::RdmaPath;
use super::plane::{RailKeys, Registrar};
use crate::rdma::bootstrap::{ChunkedRegion, RegionRkeys, RegionTables, Responder};
use crate::rdma::engine::{MAX_RAILS, Verbs};
use crate::{Access, RegionKey, Residency};

/// A region of this node's as the NIC knows it: registered whole (one chunk of its full
/// length) or in chunks, of which those registered so far are a prefix.
pub(super) struct LocalRegion {
    base: u64,
    len: u64,
    access: Access,
    /// Chunk length (the region's length when registered whole).
    chunk: u64,
    /// Chunks in all.
    chunks: u32,
    /// Keys of the chunks registered so far, first chunk first.
    keys: Vec<RailKeys>,
    /// The thread registering the remaining chunks, while it runs.
    filler: Option<Filler>,
}

impl LocalRegion {
    /// The local keys of the registered chunk holding all of `[addr, addr + len)`.
    pub(super) fn lkeys(&self, addr: u64, len: u64) -> Option<[u32; MAX_RAILS]> {
        let ready = self.keys.len();
        let i = peercache_wire::qp::chunk_index(self.base, self.len, self.chunk, ready, addr, len)?;
        Some(self.keys[i].lkeys)
    }

    /// Bytes of the region registered so far.
    fn registered_bytes(&self) -> u64 {
        (self.keys.len() as u64)
            .saturating_mul(self.chunk)
            .min(self.len)
    }
}

/// The background registration of a region's remaining chunks.
pub(super) struct Filler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Filler {
    /// Stops it after the chunk it is registering and waits for it.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The registration of one region's chunks after the first, in order, on its own thread.
struct Fill<V: Verbs + Registrar + Responder> {
    path: Weak<RdmaPath<V>>,
    key: u64,
    base: u64,
    len: u64,
    chunk: u64,
    /// Chunks registered before the thread started.
    from: u32,
    access: Access,
    /// When set, a chunk is registered only once its memory is in.
    resident: Option<Arc<dyn Residency>>,
    stop: Arc<AtomicBool>,
}

/// How long the registering thread waits for a chunk's memory before it looks at its stop
/// flag again (bounds how long dropping a region that is still warming waits).
const RESIDENT_STEP: Duration = Duration::from_millis(50);

impl<V: Verbs + Registrar + Responder> Fill<V> {
    /// Waits until `[at, at + n)` is resident; false when told to stop first.
    fn wait_resident(&self, at: u64, n: u64) -> bool {
        let Some(r) = &self.resident else {
            return true;
        };
        // Pinning memory nobody touched yet would fault it in from this thread (on this
        // thread's NUMA node, and before the pool's own thread faults it again).
        while !r.wait_resident(at - self.base, n, RESIDENT_STEP) {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
        }
        true
    }

    fn run(self) {
        let started = Instant::now();
        let mut at = self.base + u64::from(self.from) * self.chunk;
        let end = self.base + self.len;
        while at < end {
            let n = self.chunk.min(end - at);
            if self.stop.load(Ordering::Relaxed) || !self.wait_resident(at, n) {
                return;
            }
            let Some(path) = self.path.upgrade() else {
                return;
            };
            let verbs = path.engine.verbs();
            // SAFETY: `[at, at + n)` lies within the region the transport registered, whose
            // memory stays valid until `RdmaPlane::deregister`; that stops this thread and
            // waits for it before it removes the region and returns.
            let keys = match unsafe {
                Registrar::register(verbs, at as *mut u8, n as usize, self.access)
            } {
                Ok(keys) => keys,
                Err(e) => {
                    tracing::warn!(
                        error = %e, offset = at - self.base,
                        "rdma: registering a chunk failed; the rest of this region is read over TCP"
                    );
                    return;
                }
            };
            let kept = match path.local.write().get_mut(&self.key) {
                Some(r) => {
                    r.keys.push(keys.clone());
                    true
                }
                None => false,
            };
            if !kept {
                Registrar::deregister(verbs, &keys);
                return;
            }
            path.publish_registration();
            at += n;
        }
        tracing::info!(
            bytes = self.len,
            chunk = self.chunk,
            secs = started.elapsed().as_secs_f64(),
            "rdma: region registered in chunks"
        );
    }
}

impl<V: Verbs + Registrar + Responder + 'static> RdmaPath<V> {
    /// [`RdmaPlane::register`]: the first chunk now (when its memory is in), the rest on a
    /// background thread.
    ///
    /// # Safety
    /// As [`RdmaPlane::register`].
    pub(super) unsafe fn register_region(
        &self,
        key: RegionKey,
        ptr: *mut u8,
        len: usize,
        access: Access,
        resident: Option<Arc<dyn Residency>>,
    ) -> Result<(), RdmaError> {
        let (base, total) = (ptr as u64, len as u64);
        // Memory only this node targets is registered whole: its segments may lie anywhere,
        // and one across two registrations could not be carried.
        let local = access == Access::LocalOnly;
        let chunk = if self.chunk == 0 || total <= self.chunk || local {
            total.max(1)
        } else {
            self.chunk
        };
        let chunks = u32::try_from(total.div_ceil(chunk).max(1))
            .map_err(|_| RdmaError::Unsupported("a region of more than 2^32 chunks"))?;
        let first = chunk.min(total) as usize;
        let resident = resident.filter(|_| !local);
        // The first chunk is registered here when its memory is in (so a NIC that refuses keeps
        // the region off RDMA at once); otherwise the thread registers it as it comes in.
        let now = resident
            .as_ref()
            .is_none_or(|r| r.wait_resident(0, first as u64, Duration::ZERO));
        let keys = if now {
            // SAFETY: forwarded from the caller; the first chunk lies within `ptr..ptr+len`.
            vec![unsafe { Registrar::register(self.engine.verbs(), ptr, first, access) }?]
        } else {
            Vec::new()
        };
        let registered = keys.len() as u32;
        // The region goes in first: the thread adds each chunk to it (and one it cannot find
        // was deregistered meanwhile).
        self.local.write().insert(
            key.0,
            LocalRegion {
                base,
                len: total,
                access,
                chunk,
                chunks,
                keys,
                filler: None,
            },
        );
        if chunks > registered {
            let stop = Arc::new(AtomicBool::new(false));
            let job = Fill {
                path: self.me.clone(),
                key: key.0,
                base,
                len: total,
                chunk,
                from: registered,
                access,
                resident,
                stop: stop.clone(),
            };
            let spawned = std::thread::Builder::new()
                .name("rdma-register".into())
                .spawn(move || job.run());
            match spawned {
                // The handle that could deregister the region does not exist yet: the region
                // is still there.
                Ok(thread) => {
                    if let Some(r) = self.local.write().get_mut(&key.0) {
                        r.filler = Some(Filler { stop, thread });
                    }
                }
                // No thread: the first chunk alone goes over RDMA, the rest over TCP.
                Err(e) => tracing::warn!(
                    error = %e,
                    "rdma: no thread to register the region's other chunks"
                ),
            }
        }
        self.publish_registration();
        Ok(())
    }
}

impl<V: Verbs + Registrar + Responder> RdmaPath<V> {
    /// [`RdmaPlane::register_device`]: device memory, registered whole.
    ///
    /// # Safety
    /// As [`RdmaPlane::register_device`].
    pub(super) unsafe fn register_device_region(
        &self,
        key: RegionKey,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<(), RdmaError> {
        // SAFETY: forwarded from the caller.
        let keys = unsafe { Registrar::register_device(self.engine.verbs(), mem, access) }?;
        let len = mem.len() as u64;
        self.local.write().insert(
            key.0,
            LocalRegion {
                base: mem.base(),
                len,
                access,
                chunk: len.max(1),
                chunks: 1,
                keys: vec![keys],
                filler: None,
            },
        );
        self.publish_registration();
        Ok(())
    }

    /// [`RdmaPlane::deregister`]: stops the background registration, then releases every
    /// chunk.
    pub(super) fn deregister_region(&self, key: RegionKey) {
        // Stop the background registration first (outside the lock it takes per chunk): no
        // chunk is registered after this returns.
        let filler = self
            .local
            .write()
            .get_mut(&key.0)
            .and_then(|r| r.filler.take());
        if let Some(f) = filler {
            f.stop();
        }
        let removed = self.local.write().remove(&key.0);
        if let Some(r) = removed {
            for k in &r.keys {
                Registrar::deregister(self.engine.verbs(), k);
            }
            self.publish_registration();
            // The caller may free the region's memory now: no lazy registration outlives it.
            self.forget_lazy(r.base, r.len);
        }
    }

    /// The regions peers may target, with the keys registered so far.
    pub(super) fn table(&self) -> RegionTables {
        let rails = Verbs::rails(self.engine.verbs()).min(MAX_RAILS);
        let mut t = RegionTables::default();
        for (k, r) in self.local.read().iter() {
            if r.access == Access::LocalOnly {
                continue;
            }
            let writable = r.access == Access::RemoteReadWrite;
            // A region of one chunk not registered yet goes out in the chunked form (no
            // chunk ready), so a reader asks again instead of taking it for unknown.
            if r.chunks == 1 && !r.keys.is_empty() {
                t.whole.extend(r.keys.first().map(|keys| RegionRkeys {
                    key: *k,
                    base: r.base,
                    len: r.len,
                    rkeys: keys.rkeys[..rails].to_vec(),
                    writable,
                }));
            } else {
                t.chunked.push(ChunkedRegion {
                    key: *k,
                    base: r.base,
                    len: r.len,
                    chunk: r.chunk,
                    chunks: r.chunks,
                    rkeys: r.keys.iter().map(|k| k.rkeys[..rails].to_vec()).collect(),
                    writable,
                });
            }
        }
        t
    }

    /// Bytes of this node's regions registered with the NIC so far, and in all (they differ
    /// while chunks are registered in the background).
    pub fn registration(&self) -> (u64, u64) {
        self.local.read().values().fold((0, 0), |(done, all), r| {
            (done + r.registered_bytes(), all + r.len)
        })
    }

    /// Sets the registration gauges from the regions as they are now.
    fn publish_registration(&self) {
        let (done, all) = self.registration();
        self.counters.registered.set(done as f64);
        self.counters
            .registering
            .set(all.saturating_sub(done) as f64);
    }
}

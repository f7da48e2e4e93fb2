//! Reads into device (GPU) memory: GPUDirect RDMA from other nodes' pools straight into
//! registered device regions, with no host copy.
//!
//! The CPU never touches device memory, so this path differs from the host read path in three
//! ways. Only pages held by *other* nodes are read, one-sided over RDMA (this node's own pages,
//! which a host read copies out of its pool, and peers reached over TCP or the same-host path
//! are misses here: the caller reads those through host memory). A page is verified without
//! its payload: the slot header fetched with it must pass every check and the same header,
//! read again after the payload landed, must be unchanged (the seqlock's second read; see
//! [`peercache_pool::header::verify_unseen`]). And a page that fails is not scrubbed: it is a
//! miss, whose destination bytes the caller must not use.

use peercache_pool::HEADER_LEN;
use peercache_transport::{Access, Batch, DeviceMemory, RegionKey, RemoteRange, Segment};
use peercache_wire::PageKey;
use smallvec::SmallVec;

use crate::StoreError;
use crate::node::store::Store;
use crate::read::plan::ReadPlan;
use crate::read::scratch::RawSeg;
use crate::read::wing::ReadWing;

impl Store {
    /// Registers device (GPU) memory as a destination of [`Store::batch_get_device`]: a dma-buf
    /// ([`DeviceMemory::Dmabuf`], preferred) or a device address with `nvidia-peermem`
    /// ([`DeviceMemory::PeerMem`]). Segments then name it by its device address (the dma-buf's
    /// `iova`).
    ///
    /// Only RDMA reaches device memory: on a node without an RDMA path this fails with
    /// [`StoreError::Transport`] wrapping `TransportError::Device`, which says what is missing.
    ///
    /// # Safety
    /// The device memory (and a dma-buf's fd) must stay valid while the node runs.
    pub unsafe fn register_device_buffer(&self, mem: DeviceMemory) -> Result<(), StoreError> {
        self.inner.check_open()?;
        // SAFETY: forwarded from the caller.
        let h = unsafe { self.inner.transport.register_device(mem, Access::LocalOnly) }?;
        self.inner.reads.device_buffers.write().push(h);
        self.inner
            .reads
            .has_device
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads pages into registered device memory (`counts[i]` segments for page `i`, each
    /// inside one region registered with [`Store::register_device_buffer`]). Per page: its
    /// valid length if it landed and verified, `None` for a miss — including pages this node
    /// holds itself and pages of peers it reaches without RDMA (read those into host memory).
    ///
    /// A segment outside every registered device region is refused as
    /// [`StoreError::BadRequest`] before anything moves.
    ///
    /// # Safety
    /// The segments must not overlap one another for the duration of the call.
    pub unsafe fn batch_get_device<K: AsRef<str>>(
        &self,
        keys: &[K],
        segs: &[RawSeg],
        counts: &[usize],
    ) -> Result<Vec<Option<u32>>, StoreError> {
        self.inner.check_open()?;
        crate::read::dest::check_counts(keys.len(), segs.len(), counts)?;
        let keys = self.page_keys(keys);
        let wing = self.inner.read_wing();
        let regions = wing.device_regions(segs)?;
        let t0 = std::time::Instant::now();
        let r = wing.get_device(&keys, segs, counts, &regions);
        self.inner
            .metrics
            .read_latency
            .record(t0.elapsed().as_secs_f64());
        Ok(r)
    }
}

/// Where a device read's pages land: the caller's segments, each one's device region, and
/// page `i`'s segments `starts[i]..starts[i] + counts[i]`.
struct DeviceDest<'a> {
    segs: &'a [RawSeg],
    regions: &'a [RegionKey],
    starts: &'a [usize],
    counts: &'a [usize],
}

impl ReadWing<'_> {
    /// The device region of every segment; a segment outside all of them is a bad request.
    fn device_regions(&self, segs: &[RawSeg]) -> Result<Vec<RegionKey>, StoreError> {
        let bufs = self.reads.device_buffers.read();
        segs.iter()
            .map(|s| {
                let (ptr, len) = (s.ptr as u64, s.len as u64);
                bufs.iter()
                    .find(|h| h.contains(ptr, len))
                    .map(|h| h.key())
                    .ok_or_else(|| {
                        StoreError::BadRequest(format!(
                            "segment {ptr:#x}+{len} is outside every registered device region \
                             (register_device_buffer)"
                        ))
                    })
            })
            .collect()
    }

    /// Whether any segment lies in a registered device region: the host read and write paths
    /// refuse those (the CPU would touch device memory). One lock-free check while none is
    /// registered.
    pub(crate) fn touches_device(&self, segs: &[RawSeg]) -> Result<(), StoreError> {
        if !self.reads.any_device() {
            return Ok(());
        }
        let bufs = self.reads.device_buffers.read();
        for s in segs {
            let (ptr, end) = (s.ptr as u64, (s.ptr as u64).saturating_add(s.len as u64));
            if bufs
                .iter()
                .any(|h| ptr < h.base() + h.len() && end > h.base())
            {
                return Err(StoreError::BadRequest(format!(
                    "segment {ptr:#x} is device memory: read it with batch_get_device (the \
                     host path would touch it with the CPU)"
                )));
            }
        }
        Ok(())
    }

    /// A device read: owners, then the remote rounds every read shares, each owner's pages
    /// read by [`ReadWing::read_device`]. `regions[s]` is segment `s`'s device region.
    fn get_device(
        &self,
        keys: &[PageKey],
        segs: &[RawSeg],
        counts: &[usize],
        regions: &[RegionKey],
    ) -> Vec<Option<u32>> {
        self.home.metrics.read_requests.add(keys.len() as u64);
        let (starts, lens) = crate::read::dest::page_spans(segs, counts);
        let dest = DeviceDest {
            segs,
            regions,
            starts: &starts,
            counts,
        };
        let me = self.me.clone();
        let mut plan = ReadPlan::new(&me, keys, &lens);
        if self.slots.is_none() {
            self.find_owners(keys, &mut plan, None);
        }
        // Pages only this node holds (or only disk tiers hold) get no remote candidate: the
        // plan leaves them unserved.
        let (_, bytes) = self.remote_rounds(&mut plan, |ep, pages| {
            self.read_device(ep, pages, keys, &dest)
        });
        self.close_read(keys, plan, bytes)
    }

    /// Reads `pages` from one owner into device segments: one batch of header + payload per
    /// page (header into host scratch, payload onto the device), then one batch of the same
    /// headers again; a page is served when the two headers agree and pass the checks.
    fn read_device(
        &self,
        ep: std::net::SocketAddr,
        pages: &[(usize, peercache_directory::Location)],
        keys: &[PageKey],
        dest: &DeviceDest<'_>,
    ) -> Vec<(usize, Option<u32>)> {
        let miss = || pages.iter().map(|(i, _)| (*i, None)).collect();
        let scratch = match self
            .reads
            .scratch
            .checkout(self.transport, 2 * pages.len(), 0)
        {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "no scratch memory for a device read batch");
                return miss();
            }
        };
        let n = pages.len();
        let mut first = Batch::with_capacity(n, n * 3);
        let mut again = Batch::with_capacity(n, n);
        let mut local: SmallVec<[Segment; 4]> = SmallVec::new();
        for (j, (i, loc)) in pages.iter().enumerate() {
            let region = RegionKey(loc.rails[0].region);
            local.clear();
            local.push(Segment {
                region: scratch.handle.key(),
                addr: scratch.header_addr(j),
                len: HEADER_LEN as u32,
            });
            for s in dest.starts[*i]..dest.starts[*i] + dest.counts[*i] {
                local.push(Segment {
                    region: dest.regions[s],
                    addr: dest.segs[s].ptr as u64,
                    len: dest.segs[s].len as u32,
                });
            }
            first.push(
                RemoteRange {
                    region,
                    addr: loc.addr,
                    len: HEADER_LEN as u32 + loc.len,
                },
                &local,
            );
            again.push(
                RemoteRange {
                    region,
                    addr: loc.addr,
                    len: HEADER_LEN as u32,
                },
                &[Segment {
                    region: scratch.handle.key(),
                    addr: scratch.header_addr(n + j),
                    len: HEADER_LEN as u32,
                }],
            );
        }
        // The payloads first, then the same headers again: the second batch starts only once
        // the first has completed.
        let read = self
            .transport
            .read_batch(ep, &first)
            .and_then(|landed| Ok((landed, self.transport.read_batch(ep, &again)?)));
        let (landed, confirmed) = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(peer = %ep, error = %e, "device read batch failed");
                self.reads.scratch.give_back(scratch);
                return miss();
            }
        };
        let layout = self.layout;
        let mut out = Vec::with_capacity(n);
        for (j, (i, loc)) in pages.iter().enumerate() {
            if landed[j].is_err() || confirmed[j].is_err() {
                out.push((*i, None));
                continue;
            }
            let expect = peercache_pool::Expect {
                key: keys[*i],
                generation: loc.generation,
                len: loc.len,
                layout,
            };
            match peercache_pool::header::verify_unseen(
                scratch.header(j),
                scratch.header(n + j),
                loc.len as usize,
                &expect,
            ) {
                Ok(h) => out.push((*i, Some(h.valid_len))),
                Err(reason) => {
                    if reason == peercache_pool::VerifyError::Layout {
                        self.home.metrics.layout_mismatches.add(1);
                    } else {
                        self.home.metrics.verify_rejects.add(1);
                    }
                    tracing::debug!(key = %keys[*i], ?reason, peer = %ep, "device page rejected by verification");
                    out.push((*i, None));
                }
            }
        }
        self.reads.scratch.give_back(scratch);
        out
    }
}

//! Reads into device memory (`drive --gpu`): SGLang's KV pool laid out in GPU memory, a reader
//! that fetches each request's pages into it with [`Store::batch_get_device`] (one-sided RDMA
//! READ straight into the device, no host bounce), and a check of every page that landed.
//!
//! The pool has the host pool's geometry ([`ShapeArgs::slot_spans`]), so the same pages land
//! at the same offsets. The check cannot read device memory with the CPU: after each call one
//! strided device-to-host copy brings back the 16-byte stamp of every page read
//! ([`DeviceArena::read_rows`], a single `cudaMemcpy2D` on a GPU), and each must be its key's.
//!
//! Device memory comes from a [`DeviceArena`]: CUDA on a GPU host (`cuda::CudaArena`),
//! or [`MemfdArena`], a memfd exported as a dma-buf at an address the process never maps —
//! what the software RDMA fabric (`rdma_backend = "soft"`) reads into, so the whole path runs
//! in tests on any machine.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};
use peercache_store::{DeviceMemory, RawSeg, Store};

use crate::load::runner::CallOutcome;
use crate::load::sglang::{
    Checks, ReadKind, ShapeArgs, next_request, push_slot_segments, stamp_of,
};

/// Device memory a [`DevicePool`] lives in.
pub trait DeviceArena: Send + Sync {
    /// How to register it with a node ([`Store::register_device_buffer`]).
    fn memory(&self) -> DeviceMemory;
    /// The address segments use for its first byte.
    fn base(&self) -> u64;
    /// Its length in bytes.
    fn bytes(&self) -> usize;
    /// Copies rows of `width` bytes, the first at byte `off`, `pitch` bytes apart, into `out`
    /// back to back (`out.len() / width` rows).
    fn read_rows(&self, off: usize, pitch: usize, width: usize, out: &mut [u8]) -> Result<()>;
}

/// The number of rows a [`DeviceArena::read_rows`] call copies, after checking they lie in an
/// arena of `len` bytes and fill `out_len` exactly.
pub fn check_rows(
    len: usize,
    off: usize,
    pitch: usize,
    width: usize,
    out_len: usize,
) -> Result<usize> {
    if width == 0 || !out_len.is_multiple_of(width) || pitch < width {
        bail!("rows of {width} bytes every {pitch} into {out_len} bytes");
    }
    let rows = out_len / width;
    if rows == 0 {
        return Ok(0);
    }
    let end = (rows - 1)
        .checked_mul(pitch)
        .and_then(|x| x.checked_add(off))
        .and_then(|x| x.checked_add(width));
    match end {
        Some(e) if e <= len => Ok(rows),
        _ => bail!("{rows} rows from byte {off} every {pitch} leave a {len}-byte arena"),
    }
}

/// Stand-in device memory: a memfd exported as a dma-buf at an address this process never
/// maps (any CPU access through it would fault). The software fabric maps the memfd itself,
/// as a NIC maps a GPU's dma-buf; [`DeviceArena::read_rows`] reads it back through the fd.
#[derive(Debug)]
pub struct MemfdArena {
    fd: OwnedFd,
    iova: u64,
    len: usize,
}

/// The next stand-in device address: 1 TiB apart, from 0x6200_0000_0000 (high in the user
/// address space, where nothing is mapped).
static NEXT_IOVA: AtomicU64 = AtomicU64::new(0x6200_0000_0000);

impl MemfdArena {
    /// A zeroed arena of `len` bytes.
    pub fn new(len: usize) -> Result<MemfdArena> {
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"peercache-bench-device".as_ptr(), 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("memfd_create");
        }
        // SAFETY: memfd_create just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain call on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error()).context("ftruncate(memfd)");
        }
        let iova = NEXT_IOVA.fetch_add(1 << 40, Ordering::Relaxed);
        Ok(MemfdArena { fd, iova, len })
    }
}

impl DeviceArena for MemfdArena {
    fn memory(&self) -> DeviceMemory {
        DeviceMemory::Dmabuf {
            fd: self.fd.as_raw_fd(),
            offset: 0,
            len: self.len,
            iova: self.iova,
        }
    }

    fn base(&self) -> u64 {
        self.iova
    }

    fn bytes(&self) -> usize {
        self.len
    }

    fn read_rows(&self, off: usize, pitch: usize, width: usize, out: &mut [u8]) -> Result<()> {
        let rows = check_rows(self.len, off, pitch, width, out.len())?;
        for (r, row) in out.chunks_exact_mut(width).take(rows).enumerate() {
            let at = (off + r * pitch) as libc::off_t;
            // SAFETY: `row` is `width` writable bytes.
            let n = unsafe { libc::pread(self.fd.as_raw_fd(), row.as_mut_ptr().cast(), width, at) };
            if n != width as isize {
                return Err(std::io::Error::last_os_error()).context("pread(memfd)");
            }
        }
        Ok(())
    }
}

/// SGLang's KV pool in device memory: `slots` pages of a shape, at the host pool's offsets.
pub struct DevicePool {
    arena: Box<dyn DeviceArena>,
    shape: ShapeArgs,
    slots: usize,
}

impl std::fmt::Debug for DevicePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePool")
            .field("base", &format_args!("{:#x}", self.arena.base()))
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl DevicePool {
    /// A pool of `slots` pages of `shape` in `arena` (which must hold them).
    pub fn new(arena: Box<dyn DeviceArena>, shape: &ShapeArgs, slots: usize) -> Result<DevicePool> {
        let need = slots as u64 * shape.page_bytes();
        if (arena.bytes() as u64) < need {
            bail!(
                "a {}-byte arena cannot hold {slots} pages ({need} bytes)",
                arena.bytes()
            );
        }
        Ok(DevicePool {
            arena,
            shape: shape.clone(),
            slots,
        })
    }

    /// Pages the pool holds.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Registers the pool's memory with `store` as a device destination.
    ///
    /// # Safety
    /// The pool must outlive the store (shut the store down before dropping the pool).
    pub unsafe fn register(&self, store: &Store) -> Result<()> {
        // SAFETY: forwarded from the caller: the memory outlives the node.
        unsafe { store.register_device_buffer(self.arena.memory()) }
            .context("registering GPU memory (GPUDirect)")?;
        Ok(())
    }

    /// Appends slot `slot`'s segments (device addresses) in `get_page_buffer_meta` order.
    pub fn segments(&self, slot: usize, out: &mut Vec<RawSeg>) {
        let base = self.arena.base();
        push_slot_segments(&self.shape, self.slots, slot, out, |off| {
            (base + off as u64) as *mut u8
        });
    }

    /// Copies the stamps of slots `0..n` to the host, 16 bytes each, into `out`.
    pub fn stamps(&self, n: usize, out: &mut Vec<u8>) -> Result<()> {
        if n > self.slots {
            bail!("{n} stamps of a {}-slot pool", self.slots);
        }
        out.clear();
        out.resize(n * 16, 0);
        self.arena.read_rows(
            self.shape.stamp_offset(0),
            self.shape.stamp_pitch(),
            16,
            out,
        )
    }
}

/// One device read caller: like [`crate::load::sglang::read_caller`] (prefetch or get of the next
/// request), but into `pool`'s device memory with [`Store::batch_get_device`]; then one copy
/// of the stamps back, and every page that landed is checked (its stamp, its length).
///
/// # Safety
/// `pool` must stay registered with `store` and alive while the caller runs; each caller gets
/// its own pool.
pub unsafe fn device_read_caller(
    kind: ReadKind,
    store: Store,
    pool: Arc<DevicePool>,
    set: Arc<Vec<Vec<String>>>,
    start: u64,
    checks: Arc<Checks>,
) -> impl FnMut() -> CallOutcome + Send + 'static {
    let per = pool.shape.segments_per_page() as usize;
    let page = pool.shape.page_bytes();
    let mut r = start;
    let mut segs: Vec<RawSeg> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    let mut stamps: Vec<u8> = Vec::new();
    move || {
        let (keys, n) = match next_request(kind, &store, &set, &mut r, pool.slots) {
            Ok(next) => next,
            Err(done) => return done,
        };
        let all = keys.len() as u64;
        segs.clear();
        for slot in 0..n {
            pool.segments(slot, &mut segs);
        }
        counts.clear();
        counts.resize(n, per);
        // SAFETY: the segments are this caller's own slots of its registered device pool.
        let got = match unsafe { store.batch_get_device(&keys[..n], &segs, &counts) } {
            Ok(g) => g,
            Err(_) => return CallOutcome::done(0, all, true),
        };
        if pool.stamps(n, &mut stamps).is_err() {
            return CallOutcome::done(0, all, true);
        }
        let mut hits = 0u64;
        for (slot, len) in got.iter().enumerate() {
            let Some(len) = len else { continue };
            hits += 1;
            let stamp = &stamps[slot * 16..slot * 16 + 16];
            if u64::from(*len) != page || stamp != stamp_of(&keys[slot]) {
                checks.wrong.fetch_add(1, Ordering::Relaxed);
            }
        }
        CallOutcome::done(hits, all - hits, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::sglang::{HostLayout, Layout, test_shape as shape};

    #[test]
    fn rows_must_lie_in_the_arena_and_fill_the_output() {
        assert_eq!(check_rows(100, 0, 10, 4, 40).unwrap(), 10);
        assert_eq!(check_rows(100, 0, 10, 4, 0).unwrap(), 0);
        // The last row ends exactly at the arena's end.
        assert_eq!(check_rows(100, 6, 10, 4, 40).unwrap(), 10);
        assert!(
            check_rows(100, 7, 10, 4, 40).is_err(),
            "one byte past the end"
        );
        assert!(check_rows(100, 0, 10, 4, 41).is_err(), "a partial row");
        assert!(check_rows(100, 0, 3, 4, 8).is_err(), "rows overlap");
        assert!(check_rows(100, 0, 10, 0, 0).is_err(), "empty rows");
        assert!(check_rows(100, usize::MAX, 10, 4, 8).is_err(), "overflow");
    }

    #[test]
    fn device_segments_sit_where_the_host_pool_puts_them_and_stamps_read_back() {
        for layout in [Layout::Mla, Layout::Mha] {
            for host in [HostLayout::PageFirst, HostLayout::LayerFirst] {
                let s = shape(layout, host);
                let slots = 5;
                let arena = MemfdArena::new(slots * s.page_bytes() as usize).unwrap();
                let (fd, base) = (arena.fd.as_raw_fd(), arena.iova);
                let pool = DevicePool::new(Box::new(arena), &s, slots).unwrap();
                let host_pool = crate::load::sglang::HostPool::new(&s, slots);
                // Slot 0's first segment starts each pool.
                let mut first = Vec::new();
                host_pool.segments(0, &mut first);
                let host_base = first[0].ptr as u64;
                for slot in 0..slots {
                    let (mut d, mut h) = (Vec::new(), Vec::new());
                    pool.segments(slot, &mut d);
                    host_pool.segments(slot, &mut h);
                    assert_eq!(d.len(), h.len());
                    for (d, h) in d.iter().zip(&h) {
                        assert_eq!(d.len, h.len);
                        assert_eq!(d.ptr as u64 - base, h.ptr as u64 - host_base);
                    }
                    // Write slot's stamp where its first segment starts, through the fd.
                    let st = stamp_of(&format!("k{slot}"));
                    let at = (d[0].ptr as u64 - base) as libc::off_t;
                    // SAFETY: 16 readable bytes.
                    let n = unsafe { libc::pwrite(fd, st.as_ptr().cast(), 16, at) };
                    assert_eq!(n, 16);
                }
                let mut out = Vec::new();
                pool.stamps(slots, &mut out).unwrap();
                for slot in 0..slots {
                    assert_eq!(out[slot * 16..][..16], stamp_of(&format!("k{slot}")));
                }
                assert!(pool.stamps(slots + 1, &mut out).is_err());
            }
        }
    }

    #[test]
    fn a_pool_larger_than_its_arena_is_refused() {
        let s = shape(Layout::Mla, HostLayout::PageFirst);
        let arena = MemfdArena::new(s.page_bytes() as usize).unwrap();
        let e = DevicePool::new(Box::new(arena), &s, 2).unwrap_err();
        assert!(e.to_string().contains("cannot hold 2 pages"), "{e}");
    }
}

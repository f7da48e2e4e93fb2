//! Caller memory outside registered regions (`RegionKey::UNREGISTERED`, allowed per batch by
//! the unsafe `Batch::allow_unregistered`): read into and written from directly over TCP, and
//! registered lazily on the RDMA path and kept in a bounded cache for the batches that reuse
//! it (dropped when the caller says the memory goes); refused when the batch did not allow it.
// Every unsafe block registers a test buffer that outlives its handle, or allows unregistered
// segments in buffers that outlive the batch.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;

use peercache_transport::rdma::soft::Fabric;
use peercache_transport::{
    Access, Batch, OpError, RegionKey, RemoteRange, Segment, Transport, TransportConfig,
};

mod common;
use common::{Soft, pattern, soft_transport};

fn unreg(buf: &mut [u8], off: usize, len: u32) -> Segment {
    Segment {
        region: RegionKey::UNREGISTERED,
        addr: buf.as_mut_ptr() as u64 + off as u64,
        len,
    }
}

#[test]
fn tcp_reads_into_and_writes_from_unregistered_memory_only_when_allowed() {
    let owner = Transport::start(TransportConfig::default(), None).unwrap();
    let reader = Transport::start(TransportConfig::default(), None).unwrap();
    let mut src = pattern(1, 1 << 16);
    let sh =
        unsafe { owner.register(src.as_mut_ptr(), src.len(), Access::RemoteReadWrite) }.unwrap();
    let mut dst = vec![0u8; 1 << 16];
    let mut b = Batch::new();
    for i in 0..4u64 {
        let seg = unreg(&mut dst, i as usize * 16384, 16384);
        b.push(
            RemoteRange {
                region: sh.key(),
                addr: sh.addr(i * 16384),
                len: 16384,
            },
            &[seg],
        );
    }
    // Not allowed: refused per op, nothing written.
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(
        r.iter()
            .all(|x| *x == Err(OpError::UnknownRegion(RegionKey::UNREGISTERED))),
        "{r:?}"
    );
    assert!(dst.iter().all(|x| *x == 0));
    // Allowed: the bytes land straight in the caller's memory.
    unsafe { b.allow_unregistered() };
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(dst == src);
    // Writes gather from unregistered memory the same way.
    let mut fresh = pattern(2, 4096);
    let mut w = Batch::new();
    let seg = unreg(&mut fresh, 0, 4096);
    w.push(
        RemoteRange {
            region: sh.key(),
            addr: sh.addr(0),
            len: 4096,
        },
        &[seg],
    );
    unsafe { w.allow_unregistered() };
    assert!(reader.write_batch(owner.local_endpoint(), &w).unwrap()[0].is_ok());
    drop(sh);
    assert_eq!(&src[..4096], &fresh[..]);
    // Clearing a batch withdraws the permission.
    w.clear();
    assert!(!w.allows_unregistered());
}

#[test]
fn the_rdma_path_registers_caller_memory_for_the_batch_merging_pages() {
    let fabric = Fabric::new();
    let t = |fabric: &Arc<Fabric>, odp: bool| {
        soft_transport(
            fabric,
            Soft {
                odp,
                ..Soft::default()
            },
        )
    };
    let (owner, reader) = (t(&fabric, false), t(&fabric, false));
    let mut src = pattern(3, 1 << 20);
    let sh = unsafe { owner.register(src.as_mut_ptr(), src.len(), Access::RemoteRead) }.unwrap();
    let mut dst = vec![0u8; 1 << 20];
    let mut b = Batch::new();
    // 16 ops into one caller buffer, each scattered into two segments (header + payload).
    for i in 0..16u64 {
        let off = i as usize * 65536;
        let (h, p) = (
            unreg(&mut dst, off, 64),
            unreg(&mut dst, off + 64, 65536 - 64),
        );
        b.push(
            RemoteRange {
                region: sh.key(),
                addr: sh.addr(i * 65536),
                len: 65536,
            },
            &[h, p],
        );
    }
    unsafe { b.allow_unregistered() };
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(dst == src, "lazily registered read differs");
    let s = reader.rdma_stats().unwrap();
    assert_eq!(s.read_bytes, 1 << 20, "carried one-sided");
    assert_eq!(s.fallbacks, 0);
    assert_eq!(
        s.lazy_registrations, 1,
        "32 segments of one buffer: one registration"
    );
    assert_eq!(
        fabric.local_registrations_at(dst.as_ptr() as u64),
        2,
        "one per rail"
    );
    // The registration is cached: the next batch into the same buffer registers nothing.
    dst.fill(0);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()));
    assert!(dst == src);
    let s = reader.rdma_stats().unwrap();
    assert_eq!(
        (s.lazy_registrations, s.lazy_mr_hits, s.lazy_mrs),
        (1, 1, 1),
        "{s:?}"
    );
    // The caller says the buffer goes: its registration is released, and a later batch
    // into that memory registers it afresh.
    reader.forget_local(dst.as_ptr(), dst.len());
    assert_eq!(reader.rdma_stats().unwrap().lazy_mrs, 0);
    assert_eq!(fabric.local_registrations_at(dst.as_ptr() as u64), 0);
    dst.fill(0);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()));
    assert!(dst == src);
    let s = reader.rdma_stats().unwrap();
    assert_eq!((s.lazy_registrations, s.lazy_mrs), (2, 1));

    // A reader whose devices have implicit on-demand paging registers nothing at all.
    let odp = t(&fabric, true);
    dst.fill(0);
    let r = odp.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(dst == src);
    let s = odp.rdma_stats().unwrap();
    assert_eq!((s.read_bytes, s.lazy_registrations), (1 << 20, 0));
    drop(sh);
}

#[test]
fn the_lazy_registration_cache_is_bounded_and_its_oldest_entries_go_first() {
    let fabric = Fabric::new();
    let (owner, reader) = (
        soft_transport(&fabric, Soft::default()),
        soft_transport(&fabric, Soft::default()),
    );
    let mut src = pattern(5, 8192);
    let sh = unsafe { owner.register(src.as_mut_ptr(), src.len(), Access::RemoteRead) }.unwrap();
    // More separate caller buffers than the cache keeps, each read into once.
    let n = peercache_transport::rdma::mr_cache::MAX_ENTRIES + 44;
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; 8192]).collect();
    let read_into = |buf: &mut Vec<u8>| {
        let mut b = Batch::new();
        let seg = unreg(buf, 0, 8192);
        b.push(
            RemoteRange {
                region: sh.key(),
                addr: sh.addr(0),
                len: 8192,
            },
            &[seg],
        );
        unsafe { b.allow_unregistered() };
        let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
        assert!(r[0].is_ok(), "{r:?}");
        assert!(buf[..] == src[..]);
    };
    for buf in bufs.iter_mut() {
        read_into(buf);
    }
    let s = reader.rdma_stats().unwrap();
    assert_eq!(s.lazy_registrations, n as u64);
    assert_eq!(
        s.lazy_mrs,
        peercache_transport::rdma::mr_cache::MAX_ENTRIES as u64
    );
    // The first buffers were the least recently used: released, on the fabric too.
    assert_eq!(fabric.local_registrations_at(bufs[0].as_ptr() as u64), 0);
    assert_eq!(
        fabric.local_registrations_at(bufs[n - 1].as_ptr() as u64),
        2,
        "one per rail"
    );
    // The newest is still cached: reading into it again registers nothing.
    bufs[n - 1].fill(0);
    read_into(&mut bufs[n - 1]);
    let s = reader.rdma_stats().unwrap();
    assert_eq!((s.lazy_registrations, s.lazy_mr_hits), (n as u64, 1));
    drop(sh);
}

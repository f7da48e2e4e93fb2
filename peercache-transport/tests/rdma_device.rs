//! Device memory (GPUDirect) through the RDMA path on the software backend. A memfd stands in
//! for the GPU driver's dma-buf export, addressed by an iova this process never maps, so any
//! CPU access to a device region outside the (mapped) RDMA path would fault: the TCP plane must
//! refuse such regions on both sides, and registration must name what is missing.
// Every unsafe block registers memory (a test buffer or a memfd) that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use peercache_transport::rdma::soft::Fabric;
use peercache_transport::{
    Access, Batch, DeviceMemory, OpError, RemoteRange, Segment, Transport, TransportError,
};

const LEN: usize = 1 << 20;
/// Addresses in the (unmapped) upper part of the user address space, as GPU VAs would be.
const IOVA_SRC: u64 = 0x6000_0000_0000;
const IOVA_DST: u64 = 0x6100_0000_0000;

mod common;
use common::{cfg, pattern, rdma_transport};

/// A memfd of `LEN` bytes holding `bytes` (the "device memory" and its exporter's fd).
fn memfd(bytes: &[u8]) -> OwnedFd {
    let fd = unsafe { libc::memfd_create(c"peercache-test-dmabuf".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    assert_eq!(
        unsafe { libc::ftruncate(fd.as_raw_fd(), LEN as libc::off_t) },
        0
    );
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    assert_eq!(n as usize, bytes.len());
    fd
}

fn contents(fd: &OwnedFd) -> Vec<u8> {
    let mut out = vec![0u8; LEN];
    let n = unsafe { libc::pread(fd.as_raw_fd(), out.as_mut_ptr().cast(), LEN, 0) };
    assert_eq!(n as usize, LEN);
    out
}

fn dmabuf(fd: &OwnedFd, iova: u64) -> DeviceMemory {
    DeviceMemory::Dmabuf {
        fd: fd.as_raw_fd(),
        offset: 0,
        len: LEN,
        iova,
    }
}

#[test]
fn device_regions_are_read_and_written_one_sided_and_never_over_tcp() {
    let fabric = Fabric::new();
    let owner = rdma_transport(&fabric);
    let reader = rdma_transport(&fabric);

    // The owner publishes device memory; the reader reads it into host memory.
    let want = pattern(1, LEN);
    let src_fd = memfd(&want);
    let src =
        unsafe { owner.register_device(dmabuf(&src_fd, IOVA_SRC), Access::RemoteRead) }.unwrap();
    assert_eq!(src.base(), IOVA_SRC);
    let mut host = vec![0u8; LEN];
    let host_h = unsafe { reader.register(host.as_mut_ptr(), LEN, Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    for i in 0..16u64 {
        b.push(
            RemoteRange {
                region: src.key(),
                addr: IOVA_SRC + i * 65536,
                len: 65536,
            },
            &[Segment {
                region: host_h.key(),
                addr: host_h.addr(i * 65536),
                len: 65536,
            }],
        );
    }
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(host == want, "device → host read differs");
    assert_eq!(reader.stats().rdma_read_bytes, LEN as u64);

    // The reader reads host memory of the owner straight into its own device memory.
    let mut owner_host = pattern(2, LEN);
    let oh = unsafe { owner.register(owner_host.as_mut_ptr(), LEN, Access::RemoteRead) }.unwrap();
    let dst_fd = memfd(&[]);
    let dst =
        unsafe { reader.register_device(dmabuf(&dst_fd, IOVA_DST), Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    b.push(
        RemoteRange {
            region: oh.key(),
            addr: oh.addr(4096),
            len: 8192,
        },
        // Scattered into two device segments, as header + payload would be.
        &[
            Segment {
                region: dst.key(),
                addr: IOVA_DST,
                len: 64,
            },
            Segment {
                region: dst.key(),
                addr: IOVA_DST + 1000,
                len: 8192 - 64,
            },
        ],
    );
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    let got = contents(&dst_fd);
    assert_eq!(&got[..64], &owner_host[4096..4096 + 64]);
    assert_eq!(
        &got[1000..1000 + 8192 - 64],
        &owner_host[4096 + 64..4096 + 8192]
    );

    // A peer without RDMA asks for the device region over TCP: refused per op (the owner's
    // TCP server never touches it), with the access-denied code.
    let tcp_only = Transport::start(cfg(), None).unwrap();
    let mut buf = vec![0u8; 4096];
    let bh = unsafe { tcp_only.register(buf.as_mut_ptr(), 4096, Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    b.push(
        RemoteRange {
            region: src.key(),
            addr: IOVA_SRC,
            len: 4096,
        },
        &[Segment {
            region: bh.key(),
            addr: bh.addr(0),
            len: 4096,
        }],
    );
    let r = tcp_only.read_batch(owner.local_endpoint(), &b).unwrap();
    assert_eq!(r[0], Err(OpError::AccessDenied(src.key())));

    // A read into device memory from a peer that has no RDMA falls back to TCP, which refuses
    // the device destination locally instead of writing through an unmapped address.
    let mut plain_src = pattern(3, 4096);
    let ps =
        unsafe { tcp_only.register(plain_src.as_mut_ptr(), 4096, Access::RemoteRead) }.unwrap();
    let mut b = Batch::new();
    b.push(
        RemoteRange {
            region: ps.key(),
            addr: ps.addr(0),
            len: 4096,
        },
        &[Segment {
            region: dst.key(),
            addr: IOVA_DST,
            len: 4096,
        }],
    );
    let r = reader.read_batch(tcp_only.local_endpoint(), &b).unwrap();
    assert_eq!(r[0], Err(OpError::DeviceOnly(dst.key())));

    // Dropping the handles deregisters (and unmaps) the device regions.
    drop((src, dst, host_h, oh, bh, ps));
    drop((owner_host, plain_src, buf));
}

#[test]
fn device_registration_names_what_is_missing() {
    // No RDMA path: the error says device memory needs RDMA.
    let tcp = Transport::start(cfg(), None).unwrap();
    let fd = memfd(&[]);
    match unsafe { tcp.register_device(dmabuf(&fd, IOVA_SRC), Access::LocalOnly) } {
        Err(TransportError::Device(why)) => assert!(why.contains("only over RDMA"), "{why}"),
        other => panic!("{other:?}"),
    }
    let fabric = Fabric::new();
    let t = rdma_transport(&fabric);
    // Device memory is never remotely writable (writes go over TCP, which cannot reach it).
    match unsafe { t.register_device(dmabuf(&fd, IOVA_SRC), Access::RemoteReadWrite) } {
        Err(TransportError::Device(why)) => assert!(why.contains("remote-read"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A bad fd: the backend's mapping error, and the table keeps no half-registered region.
    let bad = DeviceMemory::Dmabuf {
        fd: -1,
        offset: 0,
        len: LEN,
        iova: IOVA_SRC,
    };
    match unsafe { t.register_device(bad, Access::LocalOnly) } {
        Err(TransportError::Device(why)) => assert!(why.contains("dma-buf"), "{why}"),
        other => panic!("{other:?}"),
    }
    let ok = unsafe { t.register_device(dmabuf(&fd, IOVA_SRC), Access::LocalOnly) };
    assert!(
        ok.is_ok(),
        "the failed attempt left the range registered: {ok:?}"
    );
}

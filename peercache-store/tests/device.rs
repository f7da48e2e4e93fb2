//! Reads into device (GPU) memory on the software RDMA fabric (`rdma_backend = "soft"`): a memfd
//! stands in for the GPU driver's dma-buf, addressed by an iova this process never maps, so any
//! CPU access to it outside the RDMA path would fault. Pages land one-sided, byte-exact, verified
//! by the two-header check; this node's own pages and TCP peers are misses; the host paths refuse
//! device segments; a TCP node refuses device memory with a typed error.
// Every unsafe block registers or reads through memory (a memfd, a test buffer) that outlives
// the call.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use peercache_store::{DeviceMemory, RawSeg, StoreError};
use serde_json::json;

mod common;
use common::{free_port, node};

const LEN: usize = 4 << 20;
/// An address in the unmapped upper part of the user address space, as a GPU VA would be.
const IOVA: u64 = 0x6200_0000_0000;
const PAGE: usize = 64 << 10;

fn memfd() -> OwnedFd {
    let fd = unsafe { libc::memfd_create(c"peercache-store-dmabuf".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    assert_eq!(
        unsafe { libc::ftruncate(fd.as_raw_fd(), LEN as libc::off_t) },
        0
    );
    fd
}

fn read_back(fd: &OwnedFd, off: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let n = unsafe {
        libc::pread(
            fd.as_raw_fd(),
            out.as_mut_ptr().cast(),
            len,
            off as libc::off_t,
        )
    };
    assert_eq!(n as usize, len);
    out
}

fn page(i: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|b| (b as u64 * 31 + i as u64 * 7919) as u8)
        .collect()
}

fn dmabuf(fd: &OwnedFd) -> DeviceMemory {
    DeviceMemory::Dmabuf {
        fd: fd.as_raw_fd(),
        offset: 0,
        len: LEN,
        iova: IOVA,
    }
}

/// Page `j` of a device read lands at `IOVA + j * PAGE`, in two segments (K and V halves).
fn device_segs(pages: usize) -> (Vec<RawSeg>, Vec<usize>) {
    let mut segs = Vec::new();
    for j in 0..pages {
        let base = IOVA + (j * PAGE) as u64;
        for half in 0..2u64 {
            segs.push(RawSeg {
                ptr: (base + half * (PAGE / 2) as u64) as *mut u8,
                len: PAGE / 2,
            });
        }
    }
    (segs, vec![2; pages])
}

#[test]
fn pages_land_in_device_memory_one_sided_and_verified() {
    let (owner, reader, tcp) = common::soft_rdma_and_tcp(200, json!({}));
    let keys: Vec<String> = (0..8).map(|i| format!("dev-{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..8).map(page).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(owner.batch_set(&keys, &refs).unwrap().iter().all(|&x| x));
    let mine = vec!["dev-mine".to_string()];
    assert!(reader.batch_set(&mine, &[page(50).as_slice()]).unwrap()[0]);
    let theirs = vec!["dev-tcp".to_string()];
    assert!(tcp.batch_set(&theirs, &[page(60).as_slice()]).unwrap()[0]);

    let fd = memfd();
    unsafe { reader.register_device_buffer(dmabuf(&fd)) }.unwrap();
    let (segs, counts) = device_segs(keys.len());
    let got = unsafe { reader.batch_get_device(&keys, &segs, &counts) }.unwrap();
    assert_eq!(got, vec![Some(PAGE as u32); keys.len()]);
    for (j, want) in pages.iter().enumerate() {
        assert_eq!(&read_back(&fd, j * PAGE, PAGE), want, "page {j}");
    }
    let st = reader.stats();
    assert!(st.rdma_read_bytes >= (keys.len() * PAGE) as u64);
    assert_eq!(st.verify_rejects, 0);

    // This node's own page and a TCP-only peer's page are misses here (the caller reads them
    // into host memory); a key nobody holds is a miss; nothing is written for them.
    let before = read_back(&fd, 0, 3 * PAGE);
    let probe = vec![mine[0].clone(), theirs[0].clone(), "dev-absent".to_string()];
    let (segs, counts) = device_segs(3);
    let got = unsafe { reader.batch_get_device(&probe, &segs, &counts) }.unwrap();
    assert_eq!(got, vec![None, None, None]);
    assert_eq!(read_back(&fd, 0, 3 * PAGE), before);
}

#[test]
fn device_segments_are_refused_where_the_cpu_would_touch_them() {
    let port = free_port();
    let rdma = json!({"protocol": "rdma", "rdma_backend": "soft", "host_local": false});
    let a = node(203, 203, port, rdma);
    let fd = memfd();
    unsafe { a.register_device_buffer(dmabuf(&fd)) }.unwrap();
    let (segs, counts) = device_segs(1);
    // The host read and write paths would copy with the CPU: a clear error, nothing touched.
    match unsafe { a.batch_get_raw(&["k"], &segs, &counts) } {
        Err(StoreError::BadRequest(m)) => assert!(m.contains("batch_get_device"), "{m}"),
        other => panic!("host read into device memory: {other:?}"),
    }
    match unsafe { a.batch_set_raw(&["k"], &segs, &counts) } {
        Err(StoreError::BadRequest(m)) => assert!(m.contains("device memory"), "{m}"),
        other => panic!("publish from device memory: {other:?}"),
    }
    // A device read whose segment lies outside every registered device region.
    let mut host = vec![0u8; PAGE];
    let stray = [RawSeg {
        ptr: host.as_mut_ptr(),
        len: PAGE,
    }];
    match unsafe { a.batch_get_device(&["k"], &stray, &[1]) } {
        Err(StoreError::BadRequest(m)) => {
            assert!(m.contains("outside every registered device region"), "{m}")
        }
        other => panic!("stray segment: {other:?}"),
    }
    // Mismatched counts are refused like on the host path.
    assert!(matches!(
        unsafe { a.batch_get_device(&["k", "l"], &segs, &counts) },
        Err(StoreError::BadRequest(_))
    ));
}

#[test]
fn a_tcp_node_refuses_device_memory_and_says_why() {
    let port = free_port();
    let a = node(204, 204, port, json!({"protocol": "tcp"}));
    let fd = memfd();
    match unsafe { a.register_device_buffer(dmabuf(&fd)) } {
        Err(StoreError::Transport(e)) => {
            let m = e.to_string();
            assert!(m.contains("only over RDMA"), "{m}");
        }
        other => panic!("device memory on a TCP node: {other:?}"),
    }
}

#[test]
fn a_cached_location_of_a_reused_slot_is_a_miss_on_the_device_path() {
    let port = free_port();
    let rdma = json!({"protocol": "rdma", "rdma_backend": "soft", "host_local": false});
    // A 4 MiB pool of 1 MiB pages: the third page reuses the first page's slot.
    let mut wcfg = rdma.clone();
    wcfg["global_segment_size"] = json!("4mb");
    let mut rcfg = rdma;
    rcfg["directory_read_cache_ttl"] = json!(30.0);
    let w = node(205, 205, port, wcfg);
    let r = node(206, 205, port, rcfg);
    common::settle(&[&w, &r]);
    let big = |i: u8| vec![i; 1 << 20];
    assert!(w.batch_set(&["X"], &[big(1).as_slice()]).unwrap()[0]);
    let fd = memfd();
    unsafe { r.register_device_buffer(dmabuf(&fd)) }.unwrap();
    let seg = [RawSeg {
        ptr: IOVA as *mut u8,
        len: 1 << 20,
    }];
    assert_eq!(
        unsafe { r.batch_get_device(&["X"], &seg, &[1]) }.unwrap(),
        vec![Some(1 << 20)]
    );
    assert_eq!(read_back(&fd, 0, 1 << 20), big(1));
    // X's location is cached on r; Z lands in X's old slot.
    assert!(w.batch_set(&["Y"], &[big(2).as_slice()]).unwrap()[0]);
    assert!(w.batch_set(&["Z"], &[big(3).as_slice()]).unwrap()[0]);
    assert!(w.flush_evictions(Duration::from_secs(5)));
    // The stale location is read (the NIC lands whatever the slot holds) but never served:
    // the header fetched with it names another key.
    let got = unsafe { r.batch_get_device(&["X"], &seg, &[1]) }.unwrap();
    assert_eq!(got, vec![None], "a reused slot must be a miss");
    assert_eq!(r.stats().verify_rejects, 1, "caught by the header check");
    // The stale entry left the cache: the next read asks the directory, where X is gone.
    assert_eq!(
        unsafe { r.batch_get_device(&["X"], &seg, &[1]) }.unwrap(),
        vec![None]
    );
    assert_eq!(r.stats().verify_rejects, 1);
}

//! The host-local path: a reader on the same host maps the owner's shared regions and copies
//! from them (no data-server work), falls back to TCP for anything not shared, re-attaches when
//! the owner's shared set changes, and stops reading a region once its owner dropped it.
// Every unsafe block registers (or maps) test memory that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::net::SocketAddr;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use peercache_transport::{
    Access, Batch, OpError, RegionHandle, RemoteRange, Segment, Transport, TransportConfig,
    TransportError,
};

mod common;
use common::{cfg, pattern};

/// A memory file of `len` bytes mapped read-write, like the pool's `MemfdAlloc`: `sealed`
/// makes it as the pool does (sealed against resizing, then — after the owner's mapping —
/// against writes, with `fd` a read-only descriptor); `writable_fd` keeps the read-write one.
struct SharedMem {
    fd: OwnedFd,
    writable_fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
}

impl SharedMem {
    fn new(len: usize, seal: bool) -> Self {
        let raw = unsafe {
            libc::memfd_create(
                c"test".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        assert!(raw >= 0);
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        assert_eq!(unsafe { libc::ftruncate(raw, len as libc::off_t) }, 0);
        if seal {
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) }, 0);
        }
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        if seal {
            let seals = libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
            assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) }, 0);
        }
        let ro = std::fs::File::open(format!("/proc/self/fd/{raw}")).unwrap();
        SharedMem {
            fd: OwnedFd::from(ro),
            writable_fd: fd,
            ptr: p as *mut u8,
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    fn ptr_bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn on(ip: [u8; 4], host_local: bool) -> Transport {
    Transport::start(
        TransportConfig {
            bind: SocketAddr::from((ip, 0)),
            host_local,
            ..cfg()
        },
        None,
    )
    .unwrap()
}

/// `n` ops of `page` bytes each from `h`, into consecutive ranges of `dst` (registered `d`).
fn reads(h: &RegionHandle, d: &RegionHandle, n: u64, page: u32) -> Batch {
    let mut b = Batch::new();
    for i in 0..n {
        b.push(
            RemoteRange {
                region: h.key(),
                addr: h.addr(i * page as u64),
                len: page,
            },
            &[Segment {
                region: d.key(),
                addr: d.addr(i * page as u64),
                len: page,
            }],
        );
    }
    b
}

/// Reads `b` from `peer` and asserts every op succeeded.
fn read_ok(reader: &Transport, peer: SocketAddr, b: &Batch) {
    let r = reader.read_batch(peer, b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
}

/// Waits, with a deadline, until reads from `owner` take the host-local path.
fn wait_attached(reader: &Transport, owner: SocketAddr) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !reader.host_local_attached(owner) {
        assert!(
            std::time::Instant::now() < until,
            "no host-local attach to {owner}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Reads `b` once over the network (which starts the attach in the background) and waits
/// until reads from `owner` take the host-local path.
fn attach(reader: &Transport, owner: SocketAddr, b: &Batch) {
    read_ok(reader, owner, b);
    wait_attached(reader, owner);
}

const PAGE: u32 = 64 << 10;
const LEN: usize = 1 << 20;

/// An owner on 127.0.0.`ips[0]` sharing `LEN` bytes of pattern `seed` (region `h`), and a
/// reader on 127.0.0.`ips[1]` with a registered `LEN`-byte destination (`d`, over `dst`).
struct Pair {
    d: RegionHandle,
    h: RegionHandle,
    owner: Transport,
    reader: Transport,
    dst: Vec<u8>,
    mem: SharedMem,
}

fn pair(ips: [u8; 2], seed: u64) -> Pair {
    let owner = on([127, 0, 0, ips[0]], true);
    let reader = on([127, 0, 0, ips[1]], true);
    let mut mem = SharedMem::new(LEN, true);
    mem.bytes().copy_from_slice(&pattern(seed, LEN));
    let h = unsafe { owner.register(mem.ptr, LEN, Access::RemoteRead) }.unwrap();
    owner.share(&h, mem.fd.as_fd(), 0).unwrap();
    let mut dst = vec![0u8; LEN];
    let d = unsafe { reader.register(dst.as_mut_ptr(), LEN, Access::LocalOnly) }.unwrap();
    Pair {
        d,
        h,
        owner,
        reader,
        dst,
        mem,
    }
}

#[test]
fn same_host_reads_copy_from_shared_memory_and_never_touch_the_data_server() {
    let Pair {
        d,
        h,
        owner,
        reader,
        mut dst,
        mut mem,
    } = pair([1, 2], 7);
    let b = reads(&h, &d, 16, PAGE);
    // The first read goes over TCP and starts the attach.
    attach(&reader, owner.local_endpoint(), &b);
    assert_eq!(owner.stats().served_ops, 16);
    dst.fill(0);
    read_ok(&reader, owner.local_endpoint(), &b);
    assert!(
        dst == mem.bytes()[..],
        "the pages read are the pages written"
    );
    let (rs, os) = (reader.stats(), owner.stats());
    assert_eq!(rs.local_read_ops, 16);
    assert_eq!(rs.local_read_bytes, 16 * PAGE as u64);
    assert_eq!(rs.read_bytes, 32 * PAGE as u64, "counted as reads too");
    assert_eq!((rs.local_attaches, rs.local_peers), (1, 1));
    assert_eq!(
        os.served_ops, 16,
        "the owner's data server did no more work"
    );
    assert_eq!(os.local_leases, 1);

    // The owner rewrites a page: the next read sees the new bytes (the mapping is live).
    mem.bytes()[..PAGE as usize].fill(0xab);
    read_ok(&reader, owner.local_endpoint(), &b);
    assert!(dst[..PAGE as usize].iter().all(|x| *x == 0xab));
    assert_eq!(
        reader.stats().local_attaches,
        1,
        "one attachment serves every batch"
    );

    // Bad ops are refused per op, like the TCP server would, and write nothing.
    let mut bad = Batch::new();
    let seg = Segment {
        region: d.key(),
        addr: d.addr(0),
        len: PAGE,
    };
    bad.push(
        RemoteRange {
            region: h.key(),
            addr: h.addr(LEN as u64 - 100),
            len: PAGE,
        },
        &[seg],
    );
    bad.push(
        RemoteRange {
            region: h.key(),
            addr: h.addr(0),
            len: 0,
        },
        &[],
    );
    bad.push(
        RemoteRange {
            region: h.key(),
            addr: h.addr(0),
            len: PAGE,
        },
        &[Segment { len: 10, ..seg }],
    );
    dst.fill(0);
    let r = reader.read_batch(owner.local_endpoint(), &bad).unwrap();
    assert!(matches!(r[0], Err(OpError::OutOfRegion { .. })), "{r:?}");
    assert!(matches!(r[1], Err(OpError::BadLength { .. })), "{r:?}");
    assert!(matches!(r[2], Err(OpError::LengthMismatch { .. })), "{r:?}");
    assert!(dst.iter().all(|x| *x == 0));
}

#[test]
fn unshared_regions_and_peers_without_the_path_go_over_tcp() {
    let owner = on([127, 0, 0, 3], true);
    let reader = on([127, 0, 0, 4], true);
    let mut mem = SharedMem::new(LEN, true);
    mem.bytes().copy_from_slice(&pattern(8, LEN));
    let shared = unsafe { owner.register(mem.ptr, LEN, Access::RemoteRead) }.unwrap();
    owner.share(&shared, mem.fd.as_fd(), 0).unwrap();
    let mut plain = pattern(9, LEN);
    let unshared = unsafe { owner.register(plain.as_mut_ptr(), LEN, Access::RemoteRead) }.unwrap();
    let mut dst = vec![0u8; LEN];
    let d = unsafe { reader.register(dst.as_mut_ptr(), LEN, Access::LocalOnly) }.unwrap();

    // A batch naming a region the owner does not share goes to the data server.
    read_ok(
        &reader,
        owner.local_endpoint(),
        &reads(&unshared, &d, 8, PAGE),
    );
    assert!(dst[..8 * PAGE as usize] == plain[..8 * PAGE as usize]);
    assert_eq!(owner.stats().served_ops, 8);
    // Attached now (the shared region), that region still goes to the data server.
    wait_attached(&reader, owner.local_endpoint());
    read_ok(
        &reader,
        owner.local_endpoint(),
        &reads(&unshared, &d, 8, PAGE),
    );
    assert_eq!(owner.stats().served_ops, 16);
    assert_eq!(reader.stats().local_read_ops, 0);

    // A reader with the path off, and an owner with it off, both stay on TCP.
    let tcp_reader = on([127, 0, 0, 4], false);
    let mut dst2 = vec![0u8; LEN];
    let d2 = unsafe { tcp_reader.register(dst2.as_mut_ptr(), LEN, Access::LocalOnly) }.unwrap();
    read_ok(
        &tcp_reader,
        owner.local_endpoint(),
        &reads(&shared, &d2, 4, PAGE),
    );
    assert!(dst2[..4 * PAGE as usize] == mem.bytes()[..4 * PAGE as usize]);
    assert_eq!(owner.stats().served_ops, 20);
    assert_eq!(tcp_reader.stats().local_attaches, 0);

    let tcp_owner = on([127, 0, 0, 3], false);
    let mut mem2 = SharedMem::new(LEN, true);
    mem2.bytes().copy_from_slice(&pattern(10, LEN));
    let h2 = unsafe { tcp_owner.register(mem2.ptr, LEN, Access::RemoteRead) }.unwrap();
    tcp_owner.share(&h2, mem2.fd.as_fd(), 0).unwrap();
    read_ok(
        &reader,
        tcp_owner.local_endpoint(),
        &reads(&h2, &d, 4, PAGE),
    );
    assert!(dst[..4 * PAGE as usize] == mem2.bytes()[..4 * PAGE as usize]);
    assert_eq!(tcp_owner.stats().served_ops, 4);
    drop((d, d2));
}

#[test]
fn a_dropped_region_is_never_read_from_the_old_mapping() {
    let Pair {
        d,
        h,
        owner,
        reader,
        dst: _dst,
        mem,
    } = pair([5, 6], 11);
    let b = reads(&h, &d, 4, PAGE);
    attach(&reader, owner.local_endpoint(), &b);
    read_ok(&reader, owner.local_endpoint(), &b);
    assert_eq!(reader.stats().local_read_ops, 4);

    // The owner deregisters: its leases close, the reader drops its mapping and asks the data
    // server, which does not know the region either.
    drop(h);
    assert_eq!(owner.stats().local_leases, 0);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(
        r.iter()
            .all(|x| matches!(x, Err(OpError::UnknownRegion(_)))),
        "{r:?}"
    );
    assert_eq!(
        reader.stats().local_read_ops,
        4,
        "no read from the stale mapping"
    );

    // A newly shared region is found by attaching again.
    let h = unsafe { owner.register(mem.ptr, LEN, Access::RemoteRead) }.unwrap();
    owner.share(&h, mem.fd.as_fd(), 0).unwrap();
    let b = reads(&h, &d, 4, PAGE);
    attach(&reader, owner.local_endpoint(), &b);
    read_ok(&reader, owner.local_endpoint(), &b);
    assert_eq!(reader.stats().local_read_ops, 8);

    // The owner stops: the reader drops its mapping (which would keep the owner's memory
    // alive) without reading again, and its next batch fails instead of reading stale memory.
    owner.shutdown();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while reader.stats().local_peers != 0 {
        assert!(
            std::time::Instant::now() < until,
            "mapping kept after the owner stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let r = reader.read_batch(owner.local_endpoint(), &b);
    assert!(r.is_err(), "{r:?}");
    assert_eq!(reader.stats().local_read_ops, 8);
}

#[test]
fn only_sealed_files_and_authenticated_peers_share() {
    let owner = on([127, 0, 0, 7], true);
    let mut unsealed = SharedMem::new(LEN, false);
    let h = unsafe { owner.register(unsealed.ptr, LEN, Access::RemoteRead) }.unwrap();
    assert!(matches!(
        owner.share(&h, unsealed.fd.as_fd(), 0),
        Err(TransportError::Register(_))
    ));
    let mut sealed = SharedMem::new(LEN, true);
    sealed.bytes().fill(3);
    let h2 = unsafe { owner.register(sealed.ptr, LEN / 2, Access::RemoteRead) }.unwrap();
    assert!(
        owner.share(&h2, sealed.fd.as_fd(), LEN as u64).is_err(),
        "past the file's end"
    );
    assert!(
        matches!(
            owner.share(&h2, sealed.writable_fd.as_fd(), 0),
            Err(TransportError::Register(_))
        ),
        "a read-write descriptor is never handed to peers"
    );
    owner.share(&h2, sealed.fd.as_fd(), 0).unwrap();
    let _ = unsealed.bytes();

    // A peer without the cluster secret neither attaches nor reads.
    let stranger = Transport::start(
        TransportConfig {
            bind: SocketAddr::from(([127, 0, 0, 8], 0)),
            ..TransportConfig::default()
        },
        None,
    )
    .unwrap();
    let mut dst = vec![0u8; LEN];
    let d = unsafe { stranger.register(dst.as_mut_ptr(), LEN, Access::LocalOnly) }.unwrap();
    let r = stranger.read_batch(owner.local_endpoint(), &reads(&h2, &d, 2, PAGE));
    assert!(r.is_err(), "{r:?}");
    assert_eq!(stranger.stats().local_attaches, 0);
    assert!(dst.iter().all(|x| *x == 0));
    assert_eq!(owner.stats().local_leases, 0);
}

/// Minor page faults of the calling thread so far.
fn thread_minor_faults() -> i64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    u.ru_minflt
}

/// Once attached, the reader maps every page of the owner's shared region in behind the
/// reads (`MADV_POPULATE_READ`): a copy of pages never read before then takes no page fault.
#[test]
fn a_same_host_view_is_mapped_in_ahead_so_a_read_takes_no_page_fault() {
    let Pair {
        d,
        h,
        owner,
        reader,
        mut dst,
        mem,
    } = pair([9, 10], 11);
    // One page over TCP starts the attach.
    attach(&reader, owner.local_endpoint(), &reads(&h, &d, 1, PAGE));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while reader.stats().local_populated_bytes < LEN as u64 {
        assert!(
            std::time::Instant::now() < until,
            "view not populated: {:?}",
            reader.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // Every page of the destination is written once first: only the source could fault.
    dst.fill(1);
    let b = reads(&h, &d, (LEN / PAGE as usize) as u64, PAGE);
    let before = thread_minor_faults();
    read_ok(&reader, owner.local_endpoint(), &b);
    let faults = thread_minor_faults() - before;
    assert!(
        dst == mem.ptr_bytes(),
        "the pages read are the pages written"
    );
    assert_eq!(reader.stats().local_read_ops, LEN as u64 / u64::from(PAGE));
    // Mapped lazily, the same read faults 17 times here (once per 64 KiB, the kernel's
    // fault-around), and once per 4 KiB page without fault-around.
    assert!(
        faults < 4,
        "{faults} page faults reading 1 MiB from the view"
    );
}

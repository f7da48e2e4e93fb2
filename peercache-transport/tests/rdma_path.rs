//! The RDMA path behind the TCP transport's API, on the software backend: two transports share
//! a software fabric; queue pairs are bootstrapped over the owner's real data port (after the
//! authenticated handshake) and the region table with its rkeys comes from there too. Reads go
//! one-sided through the engine (the owner's TCP server serves nothing), bad ops get the same
//! typed errors as over TCP, and peers without RDMA are read over TCP.
// Every unsafe block in this file registers a test buffer that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::sync::Arc;

use peercache_transport::rdma::soft::Fabric;
use peercache_transport::{Access, Batch, OpError, RemoteRange, Transport};

mod common;
use common::{Region, Soft, cfg, rdma_transport, region, remote, seg, soft_transport};

#[test]
fn reads_go_one_sided_byte_exact_with_tcp_typed_errors() {
    let fabric = Fabric::new();
    let owner = rdma_transport(&fabric);
    let reader = rdma_transport(&fabric);
    let src = region(&owner, 1 << 20, Access::RemoteRead, 1);
    let mut dst = region(&reader, 1 << 20, Access::LocalOnly, 2);
    let mut b = Batch::new();
    for i in 0..8u64 {
        // Each op scatters into two local segments (header + payload, as the store does).
        b.push(
            remote(&src.h, i * 65536, 65536),
            &[
                seg(&dst.h, i * 65536, 64),
                seg(&dst.h, i * 65536 + 64, 65536 - 64),
            ],
        );
    }
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(&dst.mem[..8 * 65536], &src.mem[..8 * 65536]);
    let s = reader.stats();
    assert_eq!((s.rdma_read_ops, s.rdma_read_bytes), (8, 8 * 65536));
    assert_eq!(s.rdma_fallbacks, 0);
    assert_eq!(
        owner.stats().served_ops,
        0,
        "the owner's CPU served no byte"
    );
    assert!(fabric.bytes.load(std::sync::atomic::Ordering::Relaxed) >= 8 * 65536);

    // The same per-op errors as over TCP, checked against the owner's table.
    dst.mem.fill(0);
    let mut b = Batch::new();
    b.push(remote(&src.h, 0, 4096), &[seg(&dst.h, 0, 4096)]);
    b.push(
        remote(&src.h, (1 << 20) - 100, 4096),
        &[seg(&dst.h, 4096, 4096)],
    );
    b.push(remote(&src.h, 8192, 4096), &[seg(&dst.h, 8192, 100)]);
    b.push(
        RemoteRange {
            region: peercache_transport::RegionKey(0xdead),
            addr: 0,
            len: 4096,
        },
        &[seg(&dst.h, 12288, 4096)],
    );
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert_eq!(r[0], Ok(()));
    assert!(matches!(r[1], Err(OpError::OutOfRegion { .. })), "{r:?}");
    assert!(matches!(r[2], Err(OpError::LengthMismatch { .. })), "{r:?}");
    assert!(matches!(r[3], Err(OpError::UnknownRegion(_))), "{r:?}");
    assert_eq!(&dst.mem[..4096], &src.mem[..4096]);
    assert!(
        dst.mem[4096..16384].iter().all(|&x| x == 0),
        "nothing landed for failed ops"
    );
}

#[test]
fn a_region_dropped_by_its_owner_is_an_error_not_stale_bytes() {
    let fabric = Fabric::new();
    let owner = rdma_transport(&fabric);
    let reader = rdma_transport(&fabric);
    let src = region(&owner, 65536, Access::RemoteRead, 3);
    let dst = region(&reader, 65536, Access::LocalOnly, 4);
    let mut b = Batch::new();
    b.push(remote(&src.h, 0, 4096), &[seg(&dst.h, 0, 4096)]);
    assert_eq!(
        reader.read_batch(owner.local_endpoint(), &b).unwrap(),
        vec![Ok(())]
    );
    let stale = remote(&src.h, 0, 4096);
    drop(src); // deregistered from the fabric; the reader still caches its rkey
    let mut b = Batch::new();
    b.push(stale, &[seg(&dst.h, 0, 4096)]);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    // The NIC refuses the stale rkey: a typed error (and a counted op error), never bytes.
    assert_eq!(r, vec![Err(OpError::AccessDenied(stale.region))]);
    assert_eq!(reader.stats().op_errors, 1);
}

#[test]
fn peers_without_rdma_and_unregistered_destinations_are_read_over_tcp() {
    let fabric = Fabric::new();
    let reader = rdma_transport(&fabric);
    let plain = Transport::start(cfg(), None).unwrap();
    let src = region(&plain, 65536, Access::RemoteRead, 5);
    let dst = region(&reader, 65536, Access::LocalOnly, 6);
    let mut b = Batch::new();
    b.push(remote(&src.h, 0, 8192), &[seg(&dst.h, 0, 8192)]);
    let r = reader.read_batch(plain.local_endpoint(), &b).unwrap();
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(&dst.mem[..8192], &src.mem[..8192]);
    let s = reader.stats();
    assert_eq!(s.rdma_read_ops, 0);
    assert_eq!(s.rdma_fallbacks, 1);
    assert_eq!(
        plain.stats().served_ops,
        1,
        "served by the peer's TCP server"
    );
    // The peer is left on TCP for a while, counted once, and listed with the reason.
    let on_tcp = reader.rdma_peers_on_tcp();
    assert_eq!(on_tcp.len(), 1, "{on_tcp:?}");
    assert_eq!(on_tcp[0].peer, plain.local_endpoint());
    assert!(
        on_tcp[0].why.starts_with("region table:"),
        "{}",
        on_tcp[0].why
    );
    assert!(on_tcp[0].retry_in > std::time::Duration::from_secs(20));
    let rdma = reader.rdma_stats().unwrap();
    assert_eq!((rdma.peers_unavailable, rdma.table_fetches), (1, 1));
    // A second batch does not ask the plain peer again (it is remembered for a while).
    let r = reader.read_batch(plain.local_endpoint(), &b).unwrap();
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(reader.stats().rdma_fallbacks, 2);
    let rdma = reader.rdma_stats().unwrap();
    assert_eq!((rdma.peers_unavailable, rdma.table_fetches), (1, 1));
}

/// A guard that admits only writes from node "w" (the TCP server runs it; a NIC cannot).
#[derive(Debug)]
struct OnlyW;

impl peercache_transport::WriteGuard for OnlyW {
    fn allow_write(
        &self,
        peer: Option<&peercache_wire::NodeId>,
        _addr: u64,
        _len: u64,
        _done_by: std::time::Instant,
    ) -> bool {
        peer.is_some_and(|p| p.as_str() == "w")
    }
}

fn transport_with_writes(fabric: &Arc<Fabric>, rdma_writes: bool) -> Transport {
    soft_transport(
        fabric,
        Soft {
            rdma_writes,
            ..Soft::default()
        },
    )
}

#[test]
fn writes_go_one_sided_only_when_both_sides_enable_rdma_writes() {
    let fabric = Fabric::new();
    let owner = transport_with_writes(&fabric, true);
    let mut target = vec![0u8; 1 << 20];
    let th = unsafe { owner.register_guarded(target.as_mut_ptr(), target.len(), Arc::new(OnlyW)) }
        .unwrap();
    let write = |t: &Transport, src: &Region, off: u64| {
        let mut b = Batch::new();
        for i in 0..4u64 {
            b.push(
                remote(&th, off + i * 8192, 8192),
                &[seg(&src.h, i * 8192, 8192)],
            );
        }
        t.write_batch(owner.local_endpoint(), &b).unwrap()
    };

    // Both sides enable it: the bytes land one-sided, the owner's TCP server serves nothing.
    let w = transport_with_writes(&fabric, true);
    let src = region(&w, 1 << 16, Access::LocalOnly, 7);
    let r = write(&w, &src, 0);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(&target[..4 * 8192], &src.mem[..4 * 8192]);
    assert_eq!(owner.stats().served_ops, 0);
    let s = w.stats();
    assert_eq!((s.rdma_write_ops, s.rdma_write_bytes), (4, 4 * 8192));

    // A writer without it goes over TCP, where the guard refuses an anonymous writer.
    let plain = transport_with_writes(&fabric, false);
    let src2 = region(&plain, 1 << 16, Access::LocalOnly, 8);
    let r = write(&plain, &src2, 65536);
    assert!(matches!(r[0], Err(OpError::AccessDenied(_))), "{r:?}");
    assert_eq!(plain.stats().rdma_write_ops, 0);

    // An owner without it registers the region read-only on the NIC: an RDMA-writing peer
    // falls back to TCP and meets the guard there.
    let strict = transport_with_writes(&fabric, false);
    let mut t2 = vec![0u8; 1 << 16];
    let th2 =
        unsafe { strict.register_guarded(t2.as_mut_ptr(), t2.len(), Arc::new(OnlyW)) }.unwrap();
    let mut b = Batch::new();
    b.push(remote(&th2, 0, 8192), &[seg(&src.h, 0, 8192)]);
    let r = w.write_batch(strict.local_endpoint(), &b).unwrap();
    assert!(matches!(r[0], Err(OpError::AccessDenied(_))), "{r:?}");
    assert!(t2.iter().all(|b| *b == 0), "nothing was written");
    assert_eq!(w.stats().rdma_write_ops, 4, "no further one-sided write");
    drop((th, th2));
    drop((target, t2));
}

/// A region longer than the registration chunk is registered in chunks (the first before
/// `register` returns, the rest on a thread): once they are all in, every page of every chunk
/// is read one-sided with its chunk's keys, byte-exact; an op across two chunks (no single
/// registration covers it) goes over TCP, byte-exact too; dropping the region deregisters
/// every chunk.
#[test]
fn a_region_registered_in_chunks_is_read_one_sided_chunk_by_chunk() {
    const CHUNK: u64 = 64 << 10;
    let fabric = Fabric::new();
    let opts = Soft {
        chunk: CHUNK,
        ..Soft::default()
    };
    let (owner, path) = common::soft_transport_and_path(&fabric, opts);
    let reader = rdma_transport(&fabric);
    let src = region(&owner, 16 * CHUNK as usize, Access::RemoteRead, 5);
    common::wait_for(
        std::time::Duration::from_secs(10),
        "every chunk registered",
        || {
            let (done, all) = path.registration();
            done == all
        },
    );
    assert_eq!(path.registration(), (16 * CHUNK, 16 * CHUNK));
    let mut dst = region(&reader, 16 * CHUNK as usize, Access::LocalOnly, 6);
    let mut b = Batch::new();
    for i in 0..16u64 {
        // The middle 4 KiB of each chunk.
        let at = i * CHUNK + CHUNK / 2;
        b.push(remote(&src.h, at, 4096), &[seg(&dst.h, at, 4096)]);
    }
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    for i in 0..16usize {
        let at = i * CHUNK as usize + CHUNK as usize / 2;
        assert_eq!(
            &dst.mem[at..at + 4096],
            &src.mem[at..at + 4096],
            "chunk {i}"
        );
    }
    let s = reader.stats();
    assert_eq!((s.rdma_read_ops, s.rdma_fallbacks), (16, 0), "{s:?}");
    assert_eq!(
        owner.stats().served_ops,
        0,
        "the owner's CPU served no byte"
    );

    // Across the boundary of chunks 2 and 3: no rkey covers it, so TCP carries it.
    dst.mem.fill(0);
    let at = 3 * CHUNK - 2048;
    let mut b = Batch::new();
    b.push(remote(&src.h, at, 4096), &[seg(&dst.h, at, 4096)]);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert_eq!(r, vec![Ok(())]);
    let at = at as usize;
    assert_eq!(&dst.mem[at..at + 4096], &src.mem[at..at + 4096]);
    assert_eq!(reader.stats().rdma_fallbacks, 1);
    assert_eq!(owner.stats().served_ops, 1, "served over TCP");

    drop(src);
    assert_eq!(path.registration(), (0, 0), "every chunk deregistered");

    // Dropped while its chunks may still be registering: the thread stops, and nothing stays.
    let gone = region(&owner, 64 * CHUNK as usize, Access::RemoteRead, 7);
    drop(gone);
    assert_eq!(path.registration(), (0, 0));
}

/// Memory resident up to a mark the test moves, as a warming pool reports it.
#[derive(Default)]
struct Warming {
    mark: parking_lot::Mutex<u64>,
    moved: parking_lot::Condvar,
}

impl Warming {
    fn resident_up_to(&self, bytes: u64) {
        *self.mark.lock() = bytes;
        self.moved.notify_all();
    }
}

impl peercache_transport::Residency for Warming {
    fn wait_resident(&self, offset: u64, len: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut mark = self.mark.lock();
        while *mark < offset + len {
            if self.moved.wait_until(&mut mark, deadline).timed_out() {
                return *mark >= offset + len;
            }
        }
        true
    }
}

#[test]
fn a_region_still_warming_registers_each_chunk_only_once_its_memory_is_in() {
    use peercache_transport::RegionOptions;
    use std::time::{Duration, Instant};
    const CHUNK: u64 = 64 << 10;
    let fabric = Fabric::new();
    let opts = Soft {
        chunk: CHUNK,
        ..Soft::default()
    };
    let (owner, path) = common::soft_transport_and_path(&fabric, opts);
    let reader = rdma_transport(&fabric);
    let warming = Arc::new(Warming::default());
    let mut mem = common::pattern(8, 8 * CHUNK as usize);
    let resident: Arc<dyn peercache_transport::Residency> = warming.clone();
    let options = RegionOptions::new(Access::RemoteRead).resident_when(resident);
    let src = unsafe { owner.register_with(mem.as_mut_ptr(), mem.len(), options) }.unwrap();
    assert_eq!(
        path.registration(),
        (0, 8 * CHUNK),
        "nothing is registered before its memory is in, not even the first chunk"
    );
    let mut dst = region(&reader, 8 * CHUNK as usize, Access::LocalOnly, 9);
    let read_chunk = |dst: &mut Region, i: u64| {
        let at = i * CHUNK + 4096;
        let mut b = Batch::new();
        b.push(remote(&src, at, 4096), &[seg(&dst.h, at, 4096)]);
        assert_eq!(
            reader.read_batch(owner.local_endpoint(), &b).unwrap(),
            vec![Ok(())]
        );
        let at = at as usize;
        assert_eq!(&dst.mem[at..at + 4096], &mem[at..at + 4096], "chunk {i}");
    };
    // Nothing registered: the read goes over TCP, byte-exact.
    read_chunk(&mut dst, 0);
    assert_eq!(reader.stats().rdma_read_ops, 0);
    assert_eq!(reader.stats().rdma_fallbacks, 1);

    // Three chunks in: exactly those are registered, the thread waits for the fourth.
    warming.resident_up_to(3 * CHUNK);
    common::wait_for(Duration::from_secs(10), "three chunks registered", || {
        path.registration().0 >= 3 * CHUNK
    });
    assert_eq!(path.registration(), (3 * CHUNK, 8 * CHUNK));
    // The reader fetches the table again (at most every 200 ms while it waits for chunks)
    // and then reads a registered chunk one-sided.
    common::wait_for(Duration::from_secs(10), "chunk 1 read over RDMA", || {
        read_chunk(&mut dst, 1);
        reader.stats().rdma_read_ops > 0
    });
    // A chunk not in yet still goes over TCP.
    let before = reader.stats().rdma_fallbacks;
    read_chunk(&mut dst, 5);
    assert_eq!(reader.stats().rdma_fallbacks, before + 1);

    warming.resident_up_to(8 * CHUNK);
    common::wait_for(Duration::from_secs(10), "every chunk registered", || {
        path.registration().0 == 8 * CHUNK
    });
    drop(src);
    assert_eq!(path.registration(), (0, 0));

    // A region whose memory never comes in: dropping it stops the waiting thread promptly.
    let never: Arc<dyn peercache_transport::Residency> = Arc::new(Warming::default());
    let options = RegionOptions::new(Access::RemoteRead).resident_when(never);
    let h = unsafe { owner.register_with(mem.as_mut_ptr(), mem.len(), options) }.unwrap();
    let t = Instant::now();
    drop(h);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(path.registration(), (0, 0));

    // A region of one chunk, not in at `register`: the table lists it with no chunk ready (a
    // reader reads it over TCP, never takes it for unknown), and once it is in, one-sided.
    let single = Arc::new(Warming::default());
    let resident: Arc<dyn peercache_transport::Residency> = single.clone();
    let options = RegionOptions::new(Access::RemoteRead).resident_when(resident);
    let one = unsafe { owner.register_with(mem.as_mut_ptr(), CHUNK as usize, options) }.unwrap();
    assert_eq!(path.registration(), (0, CHUNK));
    let (rdma_before, fallbacks_before) =
        (reader.stats().rdma_read_ops, reader.stats().rdma_fallbacks);
    let read_one = |dst: &mut Region| {
        let mut b = Batch::new();
        b.push(remote(&one, 8192, 4096), &[seg(&dst.h, 8192, 4096)]);
        assert_eq!(
            reader.read_batch(owner.local_endpoint(), &b).unwrap(),
            vec![Ok(())]
        );
        assert_eq!(&dst.mem[8192..12288], &mem[8192..12288]);
    };
    read_one(&mut dst);
    assert_eq!(reader.stats().rdma_read_ops, rdma_before);
    assert_eq!(reader.stats().rdma_fallbacks, fallbacks_before + 1);
    single.resident_up_to(CHUNK);
    common::wait_for(
        Duration::from_secs(10),
        "the single chunk read over RDMA",
        || {
            read_one(&mut dst);
            reader.stats().rdma_read_ops > rdma_before
        },
    );
    assert_eq!(path.registration(), (CHUNK, CHUNK));
    drop(one);
    assert_eq!(path.registration(), (0, 0));
}

//! TCP transport over real loopback sockets.
// Every unsafe block in this file registers a test buffer that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use peercache_transport::{
    Access, Batch, OpError, RegionHandle, RemoteRange, Segment, Transport, TransportConfig,
    TransportError,
};

fn cfg(timeout_ms: u64) -> TransportConfig {
    TransportConfig {
        op_timeout: Duration::from_millis(timeout_ms),
        suspect_for: Duration::from_millis(500),
        ..TransportConfig::default()
    }
}

mod common;
use common::pattern;

struct Node {
    t: Transport,
    mem: Vec<u8>,
    h: RegionHandle,
}

fn node(len: usize, access: Access, seed: u64) -> Node {
    let t = Transport::start(cfg(2000), None).unwrap();
    let mut mem = pattern(seed, len);
    // SAFETY: `mem` lives in the same struct as the handle and is dropped after it.
    let h = unsafe { t.register(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
    Node { t, mem, h }
}

fn seg(h: &RegionHandle, off: u64, len: u32) -> Segment {
    Segment {
        region: h.key(),
        addr: h.addr(off),
        len,
    }
}

fn remote(h: &RegionHandle, off: u64, len: u32) -> RemoteRange {
    RemoteRange {
        region: h.key(),
        addr: h.addr(off),
        len,
    }
}

#[test]
fn reads_are_byte_exact_at_several_sizes_and_segment_counts() {
    let owner = node(8 << 20, Access::RemoteRead, 1);
    let reader = node(8 << 20, Access::LocalOnly, 2);
    let peer = owner.t.local_endpoint();
    for &len in &[1u32, 4096, 12345, 128 << 10, 1 << 20] {
        let mut b = Batch::new();
        // Op 0: one segment. Op 1: three uneven segments scattered across the buffer.
        b.push(remote(&owner.h, 100, len), &[seg(&reader.h, 0, len)]);
        let a = len / 3;
        let c = len / 5;
        let rest = len - a - c;
        b.push(
            remote(&owner.h, 3 << 20, len),
            &[
                seg(&reader.h, 7 << 20, a),
                seg(&reader.h, 4 << 20, rest),
                seg(&reader.h, 2 << 20, c),
            ],
        );
        let res = reader.t.read_batch(peer, &b).unwrap();
        assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
        let l = len as usize;
        assert_eq!(&reader.mem[..l], &owner.mem[100..100 + l]);
        let src = &owner.mem[3 << 20..(3 << 20) + l];
        let (a, c, rest) = (a as usize, c as usize, rest as usize);
        assert_eq!(&reader.mem[7 << 20..(7 << 20) + a], &src[..a]);
        assert_eq!(&reader.mem[4 << 20..(4 << 20) + rest], &src[a..a + rest]);
        assert_eq!(&reader.mem[2 << 20..(2 << 20) + c], &src[a + rest..]);
    }
    assert_eq!(
        reader.t.stats().connects,
        1,
        "one connection reused for every batch"
    );
}

#[test]
fn writes_land_byte_exact_only_in_writable_regions() {
    let target = node(4 << 20, Access::RemoteReadWrite, 3);
    let readonly = node(1 << 20, Access::RemoteRead, 4);
    let src = node(4 << 20, Access::LocalOnly, 5);
    let mut b = Batch::new();
    b.push(
        remote(&target.h, 4096, 256 << 10),
        &[seg(&src.h, 0, 64 << 10), seg(&src.h, 1 << 20, 192 << 10)],
    );
    let res = src.t.write_batch(target.t.local_endpoint(), &b).unwrap();
    assert_eq!(res, vec![Ok(())]);
    let got = &target.mem[4096..4096 + (256 << 10)];
    assert_eq!(&got[..64 << 10], &src.mem[..64 << 10]);
    assert_eq!(&got[64 << 10..], &src.mem[1 << 20..(1 << 20) + (192 << 10)]);

    let before = readonly.mem.clone();
    let mut b = Batch::new();
    b.push(remote(&readonly.h, 0, 4096), &[seg(&src.h, 0, 4096)]);
    let res = src.t.write_batch(readonly.t.local_endpoint(), &b).unwrap();
    assert_eq!(res, vec![Err(OpError::AccessDenied(readonly.h.key()))]);
    assert_eq!(readonly.mem, before, "a read-only region must not change");
}

#[test]
fn bad_ops_get_typed_errors_and_the_connection_survives() {
    let owner = node(1 << 20, Access::RemoteRead, 6);
    let local_only = {
        let mut v = vec![0u8; 4096];
        let h = unsafe { owner.t.register(v.as_mut_ptr(), v.len(), Access::LocalOnly) }.unwrap();
        (v, h)
    };
    let reader = node(1 << 20, Access::LocalOnly, 7);
    let peer = owner.t.local_endpoint();
    let bogus = peercache_transport::RegionKey(12345);
    let mut b = Batch::new();
    b.push(remote(&owner.h, 0, 4096), &[seg(&reader.h, 0, 4096)]);
    b.push(
        RemoteRange {
            region: bogus,
            addr: 0,
            len: 4096,
        },
        &[seg(&reader.h, 4096, 4096)],
    );
    b.push(
        remote(&owner.h, (1 << 20) - 100, 4096),
        &[seg(&reader.h, 8192, 4096)],
    );
    b.push(
        remote(&local_only.1, 0, 4096),
        &[seg(&reader.h, 12288, 4096)],
    );
    b.push(remote(&owner.h, 8192, 4096), &[seg(&reader.h, 16384, 100)]);
    b.push(remote(&owner.h, 4096, 4096), &[seg(&reader.h, 20480, 4096)]);
    let res = reader.t.read_batch(peer, &b).unwrap();
    assert_eq!(res[0], Ok(()));
    assert_eq!(res[1], Err(OpError::UnknownRegion(bogus)));
    assert!(
        matches!(res[2], Err(OpError::OutOfRegion { .. })),
        "{:?}",
        res[2]
    );
    assert_eq!(res[3], Err(OpError::AccessDenied(local_only.1.key())));
    assert!(matches!(
        res[4],
        Err(OpError::LengthMismatch {
            segments: 100,
            remote: 4096
        })
    ));
    assert_eq!(res[5], Ok(()));
    assert_eq!(&reader.mem[20480..24576], &owner.mem[4096..8192]);
    // Same connection still serves.
    let res = reader.t.read_batch(peer, &b).unwrap();
    assert_eq!(res[5], Ok(()));
    assert_eq!(reader.t.stats().connects, 1);
    assert_eq!(reader.t.stats().conn_discards, 0);
    assert!(owner.t.stats().served_errors >= 6);
    drop(local_only);
}

#[test]
fn deregistered_region_is_unknown_to_peers() {
    let owner = node(1 << 20, Access::RemoteRead, 8);
    let reader = node(1 << 20, Access::LocalOnly, 9);
    let mut extra = vec![7u8; 8192];
    let h = unsafe {
        owner
            .t
            .register(extra.as_mut_ptr(), extra.len(), Access::RemoteRead)
    }
    .unwrap();
    let key = h.key();
    let r = remote(&h, 0, 8192);
    let mut b = Batch::new();
    b.push(r, &[seg(&reader.h, 0, 8192)]);
    assert_eq!(
        reader.t.read_batch(owner.t.local_endpoint(), &b).unwrap(),
        vec![Ok(())]
    );
    drop(h);
    assert_eq!(
        reader.t.read_batch(owner.t.local_endpoint(), &b).unwrap(),
        vec![Err(OpError::UnknownRegion(key))]
    );
    extra.clear();
}

#[test]
fn silent_peer_times_out_within_deadline_and_is_suspect() {
    // Accepts connections (kernel backlog) and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer: SocketAddr = silent.local_addr().unwrap();
    let t = Transport::start(cfg(300), None).unwrap();
    let mut mem = vec![0u8; 4096];
    let h = unsafe { t.register(mem.as_mut_ptr(), mem.len(), Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    b.push(
        RemoteRange {
            region: peercache_transport::RegionKey(1),
            addr: 0,
            len: 4096,
        },
        &[seg(&h, 0, 4096)],
    );
    let t0 = Instant::now();
    let err = t.read_batch(peer, &b).unwrap_err();
    let took = t0.elapsed();
    assert!(
        matches!(
            err,
            TransportError::Connect { .. } | TransportError::Timeout { .. }
        ),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(250),
        "gave up too early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(600),
        "deadline overrun: {took:?}"
    );
    eprintln!("silent peer: timed out after {took:?} (op_timeout 300 ms)");
    // The next call fails fast instead of waiting another full deadline.
    let t1 = Instant::now();
    let again = t.read_batch(peer, &b).unwrap_err();
    assert!(matches!(again, TransportError::Suspect { .. }), "{again:?}");
    assert!(t1.elapsed() < Duration::from_millis(20));
    assert_eq!(t.stats().suspect_marks, 1);
    drop(silent);
}

#[test]
fn stall_after_handshake_marks_suspect_and_fails_fast() {
    // A peer that completes the handshake and then never answers a request.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = l.local_addr().unwrap();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        for _ in 0..1 {
            let (mut s, _) = l.accept().unwrap();
            peercache_wire::handshake::server_sync(
                &mut s,
                &peercache_wire::handshake::Acceptor {
                    planes: vec![peercache_wire::handshake::Plane::Data],
                    node: None,
                    incarnation: peercache_wire::Incarnation(1),
                    auth: peercache_wire::Auth::none(),
                },
                Duration::from_secs(5),
            )
            .unwrap();
            held.push(s);
        }
        // Hold the stalled connection until the test has seen what it needs.
        let _ = release_rx.recv();
        drop(held);
    });
    let t = Transport::start(cfg(300), None).unwrap();
    let mut mem = vec![0u8; 4096];
    let h = unsafe { t.register(mem.as_mut_ptr(), mem.len(), Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    b.push(
        RemoteRange {
            region: peercache_transport::RegionKey(1),
            addr: 0,
            len: 4096,
        },
        &[seg(&h, 0, 4096)],
    );
    let t0 = Instant::now();
    let err = t.read_batch(peer, &b).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(600),
        "{took:?}"
    );
    eprintln!("stalled peer: timed out after {took:?} (op_timeout 300 ms)");
    let t1 = Instant::now();
    let err = t.read_batch(peer, &b).unwrap_err();
    assert!(matches!(err, TransportError::Suspect { .. }), "{err:?}");
    assert!(t1.elapsed() < Duration::from_millis(20));
    let s = t.stats();
    assert_eq!(s.timeouts, 1);
    assert_eq!(s.suspect_marks, 1);
    assert_eq!(s.suspect_rejects, 1);
    release_tx.send(()).unwrap();
    server.join().unwrap();
}

#[test]
fn many_threads_read_one_peer_concurrently() {
    let owner = node(16 << 20, Access::RemoteRead, 10);
    let peer = owner.t.local_endpoint();
    let reader = std::sync::Arc::new(node(8 * (1 << 20), Access::LocalOnly, 11));
    let threads: Vec<_> = (0..8u64)
        .map(|tid| {
            let reader = reader.clone();
            let owner_key = owner.h.key();
            let owner_base = owner.h.base();
            let expect: Vec<u8> = owner.mem.clone();
            std::thread::spawn(move || {
                let page = 32u32 << 10;
                let dst_base = tid * (1 << 20);
                let mut b = Batch::new();
                for round in 0..40u64 {
                    b.clear();
                    for i in 0..32u64 {
                        let src_off = ((round * 32 + i + tid * 7) % 500) * page as u64;
                        b.push(
                            RemoteRange {
                                region: owner_key,
                                addr: owner_base + src_off,
                                len: page,
                            },
                            &[seg(&reader.h, dst_base + i * page as u64, page)],
                        );
                    }
                    let res = reader.t.read_batch(peer, &b).unwrap();
                    assert!(res.iter().all(|r| r.is_ok()));
                    for i in 0..32u64 {
                        let src_off = (((round * 32 + i + tid * 7) % 500) * page as u64) as usize;
                        let d = (dst_base + i * page as u64) as usize;
                        // Threads write disjoint 1 MiB windows; compare through a raw view.
                        let got = unsafe {
                            std::slice::from_raw_parts(reader.mem.as_ptr().add(d), page as usize)
                        };
                        assert_eq!(got, &expect[src_off..src_off + page as usize]);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = reader.t.stats();
    assert_eq!(s.read_ops, 8 * 40 * 32);
    assert!(s.connects <= 16 && s.connects >= 1);
}

#[test]
fn oversize_batches_and_ops_are_rejected_locally() {
    let mut c = cfg(1000);
    c.max_batch_ops = 4;
    c.max_op_bytes = 8192;
    let t = Transport::start(c, None).unwrap();
    let owner = node(1 << 20, Access::RemoteRead, 12);
    let mut mem = vec![0u8; 1 << 16];
    let h = unsafe { t.register(mem.as_mut_ptr(), mem.len(), Access::LocalOnly) }.unwrap();
    let mut b = Batch::new();
    for _ in 0..5 {
        b.push(remote(&owner.h, 0, 16), &[seg(&h, 0, 16)]);
    }
    assert!(matches!(
        t.read_batch(owner.t.local_endpoint(), &b),
        Err(TransportError::BatchTooLarge { ops: 5, max: 4 })
    ));
    let mut b = Batch::new();
    b.push(remote(&owner.h, 0, 16384), &[seg(&h, 0, 16384)]);
    b.push(remote(&owner.h, 0, 0), &[]);
    let res = t.read_batch(owner.t.local_endpoint(), &b).unwrap();
    assert!(matches!(
        res[0],
        Err(OpError::BadLength {
            len: 16384,
            max: 8192
        })
    ));
    assert!(matches!(res[1], Err(OpError::BadLength { len: 0, .. })));
}

#[test]
fn registration_rejects_bad_ranges() {
    let t = Transport::start(cfg(1000), None).unwrap();
    let mut mem = vec![0u8; 4096];
    assert!(unsafe { t.register(std::ptr::null_mut(), 10, Access::LocalOnly) }.is_err());
    assert!(unsafe { t.register(mem.as_mut_ptr(), 0, Access::LocalOnly) }.is_err());
    let h = unsafe { t.register(mem.as_mut_ptr(), 4096, Access::LocalOnly) }.unwrap();
    assert!(matches!(
        unsafe { t.register(mem.as_mut_ptr().wrapping_add(100), 100, Access::LocalOnly) },
        Err(TransportError::Register(_))
    ));
    assert_eq!(t.region_count(), 1);
    drop(h);
    assert_eq!(t.region_count(), 0);
}

//! Encryption in transit on the TCP data plane, seen from a proxy in the middle of real
//! loopback connections.
// Every unsafe block in this file registers a test buffer that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::time::Duration;

use peercache_transport::{Access, Batch, Transport, TransportConfig};
use peercache_wire::Auth;
use peercache_wire::testkit::pattern;
use peercache_wire::testkit::tap::{self, Tap, Way};

const SECRET: &[u8] = b"a-cluster-secret-for-sealed-data";

mod common;
use common::{Region, region, remote, seg};

struct Node {
    t: Transport,
    r: Region,
}

fn node(bind: &str, len: usize, access: Access, seed: u64, requires: bool) -> Node {
    let cfg = TransportConfig {
        bind: bind.parse().unwrap(),
        op_timeout: Duration::from_secs(2),
        suspect_for: Duration::ZERO,
        auth: Auth::from_secret(SECRET)
            .unwrap()
            .requiring_encryption(requires),
        ..TransportConfig::default()
    };
    let t = Transport::start(cfg, None).unwrap();
    let r = region(&t, len, access, seed);
    Node { t, r }
}

/// Whether any of 16 64-byte windows spread over `bytes` shows in the capture.
fn leaked(capture: &[u8], bytes: &[u8]) -> bool {
    let step = (bytes.len() / 16).max(64);
    bytes
        .chunks(step)
        .filter(|c| c.len() >= 64)
        .any(|c| tap::contains(capture, &c[..64]))
}

#[test]
fn sealed_reads_and_writes_are_byte_exact_and_show_no_page_bytes_on_the_path() {
    // The owner requires sealing, the reader only offers it.
    let owner = node("127.0.0.65:0", 4 << 20, Access::RemoteReadWrite, 11, true);
    let reader = node("127.0.0.66:0", 4 << 20, Access::LocalOnly, 12, false);
    let tap = Tap::start("127.0.0.67:0", owner.t.local_endpoint());
    // Sizes inside one record, across records, and a batch of many small ops.
    for &len in &[1u32, 4096, 300 << 10, 1 << 20] {
        let mut b = Batch::new();
        b.push(remote(&owner.r.h, 100, len), &[seg(&reader.r.h, 0, len)]);
        let half = len / 2;
        b.push(
            remote(&owner.r.h, 2 << 20, len),
            &[
                seg(&reader.r.h, 3 << 20, half),
                seg(&reader.r.h, 2 << 20, len - half),
            ],
        );
        // An op outside the region still gets its own error inside a sealed reply.
        b.push(
            remote(&owner.r.h, 4 << 20, 16),
            &[seg(&reader.r.h, 1 << 20, 16)],
        );
        let mut landed = Vec::new();
        let res = reader
            .t
            .read_batch_landing(tap.addr(), &b, &mut |i| landed.push(i))
            .unwrap();
        assert!(
            res[0].is_ok() && res[1].is_ok() && res[2].is_err(),
            "{res:?}"
        );
        assert_eq!(landed, vec![0, 1]);
        let l = len as usize;
        let h = half as usize;
        assert_eq!(&reader.r.mem[..l], &owner.r.mem[100..100 + l]);
        assert_eq!(
            &reader.r.mem[3 << 20..(3 << 20) + h],
            &owner.r.mem[2 << 20..(2 << 20) + h]
        );
        assert_eq!(
            &reader.r.mem[2 << 20..(2 << 20) + l - h],
            &owner.r.mem[(2 << 20) + h..(2 << 20) + l]
        );
    }
    let mut small = Batch::new();
    for i in 0..256u64 {
        small.push(
            remote(&owner.r.h, i * 4096, 512),
            &[seg(&reader.r.h, i * 512, 512)],
        );
    }
    assert!(
        reader
            .t
            .read_batch(tap.addr(), &small)
            .unwrap()
            .iter()
            .all(|r| r.is_ok())
    );
    for i in 0..256usize {
        assert_eq!(
            &reader.r.mem[i * 512..(i + 1) * 512],
            &owner.r.mem[i * 4096..i * 4096 + 512]
        );
    }
    // A write through the tap lands byte-exact.
    let mut w = Batch::new();
    w.push(
        remote(&owner.r.h, 1 << 20, 600 << 10),
        &[seg(&reader.r.h, 0, 600 << 10)],
    );
    assert_eq!(reader.t.write_batch(tap.addr(), &w).unwrap(), vec![Ok(())]);
    let written = reader.r.mem[..600 << 10].to_vec();
    // SAFETY: the transport wrote these bytes before write_batch returned; read them back.
    let landed_bytes =
        unsafe { std::slice::from_raw_parts(owner.r.h.addr(1 << 20) as *const u8, 600 << 10) };
    assert_eq!(landed_bytes, &written[..]);

    let capture = tap.seen();
    assert!(
        capture.len() > 3 << 20,
        "the tap relayed {} bytes",
        capture.len()
    );
    assert!(!leaked(&capture, &owner.r.mem[100..(1 << 20) + 100]));
    assert!(!leaked(&capture, &written));

    // The control: with neither side requiring it, the same read shows its bytes.
    let open_owner = node("127.0.0.68:0", 1 << 20, Access::RemoteRead, 13, false);
    let open_tap = Tap::start("127.0.0.68:0", open_owner.t.local_endpoint());
    let mut b = Batch::new();
    b.push(
        remote(&open_owner.r.h, 0, 64 << 10),
        &[seg(&reader.r.h, 0, 64 << 10)],
    );
    reader.t.read_batch(open_tap.addr(), &b).unwrap();
    assert!(leaked(&open_tap.seen(), &open_owner.r.mem[..64 << 10]));
}

#[test]
fn a_byte_changed_on_the_path_fails_the_batch_and_never_lands() {
    let owner = node("127.0.0.69:0", 1 << 20, Access::RemoteRead, 21, true);
    let reader = node("127.0.0.70:0", 1 << 20, Access::LocalOnly, 22, true);
    let tap = Tap::start("127.0.0.71:0", owner.t.local_endpoint());
    let len = 128u32 << 10;
    let read = |off: u64| {
        let mut b = Batch::new();
        b.push(remote(&owner.r.h, off, len), &[seg(&reader.r.h, 0, len)]);
        reader.t.read_batch(tap.addr(), &b)
    };
    assert!(read(0).unwrap()[0].is_ok());

    // A reply byte flipped inside the payload: the record fails its check, nothing of it is
    // copied out, and the batch is an error.
    let before = reader.r.mem[..len as usize].to_vec();
    tap.flip(Way::ToClient, 1000);
    let res = read(4096);
    assert!(res.is_err() || res.as_ref().unwrap()[0].is_err(), "{res:?}");
    assert_eq!(
        &reader.r.mem[..len as usize],
        &before[..],
        "no byte of the changed reply landed"
    );

    // A request byte flipped: the owner refuses the record and closes that connection
    // unserved; the reader's batch fails or is retried on a fresh connection, byte-exact. (A
    // read first, so the flip lands in a sealed request, not in a new connection's Hello.)
    assert!(read(0).unwrap()[0].is_ok());
    let desyncs = owner.t.stats().server_desyncs;
    tap.flip(Way::ToServer, 10);
    if read(8192).is_ok_and(|r| r[0].is_ok()) {
        assert_eq!(
            &reader.r.mem[..len as usize],
            &owner.r.mem[8192..8192 + len as usize]
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while owner.t.stats().server_desyncs == desyncs {
        assert!(
            std::time::Instant::now() < deadline,
            "the owner did not refuse the record"
        );
        std::thread::yield_now();
    }
    let ok = read(16384).unwrap();
    assert!(ok[0].is_ok());
    assert_eq!(
        &reader.r.mem[..len as usize],
        &owner.r.mem[16384..16384 + len as usize]
    );
}

#[test]
fn a_reader_that_requires_sealing_is_refused_by_an_open_owner() {
    let cfg = TransportConfig {
        bind: "127.0.0.72:0".parse().unwrap(),
        op_timeout: Duration::from_secs(2),
        ..TransportConfig::default()
    };
    let open = Transport::start(cfg, None).unwrap();
    let mut mem = vec![0u8; 4096];
    let h = unsafe { open.register(mem.as_mut_ptr(), mem.len(), Access::RemoteRead) }.unwrap();
    let reader = node("127.0.0.73:0", 4096, Access::LocalOnly, 31, true);
    let mut b = Batch::new();
    b.push(remote(&h, 0, 4096), &[seg(&reader.r.h, 0, 4096)]);
    let err = reader.t.read_batch(open.local_endpoint(), &b).unwrap_err();
    assert!(err.to_string().contains("encryption in transit"), "{err}");
    assert_eq!(&reader.r.mem[..], &pattern(31, 4096)[..]);
    drop(mem);
}

//! The sideway backend on real kernel verbs: soft-RoCE (`rdma_rxe`) in the throwaway guest of
//! `scripts/rdma-lab.sh`, run by the `rdma-verbs` CI stage (`scripts/rdma-verbs.sh`). Ignored
//! elsewhere: they need an RDMA device, named by the lab's environment (`PEERCACHE_LAB_DEVICE`,
//! `PEERCACHE_LAB_GID`, `PEERCACHE_LAB_ADDRS`). Deadlines allow for emulation: a verbs op takes
//! milliseconds under the guest's software CPU.
//!
//! The last two found a real defect the first time they ran: polling through the extended CQ
//! API, a drained completion queue on rxe handed the previous completion back again, so a later
//! batch on a reused queue pair either stalled to its deadline or took a stale success for its
//! own (a read of a deregistered region "succeeded"). The backend polls with `ibv_poll_cq` now.
#![cfg(feature = "rdma")]
// Every unsafe block registers a test buffer that outlives its handle.
#![allow(clippy::undocumented_unsafe_blocks)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use peercache_transport::rdma::path::{PathOptions, RdmaPath, RdmaPlane};
use peercache_transport::rdma::verbs::{SidewayVerbs, VerbsConfig};
use peercache_transport::{Access, Batch, OpError, RemoteRange, Transport, TransportConfig};
use peercache_wire::NodeId;

mod common;
use common::{auth, pattern, region, remote, seg, wait_for};

const LAB: &str = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)";
const DEADLINE: Duration = Duration::from_secs(15);

/// The lab's device, GID index and the two addresses of the guest.
fn lab() -> (String, i32, Vec<IpAddr>) {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: {LAB}"));
    let addrs = var("PEERCACHE_LAB_ADDRS")
        .split_whitespace()
        .map(|a| a.parse().expect("an address"))
        .collect();
    (
        var("PEERCACHE_LAB_DEVICE"),
        var("PEERCACHE_LAB_GID").parse().expect("a GID index"),
        addrs,
    )
}

/// The lab's device opened for node `name`, with a send queue of `sq_depth`.
fn open_verbs(name: &str, sq_depth: u32, max_sge: u32) -> SidewayVerbs {
    let (device, gid, _) = lab();
    SidewayVerbs::open(VerbsConfig {
        devices: vec![device],
        ib_port: 1,
        gid_index: gid,
        sq_depth,
        max_sge,
        node: Some(NodeId::new(name).unwrap()),
        auth: auth(),
        bootstrap_timeout: DEADLINE,
    })
    .expect("the lab's device opens")
}

/// A transport on `addr` whose RDMA path runs on the lab's device.
fn verbs_transport(addr: IpAddr, name: &str, rdma_writes: bool) -> Transport {
    verbs_transport_with(addr, name, rdma_writes, PathOptions::default()).0
}

/// [`verbs_transport`] with the path's `options`, and the path (its registrations).
fn verbs_transport_with(
    addr: IpAddr,
    name: &str,
    rdma_writes: bool,
    options: PathOptions,
) -> (Transport, Arc<RdmaPath<SidewayVerbs>>) {
    let node = NodeId::new(name).unwrap();
    let verbs = open_verbs(name, 128, 16);
    let path = RdmaPath::with_options(verbs, Some(node.clone()), auth(), DEADLINE, options);
    let plane: Arc<dyn RdmaPlane> = path.clone();
    let cfg = TransportConfig {
        bind: SocketAddr::new(addr, 0),
        op_timeout: DEADLINE,
        auth: auth(),
        rdma_writes,
        host_local: false,
        ..TransportConfig::default()
    };
    (
        Transport::start_with_rdma(cfg, Some(node), Some(plane)).unwrap(),
        path,
    )
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn one_sided_reads_and_writes_land_byte_exact_on_kernel_verbs() {
    let (_, _, addrs) = lab();
    let owner = verbs_transport(addrs[0], "owner", true);
    let peer = verbs_transport(addrs[1], "peer", true);
    const PAGE: u32 = 128 << 10;

    // READ: eight 128 KiB pages, each scattered into a header and a payload segment.
    let src = region(&owner, 8 * PAGE as usize, Access::RemoteRead, 1);
    let mut dst = region(&peer, 8 * PAGE as usize, Access::LocalOnly, 2);
    let mut b = Batch::new();
    for i in 0..8u64 {
        let at = i * u64::from(PAGE);
        b.push(
            remote(&src.h, at, PAGE),
            &[seg(&dst.h, at, 64), seg(&dst.h, at + 64, PAGE - 64)],
        );
    }
    let r = peer.read_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(dst.mem == src.mem, "read bytes differ");
    let s = peer.stats();
    assert_eq!(s.rdma_read_ops, 8, "{s:?}");
    assert_eq!(s.rdma_read_bytes, 8 * u64::from(PAGE));
    assert_eq!(s.rdma_fallbacks, 0);
    assert_eq!(
        owner.stats().served_ops,
        0,
        "the owner's CPU served no byte"
    );

    // WRITE: four pages into a region the owner made remote-writable, on the queue pair the
    // reads just used.
    let writer = &peer;
    let sink = region(&owner, 4 * PAGE as usize, Access::RemoteReadWrite, 3);
    let from = region(writer, 4 * PAGE as usize, Access::LocalOnly, 4);
    let mut b = Batch::new();
    for i in 0..4u64 {
        let at = i * u64::from(PAGE);
        b.push(remote(&sink.h, at, PAGE), &[seg(&from.h, at, PAGE)]);
    }
    let r = writer.write_batch(owner.local_endpoint(), &b).unwrap();
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert!(sink.mem == from.mem, "written bytes differ");
    assert_eq!(writer.stats().rdma_write_ops, 4);
    dst.mem.fill(0);
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_stale_rkey_is_refused_by_the_nic_as_a_typed_error_and_the_next_batch_works() {
    let (_, _, addrs) = lab();
    let owner = verbs_transport(addrs[0], "owner-2", false);
    let other = verbs_transport(addrs[0], "other-2", false);
    let reader = verbs_transport(addrs[1], "reader-2", false);
    let src = region(&owner, 65536, Access::RemoteRead, 5);
    let dst = region(&reader, 65536, Access::LocalOnly, 6);
    let mut b = Batch::new();
    b.push(remote(&src.h, 0, 4096), &[seg(&dst.h, 0, 4096)]);
    assert_eq!(
        reader.read_batch(owner.local_endpoint(), &b).unwrap(),
        vec![Ok(())]
    );
    // The owner deregisters the region; the reader still holds its rkey. The NIC answers the
    // read with a remote-access error: a typed, counted error, never stale bytes.
    let stale = remote(&src.h, 0, 4096);
    drop(src);
    let errors = reader.stats().op_errors;
    let mut b = Batch::new();
    b.push(stale, &[seg(&dst.h, 4096, 4096)]);
    let r = reader.read_batch(owner.local_endpoint(), &b);
    match r {
        Ok(v) => assert!(
            matches!(v[0], Err(OpError::AccessDenied(_))),
            "expected access denied, got {v:?}"
        ),
        Err(e) => panic!("the batch failed as a whole: {e}"),
    }
    assert!(
        reader.stats().op_errors > errors,
        "the error was not counted"
    );
    // Another peer's region reads fine right after, over the same device.
    let good = region(&other, 65536, Access::RemoteRead, 7);
    let mut b = Batch::new();
    b.push(remote(&good.h, 0, 65536), &[seg(&dst.h, 0, 65536)]);
    assert_eq!(
        reader.read_batch(other.local_endpoint(), &b).unwrap(),
        vec![Ok(())]
    );
    assert!(dst.mem == good.mem);
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_batch_of_many_after_a_batch_of_one_completes_on_the_same_queue_pair() {
    let (_, _, addrs) = lab();
    let owner = verbs_transport(addrs[0], "owner-3", false);
    let reader = verbs_transport(addrs[1], "reader-3", false);
    let src = region(&owner, 1 << 20, Access::RemoteRead, 8);
    let mut dst = region(&reader, 1 << 20, Access::LocalOnly, 9);
    for n in [1u64, 2, 8] {
        dst.mem.fill(0);
        let mut b = Batch::new();
        for i in 0..n {
            b.push(
                remote(&src.h, i * 4096, 4096),
                &[seg(&dst.h, i * 4096, 4096)],
            );
        }
        let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
        assert!(
            r.iter().all(|x| x.is_ok()),
            "a batch of {n} after smaller ones: {r:?}"
        );
        let k = (n * 4096) as usize;
        assert!(dst.mem[..k] == src.mem[..k]);
    }
}

/// Set in the child process of the kill test: the file it announces its region in.
const CHILD_ENV: &str = "PEERCACHE_LAB_KILL_CHILD";

/// The kill test's child: a transport with one 32 MiB remote-readable region, announced in
/// `file` as "endpoint key base len", served until the parent kills it.
fn serve_until_killed(file: &str) -> ! {
    let (_, _, addrs) = lab();
    let t = verbs_transport(addrs[0], "doomed", false);
    let r = region(&t, 32 << 20, Access::RemoteRead, 11);
    let tmp = format!("{file}.tmp");
    std::fs::write(
        &tmp,
        format!(
            "{} {} {} {}",
            t.local_endpoint(),
            r.h.key().0,
            r.h.addr(0),
            r.mem.len()
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, file).unwrap();
    loop {
        std::thread::park();
    }
}

/// The results of a batch as runs: "0-127 ok, 128 Wc(12), 129-255 flushed".
fn runs_of(ops: &[Result<(), OpError>]) -> String {
    let label = |r: &Result<(), OpError>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("{e:?}"),
    };
    let mut out: Vec<String> = Vec::new();
    let mut start = 0;
    for i in 1..=ops.len() {
        if i == ops.len() || label(&ops[i]) != label(&ops[start]) {
            let l = label(&ops[start]);
            out.push(if i - 1 == start {
                format!("{start} {l}")
            } else {
                format!("{start}-{} {l}", i - 1)
            });
            start = i;
        }
    }
    out.join(", ")
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_peer_killed_mid_batch_fails_the_batch_within_the_deadline_and_the_next_peer_works() {
    if let Ok(file) = std::env::var(CHILD_ENV) {
        serve_until_killed(&file);
    }
    let (_, _, addrs) = lab();
    // The owner is another process, so it can be killed with SIGKILL mid-batch.
    let file = std::env::temp_dir().join(format!("verbs-kill-{}", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "a_peer_killed_mid_batch_fails_the_batch_within_the_deadline_and_the_next_peer_works",
        ])
        .env(CHILD_ENV, &file)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(60), "the child's region", || {
        file.exists()
    });
    let text = std::fs::read_to_string(&file).unwrap();
    let f: Vec<&str> = text.split_whitespace().collect();
    let (endpoint, key, base, len): (SocketAddr, u64, u64, usize) = (
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].parse().unwrap(),
    );
    let expected = pattern(11, len);

    let reader = verbs_transport(addrs[1], "reader-4", false);
    let mut dst = region(&reader, len, Access::LocalOnly, 12);
    dst.mem.fill(0);
    const PAGE: u32 = 128 << 10;
    let pages = len as u64 / u64::from(PAGE);
    let mut b = Batch::new();
    for i in 0..pages {
        let at = i * u64::from(PAGE);
        b.push(
            RemoteRange {
                region: peercache_transport::RegionKey(key),
                addr: base + at,
                len: PAGE,
            },
            &[seg(&dst.h, at, PAGE)],
        );
    }
    let (result, took) = std::thread::scope(|s| {
        let batch = s.spawn(|| {
            let t0 = std::time::Instant::now();
            let r = reader.read_batch(endpoint, &b);
            (r, t0.elapsed())
        });
        // Kill the owner as soon as the first page has landed: the batch is in flight.
        let first = dst.mem.as_ptr();
        wait_for(Duration::from_secs(60), "the first page", || {
            // SAFETY: a volatile read of memory the NIC is writing; only its value is racy.
            (0..64).any(|i| unsafe { std::ptr::read_volatile(first.add(i)) } != 0)
        });
        child.kill().unwrap();
        child.wait().unwrap();
        batch.join().unwrap()
    });
    let _ = std::fs::remove_file(&file);
    // A typed failure, within the deadline plus the bounded drain.
    assert!(
        took < DEADLINE + Duration::from_secs(5),
        "the batch took {took:?}"
    );
    // The batch has returned: the destination is the reader's again.
    let got = &dst.mem;
    match result {
        Err(e) => eprintln!("the batch failed as a whole: {e}"),
        Ok(ops) => {
            let failed = ops.iter().filter(|r| r.is_err()).count();
            let runs = runs_of(&ops);
            assert!(failed > 0, "every op succeeded although the owner died");
            eprintln!("{failed} of {} ops failed: {runs}", ops.len());
            // Ops reported done hold the owner's bytes, never anything else.
            for (i, r) in ops.iter().enumerate() {
                let at = i * PAGE as usize;
                let page = &got[at..at + PAGE as usize];
                let want = &expected[at..at + PAGE as usize];
                if r.is_ok() && page != want {
                    let same = page.iter().zip(want).take_while(|(a, b)| a == b).count();
                    panic!(
                        "op {i} reported done but holds other bytes (first {same} right); ops: {runs}"
                    );
                }
            }
        }
    }
    assert!(
        reader.stats().op_errors + reader.stats().batch_errors > 0,
        "counted"
    );

    // The next batch, to a live peer on the same device, works.
    let other = verbs_transport(addrs[0], "other-4", false);
    let good = region(&other, 1 << 20, Access::RemoteRead, 13);
    let mut b = Batch::new();
    b.push(remote(&good.h, 0, 1 << 20), &[seg(&dst.h, 0, 1 << 20)]);
    assert_eq!(
        reader.read_batch(other.local_endpoint(), &b).unwrap(),
        vec![Ok(())]
    );
    assert!(dst.mem[..1 << 20] == good.mem[..]);
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_queue_pair_runs_with_the_path_mtu_both_ends_negotiated() {
    use peercache_transport::rdma::engine::Verbs;
    let (_, _, addrs) = lab();
    let owner = verbs_transport(addrs[0], "owner-5", false);
    let verbs = open_verbs("reader-5", 16, 4);
    // What the device reports (`ibv_devinfo`'s active_mtu, in bytes), as a verbs code.
    let bytes: u32 = std::env::var("PEERCACHE_LAB_MTU")
        .expect("PEERCACHE_LAB_MTU")
        .parse()
        .expect("bytes");
    let code = (1..=5u8)
        .find(|c| 128u32 << c == bytes)
        .expect("a verbs MTU");
    assert_eq!(verbs.active_mtu(0), code, "the port's active MTU");
    // Both ends run on the same device here, so the smaller of the two is that MTU — not the
    // 4096 an unnegotiated queue pair would assume (rxe over a 1500-byte link offers 1024).
    let qp = verbs
        .connect(&owner.local_endpoint().to_string(), 0)
        .unwrap();
    assert_eq!(qp.path_mtu(), code, "the queue pair's path MTU");
}

#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn lazily_registered_memory_is_cached_and_a_remapped_buffer_is_registered_afresh() {
    use peercache_transport::{RegionKey, Segment};
    let (_, _, addrs) = lab();
    let owner = verbs_transport(addrs[0], "lazy-owner", false);
    let reader = verbs_transport(addrs[1], "lazy-reader", false);
    const LEN: usize = 256 << 10;
    let src = region(&owner, LEN, Access::RemoteRead, 9);
    // Caller memory the transport never registered: an anonymous mapping this test controls.
    let map = |at: *mut libc::c_void, fixed: bool| {
        let flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED } else { 0 };
        let p = unsafe { libc::mmap(at, LEN, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        p
    };
    let p = map(std::ptr::null_mut(), false);
    let view = || unsafe { std::slice::from_raw_parts(p as *const u8, LEN) };
    let read = || {
        let mut b = Batch::new();
        b.push(
            remote(&src.h, 0, LEN as u32),
            &[Segment {
                region: RegionKey::UNREGISTERED,
                addr: p as u64,
                len: LEN as u32,
            }],
        );
        unsafe { b.allow_unregistered() };
        let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    };
    read();
    assert!(view() == &src.mem[..], "lazily registered read differs");
    unsafe { std::ptr::write_bytes(p as *mut u8, 0, LEN) };
    read();
    assert!(view() == &src.mem[..]);
    let s = reader.rdma_stats().unwrap();
    assert_eq!(
        (s.lazy_registrations, s.lazy_mr_hits, s.lazy_mrs),
        (1, 1, 1),
        "{s:?}"
    );
    assert_eq!(reader.stats().rdma_fallbacks, 0);

    // The buffer is unmapped and new memory mapped at the same address: the cached
    // registration still pins the old pages. Whether the NIC's bytes reach the new mapping is
    // the device's business (reported below); the store's checksum catches it if not. Once the
    // caller says the memory went, the next read registers it afresh and lands.
    unsafe { libc::munmap(p, LEN) };
    assert_eq!(map(p, true), p);
    read();
    let stale_landed = view() == &src.mem[..];
    reader.forget_local(p as *const u8, LEN);
    assert_eq!(reader.rdma_stats().unwrap().lazy_mrs, 0);
    unsafe { std::ptr::write_bytes(p as *mut u8, 0, LEN) };
    read();
    assert!(
        view() == &src.mem[..],
        "a read after forget_local lands in the new mapping"
    );
    assert_eq!(reader.rdma_stats().unwrap().lazy_registrations, 2);
    println!(
        "LAB-RESULT {{\"lazy_mr_cache\":\"ok\",\"stale_registration_landed_in_new_mapping\":{stale_landed}}}"
    );
    unsafe { libc::munmap(p, LEN) };
}

/// A region of 256 chunks whose memory is not yet faulted in (as a fresh pool's): `register`
/// returns once the first chunk is registered, and a peer reads that chunk over verbs while the
/// rest are still being registered (each registration faults its chunk in); a chunk not
/// registered when the peer fetched the table is read over TCP meanwhile; once every chunk is
/// in, a page of each is read one-sided with its chunk's rkey. Every page byte-exact.
#[test]
#[ignore = "needs an RDMA device: runs in the soft-RoCE lab (scripts/rdma-verbs.sh)"]
fn a_region_in_chunks_serves_its_first_chunk_over_verbs_while_the_rest_register() {
    const CHUNK: u64 = 2 << 20;
    const CHUNKS: u64 = 256;
    const LEN: usize = (CHUNK * CHUNKS) as usize;
    const PAGE: u32 = 64 << 10;
    let (_, _, addrs) = lab();
    let options = PathOptions {
        register_chunk: CHUNK,
        ..PathOptions::default()
    };
    let (owner, path) = verbs_transport_with(addrs[0], "chunk-owner", false, options);
    let reader = verbs_transport(addrs[1], "chunk-reader", false);
    // 512 MiB mapped and untouched but for the one page per chunk this test reads.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    let mem = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, LEN) };
    let page_of = |chunk: u64| (chunk * CHUNK + CHUNK / 2) as usize;
    for c in 0..CHUNKS {
        let at = page_of(c);
        mem[at..at + PAGE as usize].copy_from_slice(&pattern(100 + c, PAGE as usize));
    }
    // Page c of a batch lands at c * PAGE of the destination.
    let mut dst = region(
        &reader,
        CHUNKS as usize * PAGE as usize,
        Access::LocalOnly,
        13,
    );
    // The reader's queue pair to the owner is up before the big region comes (as between the
    // nodes of a running cluster when one registers a pool): a small region read once.
    let warm = region(&owner, PAGE as usize, Access::RemoteRead, 14);
    let mut b = Batch::new();
    b.push(remote(&warm.h, 0, PAGE), &[seg(&dst.h, 0, PAGE)]);
    let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
    assert_eq!(r, vec![Ok(())]);
    let warm_ops = reader.stats().rdma_read_ops;
    assert_eq!(warm_ops, 1);

    let started = std::time::Instant::now();
    let src = unsafe { owner.register(base as *mut u8, LEN, Access::RemoteRead) }.unwrap();
    let registered_in = started.elapsed();
    let (done, all) = path.registration();
    assert_eq!(
        all,
        LEN as u64 + u64::from(PAGE),
        "the region and the warm-up one"
    );
    assert!(
        done < all,
        "register returned with {done} of {all} bytes registered: the rest are in the background"
    );
    let read = |chunks: &[u64]| {
        let mut b = Batch::new();
        for &c in chunks {
            b.push(
                remote(&src, page_of(c) as u64, PAGE),
                &[seg(&dst.h, c * u64::from(PAGE), PAGE)],
            );
        }
        let r = reader.read_batch(owner.local_endpoint(), &b).unwrap();
        assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    };
    let same = |dst: &[u8], c: u64| {
        let at = (c * u64::from(PAGE)) as usize;
        dst[at..at + PAGE as usize] == pattern(100 + c, PAGE as usize)[..]
    };

    // The first chunk, at once: over verbs.
    read(&[0]);
    let first_read_at = started.elapsed();
    let s = reader.stats();
    assert_eq!(
        (s.rdma_read_ops, s.rdma_fallbacks),
        (warm_ops + 1, 0),
        "{s:?}"
    );
    let (done_then, _) = path.registration();
    assert!(same(&dst.mem, 0), "chunk 0 differs");
    // The last chunk, right away: over TCP if the table did not have it yet, else over verbs.
    read(&[CHUNKS - 1]);
    assert!(same(&dst.mem, CHUNKS - 1), "the last chunk differs");

    wait_for(Duration::from_secs(240), "every chunk registered", || {
        let (done, all) = path.registration();
        done == all
    });
    let all_registered_at = started.elapsed();
    // The reader fetches the table again (at most every 200 ms) until it has every chunk.
    wait_for(DEADLINE, "the last chunk read over verbs", || {
        let before = reader.stats().rdma_read_ops;
        read(&[CHUNKS - 1]);
        reader.stats().rdma_read_ops > before
    });
    dst.mem.fill(0);
    let every: Vec<u64> = (0..CHUNKS).collect();
    let before = reader.stats();
    read(&every);
    let after = reader.stats();
    assert_eq!(
        after.rdma_read_ops - before.rdma_read_ops,
        CHUNKS,
        "{after:?}"
    );
    assert_eq!(after.rdma_fallbacks, before.rdma_fallbacks);
    for c in 0..CHUNKS {
        assert!(same(&dst.mem, c), "chunk {c} differs");
    }
    drop(src);
    drop(warm);
    assert_eq!(path.registration(), (0, 0), "every chunk deregistered");
    unsafe { libc::munmap(base, LEN) };
    println!(
        "LAB-RESULT {{\"chunked_registration\":\"ok\",\"chunks\":{CHUNKS},\"mib\":{},\"register_returned_ms\":{},\"first_read_ms\":{},\"registered_at_first_read_mib\":{},\"all_registered_ms\":{}}}",
        LEN >> 20,
        registered_in.as_millis(),
        first_read_at.as_millis(),
        done_then >> 20,
        all_registered_at.as_millis()
    );
}

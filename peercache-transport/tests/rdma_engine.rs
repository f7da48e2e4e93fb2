//! The RDMA engine's logic on the software backend: multi-rail striping, SGE chunking and
//! posting beyond the send-queue depth, a completion timeout that drains before it returns,
//! and work-completion errors — no NIC needed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peercache_transport::rdma::engine::{Engine, EngineOp, LocalSge, RdmaOp, RdmaOpError};
use peercache_transport::rdma::soft::{Fabric, RailEvent, SoftVerbs};
use smallvec::smallvec;

mod common;

/// `len` pattern bytes for `seed` (argument order of the engine tests).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    common::pattern(seed, len)
}

/// A read of `len` bytes at `remote` into `dst`, as `pieces` equal local segments, whose
/// memory has local key `lkeys[r]` on rail `r`.
fn read_op(remote: u64, rkey: u32, dst: &mut [u8], pieces: usize, lkeys: &[u32]) -> EngineOp {
    let step = dst.len() / pieces;
    EngineOp {
        op: RdmaOp::Read,
        local: (0..pieces)
            .map(|p| {
                let len = if p + 1 == pieces {
                    (dst.len() - p * step) as u32
                } else {
                    step as u32
                };
                LocalSge::new(dst.as_mut_ptr() as u64 + (p * step) as u64, len, lkeys)
            })
            .collect(),
        remote_addr: remote,
        rkeys: smallvec![rkey, rkey],
    }
}

/// One 4 KiB read per page of `local`, from the same offset of `remote` (key `rkey`), whole
/// (one local segment each).
fn page_reads(remote: &[u8], rkey: u32, local: &mut [u8], lk: &[u32]) -> Vec<EngineOp> {
    local
        .chunks_mut(4096)
        .enumerate()
        .map(|(i, d)| read_op(remote.as_ptr() as u64 + (i * 4096) as u64, rkey, d, 1, lk))
        .collect()
}

#[test]
fn ops_stripe_over_rails_and_land_byte_exact() {
    let fabric = Fabric::new();
    let mut remote = pattern(8 * 4096, 1);
    // SAFETY: `remote` outlives every request (the engine drains before returning).
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let verbs = SoftVerbs::new(fabric.clone(), 2, 4, 16);
    let connects = verbs.connects.clone();
    let engine = Engine::new(verbs, 4);
    let mut local = vec![0u8; 8 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 2);
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    let r = engine.execute("peer-a", &ops, Duration::from_secs(1));
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(local, remote);
    assert_eq!(*connects.lock(), vec![1, 1], "both rails carried ops");
    // Channels are pooled: a second batch connects nothing new.
    let r = engine.execute("peer-a", &ops, Duration::from_secs(1));
    assert!(r.iter().all(|x| x.is_ok()));
    assert_eq!(*connects.lock(), vec![1, 1]);
}

#[test]
fn rails_run_at_once_every_window_posted_before_any_rail_is_polled() {
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 21);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 2, 4, 16), 4);
    let mut local = vec![0u8; 4 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 2);
    let mut ops = || -> Vec<EngineOp> { page_reads(&remote, rkey, &mut local, &lk) };
    // Connect both rails' channels first, so only the batch below is timed and recorded.
    let warm = ops();
    assert!(
        engine
            .execute("peer-r", &warm, Duration::from_secs(1))
            .iter()
            .all(|x| x.is_ok())
    );
    // Each rail is a slow link: a request executes 300 ms after it was posted.
    let delay = Duration::from_millis(300);
    for rail in 0..2 {
        fabric.rail_delay_us[rail].store(delay.as_micros() as u64, Ordering::Release);
    }
    fabric.record_events.store(true, Ordering::Release);
    let batch = ops();
    let t0 = Instant::now();
    let r = engine.execute("peer-r", &batch, Duration::from_secs(5));
    let took = t0.elapsed();
    fabric.record_events.store(false, Ordering::Release);
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    let events = fabric.events.lock().clone();
    assert_eq!(
        events[..2],
        [RailEvent::Post(0), RailEvent::Post(1)],
        "both rails' windows are posted before either is polled: {:?}",
        &events[..events.len().min(6)]
    );
    // One delay, not one per rail: the rails' waits overlap.
    assert!(took >= delay, "{took:?}");
    assert!(
        took < 2 * delay,
        "two rails took {took:?}: one after another"
    );
    drop(batch);
    assert_eq!(local, remote);
}

#[test]
fn sge_lists_are_chunked_and_posting_goes_beyond_the_queue_depth() {
    let fabric = Fabric::new();
    let mut remote = pattern(10 * 5000, 2);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    // Two SGEs per request, four requests in flight, one rail.
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 1, 2, 4), 4);
    let mut local = vec![0u8; 10 * 5000];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    // Five segments per op: three requests each, thirty in all.
    let ops: Vec<EngineOp> = local
        .chunks_mut(5000)
        .enumerate()
        .map(|(i, d)| read_op(remote.as_ptr() as u64 + (i * 5000) as u64, rkey, d, 5, &lk))
        .collect();
    let r = engine.execute("peer-b", &ops, Duration::from_secs(1));
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(local, remote);
    assert_eq!(engine.counters.wrs_posted.get(), 30);
}

#[test]
fn a_completion_timeout_drains_the_queue_before_returning() {
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 3);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let verbs = SoftVerbs::new(fabric.clone(), 1, 4, 8);
    let connects = verbs.connects.clone();
    let engine = Engine::new(verbs, 4);
    let mut local = vec![0u8; 4 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    fabric.stall.store(true, Ordering::Release);
    let t0 = Instant::now();
    let r = engine.execute("peer-c", &ops, Duration::from_millis(50));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(50) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(r.iter().all(|x| *x == Err(RdmaOpError::Timeout)), "{r:?}");
    // Nothing is left queued that could still write into `local` once we reuse it.
    assert_eq!(fabric.outstanding.load(Ordering::Acquire), 0);
    fabric.stall.store(false, Ordering::Release);
    assert_eq!(fabric.bytes.load(Ordering::Relaxed), 0, "no late DMA");
    assert!(local.iter().all(|&b| b == 0));
    assert_eq!(engine.counters.timeouts_total(), 1);
    assert_eq!(engine.counters.channel_discards.get(), 1);
    // The failed channel was discarded: the next batch connects a fresh one and succeeds.
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    let r = engine.execute("peer-c", &ops, Duration::from_secs(1));
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(local, remote);
    assert_eq!(*connects.lock(), vec![2]);
}

/// Found on soft-RoCE with a peer killed mid-batch: a batch longer than the send queue is
/// posted a window at a time, and when the first window timed out the ops of the windows never
/// posted were reported as done, their destination untouched.
#[test]
fn ops_of_windows_never_posted_fail_when_an_earlier_window_times_out() {
    let fabric = Fabric::new();
    let mut remote = pattern(6 * 4096, 13);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    // A send queue of 2: six ops are three windows.
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 1, 4, 2), 4);
    let mut local = vec![0u8; 6 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    fabric.stall.store(true, Ordering::Release);
    let r = engine.execute("peer-w", &ops, Duration::from_millis(50));
    fabric.stall.store(false, Ordering::Release);
    assert!(
        r.iter().all(|x| *x == Err(RdmaOpError::Timeout)),
        "every op of the batch timed out, posted or not: {r:?}"
    );
    assert!(local.iter().all(|&b| b == 0));
    assert_eq!(
        engine.counters.wrs_posted.get(),
        2,
        "only the first window was posted"
    );
}

#[test]
fn a_work_completion_error_fails_its_op_and_flushes_the_rest() {
    let fabric = Fabric::new();
    let mut remote = pattern(6 * 1024, 4);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    // The engine's series go to a recorder of this test's own, to read them back.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let engine = metrics::with_local_recorder(&recorder, || {
        Engine::new(SoftVerbs::new(fabric.clone(), 1, 4, 16), 4)
    });
    let mut local = vec![0u8; 6 * 1024];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    let ops: Vec<EngineOp> = local
        .chunks_mut(1024)
        .enumerate()
        .map(|(i, d)| read_op(remote.as_ptr() as u64 + (i * 1024) as u64, rkey, d, 1, &lk))
        .collect();
    fabric.fail_at.store(3, Ordering::Release);
    let r = engine.execute("peer-d", &ops, Duration::from_secs(1));
    assert_eq!(r[0], Ok(()));
    assert_eq!(r[1], Ok(()));
    assert_eq!(r[2], Err(RdmaOpError::Wc(12)));
    assert!(
        r[3..].iter().all(|x| *x == Err(RdmaOpError::Flushed)),
        "{r:?}"
    );
    assert_eq!(&local[..2048], &remote[..2048]);
    assert_eq!(engine.counters.wc_errors_total(), 1);
    assert_eq!(engine.counters.last_wc_status.load(Ordering::Relaxed), 12);
    assert_eq!(fabric.outstanding.load(Ordering::Acquire), 0);
    // One event, counted once, seen under the new counter and under 0.8.4's gauges.
    use metrics_util::debugging::DebugValue;
    let mut seen = std::collections::BTreeMap::new();
    for (k, _, _, v) in snapshotter.snapshot().into_vec() {
        let op = k
            .key()
            .labels()
            .find(|l| l.key() == "op")
            .map(|l| l.value().to_string());
        let value = match v {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(_) => continue,
        };
        seen.insert((k.key().name().to_string(), op), value);
    }
    let at = |name: &str, op: Option<&str>| seen[&(name.to_string(), op.map(str::to_string))];
    assert_eq!(at("peercache_rdma_wc_errors_total", Some("read")), 1.0);
    assert_eq!(at("peercache_rdma_wc_errors_total", Some("write")), 0.0);
    assert_eq!(at("peercache_rdma_read_wc_errors", None), 1.0);
    assert_eq!(at("peercache_rdma_write_wc_errors", None), 0.0);
    assert_eq!(at("peercache_rdma_last_wc_status", None), 12.0);
}

#[test]
fn writes_need_a_writable_remote_region() {
    let fabric = Fabric::new();
    let mut writable = vec![0u8; 4096];
    let mut read_only = vec![0u8; 4096];
    // SAFETY: as above.
    let (w, ro) = unsafe {
        (
            fabric.register(writable.as_mut_ptr(), 4096, true),
            fabric.register(read_only.as_mut_ptr(), 4096, false),
        )
    };
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 1, 4, 16), 4);
    let mut src = pattern(4096, 5);
    let lk = fabric.register_local(src.as_ptr(), src.len(), 1);
    let op = |rkey: u32, addr: u64, src: &mut [u8]| EngineOp {
        op: RdmaOp::Write,
        local: smallvec![LocalSge::new(src.as_mut_ptr() as u64, 4096, &lk)],
        remote_addr: addr,
        rkeys: smallvec![rkey],
    };
    let r = engine.execute(
        "peer-e",
        &[op(w, writable.as_ptr() as u64, &mut src)],
        Duration::from_secs(1),
    );
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(writable, src);
    let r = engine.execute(
        "peer-e",
        &[op(ro, read_only.as_ptr() as u64, &mut src)],
        Duration::from_secs(1),
    );
    assert_eq!(r, vec![Err(RdmaOpError::Wc(10))]);
    assert!(read_only.iter().all(|&b| b == 0));
}

#[test]
fn each_rail_posts_its_own_local_keys() {
    // Two rails are two devices: a local buffer has a different key on each. The engine must
    // post rail r's key on rail r; a key from the other rail is a local protection error.
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 7);
    // SAFETY: `remote` outlives every request (the engine drains before returning).
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 2, 4, 16), 4);
    let mut local = vec![0u8; 4 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 2);
    assert_ne!(lk[0], lk[1]);
    let base = remote.as_ptr() as u64;
    let ops: Vec<EngineOp> = local
        .chunks_mut(4096)
        .enumerate()
        .map(|(i, d)| read_op(base + (i * 4096) as u64, rkey, d, 2, &lk))
        .collect();
    let r = engine.execute("peer-k", &ops, Duration::from_secs(1));
    assert!(r.iter().all(|x| x.is_ok()), "{r:?}");
    assert_eq!(local, remote);
    // Rail 0's key everywhere: the ops striped onto rail 1 fail, rail 0's succeed.
    local.fill(0);
    let wrong = [lk[0], lk[0]];
    let ops: Vec<EngineOp> = local
        .chunks_mut(4096)
        .enumerate()
        .map(|(i, d)| read_op(base + (i * 4096) as u64, rkey, d, 1, &wrong))
        .collect();
    let r = engine.execute("peer-k2", &ops, Duration::from_secs(1));
    assert_eq!(r[0], Ok(()));
    assert_eq!(r[2], Ok(()));
    assert_eq!(r[1], Err(RdmaOpError::Wc(4)));
    assert_eq!(
        r[3],
        Err(RdmaOpError::Flushed),
        "the rest of the failed rail is flushed"
    );
    assert_eq!(&local[..4096], &remote[..4096]);
    assert!(
        local[4096..8192].iter().all(|&b| b == 0),
        "nothing landed under a wrong key"
    );
}

#[test]
fn a_channel_that_cannot_be_leased_fails_its_ops_and_is_counted() {
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 5);
    // SAFETY: `remote` outlives every request (the engine drains before returning).
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    // Connecting goes through a bootstrap exchange with a peer that does not exist.
    let mut verbs = SoftVerbs::new(fabric.clone(), 2, 4, 16);
    verbs.bootstrap = Some(peercache_transport::rdma::soft::SoftBootstrap {
        node: None,
        auth: peercache_wire::auth::Auth::none(),
        timeout: Duration::from_millis(300),
    });
    let engine = Engine::new(verbs, 4);
    let mut local = vec![0u8; 4 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 2);
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    let t0 = Instant::now();
    let r = engine.execute("127.0.0.1:1", &ops, Duration::from_secs(1));
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "bounded by the deadline"
    );
    assert!(r.iter().all(|x| *x == Err(RdmaOpError::Post)), "{r:?}");
    let c = &engine.counters;
    assert_eq!(c.lease_failures.get(), 2, "one per rail");
    assert_eq!(c.post_failures.get(), 0);
    assert!(local.iter().all(|b| *b == 0));
}

#[test]
fn a_queue_pair_that_never_flushes_is_destroyed_within_the_drain_grace() {
    // A device that neither completes nor flushes (seen on soft-RoCE under emulation): the
    // drain after the timeout is bounded too, and destroying the queue pair discards what it
    // held, so nothing lands in the caller's memory after the batch returns.
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 5);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let engine = Engine::new(SoftVerbs::new(fabric.clone(), 1, 4, 8), 4);
    let mut local = vec![0u8; 4 * 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    let ops = page_reads(&remote, rkey, &mut local, &lk);
    fabric.stall.store(true, Ordering::Release);
    fabric.never_flush.store(true, Ordering::Release);
    let t0 = Instant::now();
    let r = engine.execute("peer-d", &ops, Duration::from_millis(50));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(4), "held for {took:?}");
    assert!(r.iter().all(|x| x.is_err()), "{r:?}");
    assert_eq!(engine.counters.drain_timeouts.get(), 1);
    assert_eq!(engine.counters.channel_discards.get(), 1);
    assert_eq!(
        fabric.outstanding.load(Ordering::Acquire),
        0,
        "the queue pair was destroyed"
    );
    fabric.stall.store(false, Ordering::Release);
    fabric.never_flush.store(false, Ordering::Release);
    assert_eq!(fabric.bytes.load(Ordering::Relaxed), 0, "no late DMA");
    assert!(local.iter().all(|&b| b == 0));
}

#[test]
fn queue_pairs_per_peer_are_bounded_and_callers_beyond_the_bound_wait_within_their_deadline() {
    let fabric = Fabric::new();
    let mut remote = pattern(4 * 4096, 12);
    // SAFETY: as above.
    let rkey = unsafe { fabric.register(remote.as_mut_ptr(), remote.len(), false) };
    let verbs = SoftVerbs::new(fabric.clone(), 1, 4, 16);
    let connects = verbs.connects.clone();
    // At most two queue pairs to a peer (max_channels_per_peer = 2), however many callers.
    let engine = Arc::new(Engine::with_channel_limit(verbs, 4, 2));
    // A slow link: every batch holds its channel for 100 ms.
    fabric.rail_delay_us[0].store(100_000, Ordering::Release);
    let callers: Vec<_> = (0..6)
        .map(|c| {
            let (engine, fabric) = (engine.clone(), fabric.clone());
            let remote = remote.as_ptr() as u64;
            std::thread::spawn(move || {
                let mut local = vec![0u8; 4 * 4096];
                let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
                let ops: Vec<EngineOp> = local
                    .chunks_mut(4096)
                    .enumerate()
                    .map(|(i, d)| read_op(remote + (i * 4096) as u64, rkey, d, 1, &lk))
                    .collect();
                // Six callers on two channels: three rounds of 100 ms fit in 5 s.
                let r = engine.execute("peer-bound", &ops, Duration::from_secs(5));
                (c, r, local)
            })
        })
        .collect();
    for t in callers {
        let (c, r, local) = t.join().unwrap();
        assert!(r.iter().all(|x| x.is_ok()), "caller {c}: {r:?}");
        assert_eq!(local, remote, "caller {c}");
    }
    assert_eq!(
        *connects.lock(),
        vec![2],
        "two queue pairs served six callers"
    );
    assert_eq!(engine.channels("peer-bound", 0), 2);
    assert_eq!(engine.counters.lease_timeouts.get(), 0);

    // Both channels busy past a caller's deadline: its ops time out, counted, none connected.
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let (engine, fabric) = (engine.clone(), fabric.clone());
            let remote = remote.as_ptr() as u64;
            std::thread::spawn(move || {
                let mut local = vec![0u8; 4096];
                let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
                let ops = vec![read_op(remote, rkey, &mut local, 1, &lk)];
                engine.execute("peer-bound", &ops, Duration::from_secs(5))
            })
        })
        .collect();
    // Wait until both channels are leased (neither is idle), then ask for a third.
    let until = Instant::now() + Duration::from_secs(5);
    while fabric.outstanding.load(Ordering::Acquire) < 2 {
        assert!(Instant::now() < until, "the two busy callers never posted");
        std::thread::yield_now();
    }
    let mut local = vec![0u8; 4096];
    let lk = fabric.register_local(local.as_ptr(), local.len(), 1);
    let ops = vec![read_op(remote.as_ptr() as u64, rkey, &mut local, 1, &lk)];
    let t0 = Instant::now();
    let r = engine.execute("peer-bound", &ops, Duration::from_millis(30));
    assert_eq!(r, vec![Err(RdmaOpError::Timeout)]);
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(engine.counters.lease_timeouts.get(), 1);
    for b in busy {
        assert!(b.join().unwrap().iter().all(|x| x.is_ok()));
    }
    assert_eq!(*connects.lock(), vec![2]);
    drop(local);
}

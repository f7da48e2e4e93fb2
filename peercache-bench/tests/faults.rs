//! The fault suite: real `peercache-bench serve` node processes on loopback (each on its own
//! 127.0.0.N), a client node in this process running a steady exists/get/set load with every
//! byte checked, and faults injected from outside — `kill -9`, `SIGSTOP`, a partitioning proxy,
//! discovery masters killed one by one.
//!
//! These tests take tens of seconds each, so they are `#[ignore]`d in the plain test run and run
//! by the labelled `faults` stage of `.ci/run`:
//! `cargo test --release -p peercache-bench --test faults -- --ignored --test-threads 1`.
//! Each prints one `FAULT-RESULT {json}` line with its numbers (docs/reliability.md).

mod fault_kit;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fault_kit::*;
use peercache_bench::cmd::serve::page_for;
use serde_json::json;

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn kill_nine_one_of_five_then_restart_it() {
    let port = free_port();
    let seeds = format!("127.0.0.71:{port},127.0.0.72:{port},127.0.0.73:{port}");
    let disk = tempfile::tempdir().unwrap();
    let fast = [
        ("heartbeat_interval", "0.2".to_string()),
        ("member_ttl", "0.6".into()),
    ];
    let mut procs: Vec<Proc> = (1..=5)
        .map(|n| {
            let id = format!("kill-node-{n}");
            let mut extra: Vec<(&str, String)> = fast.to_vec();
            extra.extend(disk_args(disk.path(), &id));
            Proc::spawn(&format!("127.0.0.7{n}"), &seeds, &id, PRELOAD, &extra)
        })
        .collect();
    let c = client("127.0.0.76", &seeds, json!({}));
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 6, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    wait_until("load running", Duration::from_secs(5), || {
        load.calls.load(Ordering::Relaxed) > 20
    });

    // kill -9 the fourth node (not a discovery master).
    let victim = procs[3].id.clone();
    load.expected_down.lock().push(victim.clone());
    let _ = load.reset_max();
    let killed_at = Instant::now();
    procs[3].kill9();
    let dropped_after = wait_until("victim dropped", Duration::from_secs(10), || {
        !is_member(&c, &victim)
    });
    // Let the load run through the ring change.
    let calls0 = load.calls.load(Ordering::Relaxed);
    wait_until("load after the drop", Duration::from_secs(20), || {
        load.calls.load(Ordering::Relaxed) > calls0 + 3000
    });
    let max_during_fault = load.reset_max();
    let sweep_after = sweep(&c, &owners);
    for (o, hits, misses, wrong) in &sweep_after {
        assert_eq!(*wrong, 0, "{o}");
        if *o == victim {
            assert_eq!(*hits, 0, "the victim's pages had no other copy");
        } else {
            assert_eq!(*misses, 0, "{o}'s pages must still hit");
        }
    }

    // Restart with the same node id and disk folder: its pages come back.
    let restarted_at = Instant::now();
    let mut extra: Vec<(&str, String)> = fast.to_vec();
    extra.extend(disk_args(disk.path(), &victim));
    procs[3] = Proc::spawn("127.0.0.74", &seeds, &victim, 0, &extra);
    let back_after = wait_until("victim's pages back", Duration::from_secs(20), || {
        sweep(&c, &owners[3..4])[0].1 == PRELOAD
    });
    load.expected_down.lock().clear();
    let restart_to_hits = restarted_at.elapsed();
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let max_after = load.reset_max();
    for (o, hits, _, wrong) in sweep(&c, &owners) {
        assert_eq!((hits, wrong), (PRELOAD, 0), "{o} after the restart");
    }
    let mut summary = load.summary();
    summary["membership_drop_ms"] = json!(dropped_after.as_millis());
    summary["ttl_plus_heartbeat_ms"] = json!(800);
    summary["max_call_ms_during_fault"] = json!(max_during_fault.as_secs_f64() * 1e3);
    summary["max_call_ms_after_restart"] = json!(max_after.as_secs_f64() * 1e3);
    summary["victim_pages_back_ms"] = json!(back_after.as_millis());
    summary["restart_to_hits_ms"] = json!(restart_to_hits.as_millis());
    summary["kill_to_end_s"] = json!(killed_at.elapsed().as_secs_f64());
    report(
        "kill -9 one of five, restart with the same node_id",
        summary.clone(),
    );
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert_eq!(load.failed.load(Ordering::Relaxed), 0, "{summary}");
    assert_eq!(
        load.unexpected_misses.load(Ordering::Relaxed),
        0,
        "{summary}"
    );
    assert!(
        dropped_after <= Duration::from_millis(1000),
        "membership drop took {dropped_after:?} (TTL 600 ms + heartbeat 200 ms)"
    );
    assert!(
        max_during_fault <= Duration::from_millis(600),
        "a call took {max_during_fault:?} during the fault"
    );
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn stalled_peer_is_suspect_then_heals() {
    let port = free_port();
    let seeds = format!("127.0.0.81:{port},127.0.0.82:{port},127.0.0.83:{port}");
    // A long TTL: the stalled node stays a member, so deadlines and suspicion are what keep
    // calls fast.
    let slow = [
        ("heartbeat_interval", "0.5".to_string()),
        ("member_ttl", "10".into()),
    ];
    let procs: Vec<Proc> = (1..=4)
        .map(|n| {
            let id = format!("stall-node-{n}");
            Proc::spawn(&format!("127.0.0.8{n}"), &seeds, &id, PRELOAD, &slow)
        })
        .collect();
    let c = client(
        "127.0.0.85",
        &seeds,
        json!({"heartbeat_interval": 0.5, "member_ttl": 10.0}),
    );
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 5, &owners);
    let d = disturb_the_last_owner(
        &c,
        &owners,
        || procs[3].signal(libc::SIGSTOP),
        || procs[3].signal(libc::SIGCONT),
        true,
    );
    d.report("stalled peer (SIGSTOP), then SIGCONT", "stall");
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn partitioned_peer_behind_a_proxy_then_heals() {
    let port = free_port();
    let seeds = format!("127.0.0.91:{port},127.0.0.92:{port},127.0.0.93:{port}");
    let slow = [
        ("heartbeat_interval", "0.5".to_string()),
        ("member_ttl", "10".into()),
    ];
    let mut procs: Vec<Proc> = (1..=3)
        .map(|n| {
            let id = format!("part-node-{n}");
            Proc::spawn(&format!("127.0.0.9{n}"), &seeds, &id, PRELOAD, &slow)
        })
        .collect();
    // The fourth node binds 127.0.0.94 but advertises 127.0.0.95, where the proxy listens.
    let (data_port, control_port) = (free_port(), free_port());
    let proxy = Proxy::start("127.0.0.95", "127.0.0.94", &[data_port, control_port]);
    let mut extra: Vec<(&str, String)> = slow.to_vec();
    extra.extend([
        ("local_hostname", "127.0.0.95".to_string()),
        ("rdma_port", data_port.to_string()),
        ("control_port", control_port.to_string()),
    ]);
    procs.push(Proc::spawn(
        "127.0.0.94",
        &seeds,
        "part-node-4",
        PRELOAD,
        &extra,
    ));
    assert_eq!(procs[3].ip, "127.0.0.94");
    let c = client(
        "127.0.0.96",
        &seeds,
        json!({"heartbeat_interval": 0.5, "member_ttl": 10.0}),
    );
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 5, &owners);
    let d = disturb_the_last_owner(&c, &owners, || proxy.partition(), || proxy.heal(), false);
    d.report("partitioned peer (silent proxy), then heal", "partition");
    c.shutdown();
}

#[test]
#[ignore = "fault suite: run by the `faults` stage of .ci/run"]
fn discovery_masters_killed_one_by_one() {
    let port = free_port();
    let seeds = format!("127.0.0.101:{port},127.0.0.102:{port},127.0.0.103:{port}");
    let fast = [
        ("heartbeat_interval", "0.2".to_string()),
        ("member_ttl", "0.6".into()),
    ];
    let mut procs: Vec<Proc> = (1..=5)
        .map(|n| {
            let id = format!("master-node-{n}");
            Proc::spawn(&format!("127.0.0.10{n}"), &seeds, &id, PRELOAD, &fast)
        })
        .collect();
    let c = client("127.0.0.106", &seeds, json!({}));
    let owners: Vec<String> = procs.iter().map(|p| p.id.clone()).collect();
    settle(&c, 6, &owners);
    let load = Arc::new(Load::default());
    let t = load.clone().run(c.clone(), owners.clone());
    let mut steps = Vec::new();
    for m in 0..3 {
        let id = procs[m].id.clone();
        load.expected_down.lock().push(id.clone());
        procs[m].kill9();
        let members = 6 - (m + 1);
        let converged = wait_until("survivors converge", Duration::from_secs(15), || {
            !is_member(&c, &id) && c.members().len() == members
        });
        // The cluster keeps working: survivors' pages hit, new pages are stored and found.
        let sw = sweep(&c, &owners[m + 1..]);
        for (o, hits, _, wrong) in &sw {
            assert_eq!((*hits, *wrong), (PRELOAD, 0), "{o} after killing {id}");
        }
        let k = format!("after-master-{m}");
        let p = page_for(&k, PAGE);
        assert!(c.batch_set(&[&k], &[p.as_slice()]).unwrap()[0]);
        assert_eq!(c.batch_exists(&[&k]).unwrap(), 1);
        steps
            .push(json!({"killed": id, "members": members, "converged_ms": converged.as_millis()}));
    }
    load.stop.store(true, Ordering::Relaxed);
    t.join().unwrap();
    let mut summary = load.summary();
    summary["steps"] = json!(steps);
    report(
        "discovery masters (the three seeds) killed one by one",
        summary.clone(),
    );
    assert_eq!(load.wrong.load(Ordering::Relaxed), 0);
    assert_eq!(load.failed.load(Ordering::Relaxed), 0, "{summary}");
    c.shutdown();
}

//! A node joins with an empty shard while readers look keys up: the members hand it their
//! entries paced (`handoff_bytes_per_s`), so the hand-off lasts far longer than the grace of
//! a ring change, and the newcomer points readers at each key's previous holder until it has
//! it — zero misses during a 100 k-entry hand-off. Real shards, hand-off and lookups over
//! loopback sockets (`testbed::join`); the bench runs 1 M (`peercache-bench scale`).

use std::time::Duration;

use peercache_directory::testbed::join::{self, JoinConfig};

#[test]
fn a_paced_hand_off_to_a_newcomer_causes_no_misses_under_lookup_load() {
    let cfg = JoinConfig {
        entries: 100_000,
        // 1 MiB/s per sender, the grace 50 ms: without the newcomer's hints readers would miss
        // (tens of thousands of misses when the hints are switched off).
        rate: 1 << 20,
        grace: Duration::from_millis(50),
        ..JoinConfig::default()
    };
    let j = join::run(&cfg).unwrap();
    assert_eq!(j.failed, 0, "{j:?}");
    // With 2 copies on 4 nodes the newcomer owns about half of the entries.
    assert!((40_000..60_000).contains(&j.sent), "{j:?}");
    assert_eq!(j.newcomer_entries, j.sent, "{j:?}");
    assert!(
        j.handoff > Duration::from_millis(500),
        "paced: the hand-off lasts ten times the grace: {j:?}"
    );
    assert!(j.lookups > 10_000, "{j:?}");
    assert_eq!(j.misses, 0, "no miss during the hand-off: {j:?}");
    assert_eq!(j.wrong, 0, "{j:?}");
    assert!(
        j.redirects > 0,
        "readers were pointed at previous holders: {j:?}"
    );
    assert!(!j.still_receiving, "every sender said it was done: {j:?}");
}

#[test]
fn an_unpaced_hand_off_reaching_members_at_different_times_misses_nothing() {
    // Each old member learns of the join 150 ms after the one before, three times the grace:
    // the first sender is done long before the last one starts. The newcomer waits for every
    // earlier member's word, so the readers are still pointed at the previous holders.
    let j = join::run(&JoinConfig {
        first: 80,
        entries: 30_000,
        rate: 0,
        grace: Duration::from_millis(50),
        stagger: Duration::from_millis(150),
        ..JoinConfig::default()
    })
    .unwrap();
    assert!(j.handoff >= Duration::from_millis(300), "{j:?}");
    assert_eq!((j.failed, j.misses, j.wrong), (0, 0, 0), "{j:?}");
    assert!(j.redirects > 0, "{j:?}");
    assert_eq!(j.newcomer_entries, j.sent, "{j:?}");
    assert!(!j.still_receiving, "{j:?}");
}

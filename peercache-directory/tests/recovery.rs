//! Recovery at size, with the real shard, hand-off and re-announce code over loopback sockets
//! (`testbed::Fleet`): a directory node killed, or restarted with an empty shard; every page
//! still held by a live owner is found again on all its ring owners, nothing stale or wrong is
//! served. The bench runs the same at ten million pages (`peercache-bench scale --recovery`).

use std::time::Duration;

use peercache_directory::testbed::{Fleet, RecoveryConfig};

fn fleet(pages: u64, replicas: usize) -> Fleet {
    Fleet::start(RecoveryConfig {
        nodes: 16,
        pages,
        replicas,
        ..RecoveryConfig::default()
    })
    .expect("a fleet on loopback")
}

#[test]
fn a_killed_directory_node_s_entries_are_found_again_from_the_replicas() {
    let mut f = fleet(200_000, 2);
    let before = f.check();
    assert!(before.complete(), "{before:?}");
    assert_eq!(before.expected, 200_000);
    let r = f.kill(5);
    let c = r.check;
    // Node 5's own pages are gone; every other page is on both of its new ring owners.
    assert_eq!(c.expected, 200_000 - 200_000 / 16, "{r:?}");
    assert!(c.complete(), "{r:?}");
    assert_eq!(r.failed, 0, "{r:?}");
    // About 2/16 of the entries lost a replica, and each is sent once, by the survivor.
    let moved_share = r.handed_off as f64 / (2.0 * 200_000.0);
    assert!((0.04..0.1).contains(&moved_share), "{r:?}");
    assert!(r.collected > 0, "node 5's locations were collected: {r:?}");
    assert!(r.recovered_at() <= Duration::from_secs(10), "{r:?}");
}

#[test]
fn with_one_replica_the_owners_re_announce_what_the_dead_node_held() {
    let mut f = fleet(100_000, 1);
    let r = f.kill(3);
    // No shard holds a copy of node 3's entries: only the owners' re-announcement brings them
    // back, and only those move.
    assert_eq!(r.handed_off, 0, "{r:?}");
    assert!(r.reannounced > 0, "{r:?}");
    assert!(r.check.complete(), "{r:?}");
    let share = r.reannounced as f64 / 100_000.0;
    assert!(
        (0.03..0.1).contains(&share),
        "about 1/16 re-announced: {r:?}"
    );
}

#[test]
fn a_node_restarted_with_an_empty_shard_gets_its_ranges_back_and_its_old_life_is_collected() {
    let mut f = fleet(100_000, 2);
    // The same id comes back in a new life before anyone noticed it was gone.
    let r = f.restart(7).expect("the new life binds");
    assert_eq!(r.failed, 0, "{r:?}");
    assert!(
        r.handed_off > 0,
        "its ranges were handed to it again: {r:?}"
    );
    assert!(
        r.collected > 0,
        "its previous life's locations were dropped: {r:?}"
    );
    assert!(r.check.complete(), "{r:?}");
    assert_eq!(r.check.expected, 100_000 - 100_000 / 16);
    // And a second restart of another node, with one replica: the owners re-announce.
    let mut g = fleet(50_000, 1);
    let r = g.restart(2).expect("the new life binds");
    assert!(r.reannounced > 0, "{r:?}");
    assert!(r.check.complete(), "{r:?}");
}

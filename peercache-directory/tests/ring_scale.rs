//! The ring at fleet size: 1,024 members (128 hosts × 8 ranks, 160 points each). One join and
//! one leave must each move about 1/N of the entries — measured over 200,000 keys, for the
//! primary and for the two-replica owner sets the directory keeps — and no member may hold far
//! more than its share. Run with `--nocapture` for the figures.

use std::collections::HashSet;

use peercache_directory::Ring;
use peercache_wire::{NodeId, PageKey};

const HOSTS: usize = 128;
const RANKS: usize = 8;
const KEYS: u64 = 200_000;
const VNODES: u32 = 160;

fn member(host: usize, rank: usize) -> NodeId {
    NodeId::new(format!(
        "10.1.{}.{}:17000-tp{rank}",
        host / 250,
        host % 250 + 1
    ))
    .unwrap()
}

fn key(i: u64) -> PageKey {
    PageKey::from_bytes(&i.to_le_bytes())
}

/// Keys whose primary, and whose owner set of `replicas`, differ between two rings.
fn moved(a: &Ring, b: &Ring, replicas: usize) -> (u64, u64) {
    let (mut primary, mut set) = (0, 0);
    for i in 0..KEYS {
        let k = key(i);
        primary += u64::from(a.primary(k) != b.primary(k));
        let oa: HashSet<NodeId> = a.owners(k, replicas).into_iter().collect();
        let ob: HashSet<NodeId> = b.owners(k, replicas).into_iter().collect();
        set += u64::from(oa != ob);
    }
    (primary, set)
}

#[test]
fn a_join_and_a_leave_at_1024_members_each_move_about_one_nth() {
    let members: Vec<NodeId> = (0..HOSTS)
        .flat_map(|h| (0..RANKS).map(move |r| member(h, r)))
        .collect();
    let n = members.len();
    assert_eq!(n, 1024);
    let ring = Ring::new(members.clone(), VNODES);

    // Balance: the largest share is within a small factor of the mean.
    let shares = ring.shares();
    let max = shares.iter().copied().fold(0.0, f64::max);
    let mean = 1.0 / n as f64;
    println!(
        "1,024 members: largest primary share {:.2} × the mean",
        max / mean
    );
    assert!(
        max / mean < 1.6,
        "largest share {:.2} × the mean",
        max / mean
    );

    // One join.
    let newcomer = member(HOSTS, 0);
    let joined = Ring::new(members.iter().cloned().chain([newcomer]), VNODES);
    let (p, s) = moved(&ring, &joined, 2);
    let (pf, sf) = (p as f64 / KEYS as f64, s as f64 / KEYS as f64);
    println!(
        "join: primary moved for {:.3} % of keys (1/N = {:.3} %), 2-owner set changed for {:.3} % \
         (2/N = {:.3} %)",
        pf * 100.0,
        100.0 / (n + 1) as f64,
        sf * 100.0,
        200.0 / (n + 1) as f64
    );
    let one_nth = 1.0 / (n + 1) as f64;
    assert!(
        pf > 0.7 * one_nth && pf < 1.4 * one_nth,
        "join moved {pf} of primaries"
    );
    assert!(
        sf > 1.4 * one_nth && sf < 2.8 * one_nth,
        "join changed {sf} of owner sets"
    );

    // One leave (a member from the middle of the list).
    let gone = &members[517];
    let left = Ring::new(members.iter().filter(|m| *m != gone).cloned(), VNODES);
    let (p, s) = moved(&ring, &left, 2);
    let (pf, sf) = (p as f64 / KEYS as f64, s as f64 / KEYS as f64);
    let one_nth = 1.0 / n as f64;
    println!(
        "leave: primary moved for {:.3} % of keys (1/N = {:.3} %), 2-owner set changed for {:.3} % \
         (2/N = {:.3} %)",
        pf * 100.0,
        100.0 * one_nth,
        sf * 100.0,
        200.0 * one_nth
    );
    assert!(
        pf > 0.7 * one_nth && pf < 1.4 * one_nth,
        "leave moved {pf} of primaries"
    );
    assert!(
        sf > 1.4 * one_nth && sf < 2.8 * one_nth,
        "leave changed {sf} of owner sets"
    );
    // Consistency: only keys the departed member owned change primary.
    for i in 0..KEYS {
        let k = key(i);
        if ring.primary(k) != Some(gone) {
            assert_eq!(ring.primary(k), left.primary(k));
        }
    }
}

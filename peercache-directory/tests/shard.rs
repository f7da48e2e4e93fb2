//! The sans-IO shard and hand-off planning, with a simulated clock and many nodes in-process.

mod common;

use std::collections::HashMap;

use common::{key, loc, node};
use peercache_directory::handoff;
use peercache_directory::{Ring, Shard, ShardConfig};
use peercache_wire::{Incarnation, NodeId};

#[test]
fn insert_lookup_exists_and_owner_conditional_remove() {
    let mut sh = Shard::new(ShardConfig::default());
    let (a, b) = (node(1), node(2));
    let k = key(1);
    let o = sh.insert(k, loc(&a, 5), 0);
    assert!(o.new_owner && o.live_owners == 1 && !o.reclaimable);
    let o = sh.insert(k, loc(&a, 6), 1);
    assert!(
        !o.new_owner,
        "same owner again is an update, not a new owner"
    );
    sh.insert(k, loc(&b, 9), 2);
    assert!(sh.exists(k, 3));
    assert_eq!(sh.lookup(k, 3).unwrap().len(), 2);
    // A late eviction notice for generation 5 must not remove the newer publish (gen 6).
    assert!(!sh.remove(k, &a, Some(5)));
    assert!(sh.remove(k, &a, Some(6)));
    assert!(sh.remove(k, &b, None));
    assert!(!sh.exists(k, 4));
    assert!(sh.is_empty());
}

#[test]
fn third_live_owner_gets_the_reclaimable_hint() {
    let mut sh = Shard::new(ShardConfig::default());
    let k = key(7);
    assert!(!sh.insert(k, loc(&node(1), 1), 0).reclaimable);
    assert!(!sh.insert(k, loc(&node(2), 1), 0).reclaimable);
    let third = sh.insert(k, loc(&node(3), 1), 0);
    assert!(third.reclaimable && third.live_owners == 3);
    // A duplicate insert by an existing owner is not a new owner: no hint.
    assert!(!sh.insert(k, loc(&node(3), 2), 0).reclaimable);
    // Owners that left do not count as live.
    sh.set_live([node(1), node(4)]);
    let fourth = sh.insert(k, loc(&node(4), 1), 0);
    assert_eq!(fourth.live_owners, 2);
    assert!(!fourth.reclaimable);
}

#[test]
fn non_resident_copies_sort_last_and_still_exist() {
    let mut sh = Shard::new(ShardConfig::default());
    let k = key(2);
    sh.insert(k, loc(&node(1), 1), 0);
    sh.insert(k, loc(&node(2), 1), 0);
    assert!(sh.mark_nonresident(k, &node(1), Some(1)));
    let owners = sh.lookup(k, 1).unwrap();
    assert_eq!(owners[0].node, node(2));
    assert!(!owners[1].resident);
    sh.remove(k, &node(2), None);
    assert!(sh.exists(k, 2), "a disk-only copy still counts as present");
}

#[test]
fn memory_is_bounded_by_cap_and_ttl() {
    let mut sh = Shard::new(ShardConfig {
        max_entries: 100,
        entry_ttl_ms: 1000,
        reclaim_threshold: 3,
    });
    for i in 0..250 {
        sh.insert(key(i), loc(&node(1), 1), i);
    }
    assert_eq!(sh.len(), 100);
    assert_eq!(sh.stats().cap_evictions, 150);
    assert!(
        sh.exists(key(249), 300) && !sh.exists(key(0), 300),
        "least recently used go first"
    );
    // Reading an old entry keeps it; untouched ones expire.
    assert!(sh.lookup(key(150), 900).is_some());
    assert!(sh.lookup(key(151), 1300).is_none(), "expired after the TTL");
    assert!(
        sh.lookup(key(150), 1300).is_some(),
        "refreshed by the read at 900"
    );
    assert!(sh.stats().ttl_expirations >= 1);
}

#[test]
fn at_the_cap_entries_used_since_the_last_pass_stay_and_the_unused_go() {
    let mut sh = Shard::new(ShardConfig {
        max_entries: 100,
        ..ShardConfig::default()
    });
    for i in 0..100 {
        sh.insert(key(i), loc(&node(1), 1), 0);
    }
    // Keys 0..50 are read; 50..100 are not.
    for i in 0..50 {
        assert!(sh.lookup(key(i), 1).is_some());
    }
    for i in 100..150 {
        sh.insert(key(i), loc(&node(1), 1), 2);
    }
    assert_eq!(sh.len(), 100);
    assert_eq!(sh.stats().cap_evictions, 50);
    for i in 0..50 {
        assert!(sh.exists(key(i), 3), "key {i} was read: it stays");
    }
    for i in 50..100 {
        assert!(
            !sh.exists(key(i), 3),
            "key {i} was never read: it goes first"
        );
    }
    for i in 100..150 {
        assert!(sh.exists(key(i), 3), "key {i} was just inserted");
    }
}

#[test]
fn departed_and_restarted_owners_are_collected() {
    let mut sh = Shard::new(ShardConfig::default());
    for i in 0..10 {
        sh.insert(key(i), loc(&node(1), 1), 0);
        sh.insert(key(i), loc(&node(2), 1), 0);
    }
    assert_eq!(sh.set_live([node(2)]), 10);
    assert!(
        sh.lookup(key(3), 0)
            .unwrap()
            .iter()
            .all(|o| o.node == node(2))
    );
    // node-2 restarts with a new incarnation: its old locations go.
    assert_eq!(sh.drop_incarnations_before(&node(2), Incarnation(99)), 10);
    assert!(sh.is_empty());
}

/// Ten shards, 100k entries with two replicas, one node joins: measure what moves.
#[test]
fn a_join_moves_only_changed_entries_and_leaves_no_stale_copies() {
    const N: usize = 10;
    const KEYS: u64 = 100_000;
    const R: usize = 2;
    let members: Vec<NodeId> = (0..N).map(node).collect();
    let old = Ring::new(members.clone(), 160);
    let mut shards: HashMap<NodeId, Shard> = members
        .iter()
        .map(|m| (m.clone(), Shard::new(ShardConfig::default())))
        .collect();
    for i in 0..KEYS {
        let k = key(i);
        for owner in old.owners(k, R) {
            shards
                .get_mut(&owner)
                .unwrap()
                .insert(k, loc(&members[(i % N as u64) as usize], 1), 0);
        }
    }
    let newcomer = node(N);
    let mut all = members.clone();
    all.push(newcomer.clone());
    let new = Ring::new(all.clone(), 160);
    shards.insert(newcomer.clone(), Shard::new(ShardConfig::default()));

    let mut plans = HashMap::new();
    for m in &all {
        plans.insert(m.clone(), handoff::plan(&shards[m], m, &old, &new, R));
    }
    let sent: usize = plans.values().map(|p| p.send_count()).sum();
    // Apply: deliver, then drop.
    for (from, plan) in &plans {
        for (to, keys) in &plan.sends {
            let entries: Vec<_> = keys
                .iter()
                .map(|k| (*k, shards[from].peek(*k).unwrap()))
                .collect();
            let dst = shards.get_mut(to).unwrap();
            for (k, owners) in entries {
                dst.merge(k, &owners, 1);
            }
        }
    }
    for (from, plan) in &plans {
        shards.get_mut(from).unwrap().drop_keys(&plan.drops);
    }
    let expected_share =
        new.shares_with_replicas(R)[new.members().binary_search(&newcomer).unwrap()] * KEYS as f64;
    let stale: usize = all
        .iter()
        .map(|m| {
            shards[m]
                .keys()
                .filter(|k| !new.owners(*k, R).contains(m))
                .count()
        })
        .sum();
    let missing = (0..KEYS)
        .filter(|i| {
            new.owners(key(*i), R)
                .iter()
                .any(|o| !shards.get_mut(o).unwrap().exists(key(*i), 2))
        })
        .count();
    eprintln!(
        "join: sent {sent} entries, newcomer's expected share {expected_share:.0} (ratio {:.3}), stale copies {stale}, missing {missing}",
        sent as f64 / expected_share
    );
    assert!(
        sent as f64 <= 1.3 * expected_share,
        "sent {sent} > 1.3 × {expected_share}"
    );
    assert_eq!(stale, 0, "former owners must drop what they no longer own");
    assert_eq!(missing, 0, "every key must be on every new owner");
    assert_eq!(
        shards[&newcomer].len() as f64,
        sent as f64,
        "everything sent went to the newcomer"
    );
}

#[test]
fn a_leave_re_replicates_from_survivors() {
    let members: Vec<NodeId> = (0..5).map(node).collect();
    let old = Ring::new(members.clone(), 160);
    let mut shards: HashMap<NodeId, Shard> = members
        .iter()
        .map(|m| (m.clone(), Shard::new(ShardConfig::default())))
        .collect();
    for i in 0..5000 {
        for owner in old.owners(key(i), 2) {
            shards
                .get_mut(&owner)
                .unwrap()
                .insert(key(i), loc(&node(0), 1), 0);
        }
    }
    let gone = node(3);
    shards.remove(&gone);
    let rest: Vec<NodeId> = members.iter().filter(|m| **m != gone).cloned().collect();
    let new = Ring::new(rest.clone(), 160);
    let plans: Vec<_> = rest
        .iter()
        .map(|m| (m.clone(), handoff::plan(&shards[m], m, &old, &new, 2)))
        .collect();
    for (from, plan) in &plans {
        for (to, keys) in &plan.sends {
            let entries: Vec<_> = keys
                .iter()
                .map(|k| (*k, shards[from].peek(*k).unwrap()))
                .collect();
            for (k, o) in entries {
                shards.get_mut(to).unwrap().merge(k, &o, 1);
            }
        }
    }
    for i in 0..5000 {
        for o in new.owners(key(i), 2) {
            assert!(
                shards.get_mut(&o).unwrap().exists(key(i), 2),
                "key {i} missing on {o}"
            );
        }
    }
}

/// The journal a node's KV-event stream is built from: every copy that appears, moves to disk
/// or goes is recorded once, in order (a hand-off away is a going, one received an
/// appearing); the current state is what the changes add up to.
#[test]
fn every_copy_that_appears_moves_or_goes_is_recorded_once_in_order() {
    use peercache_directory::{Change, ChangeKind};
    let mut sh = Shard::new(ShardConfig {
        max_entries: 4,
        ..ShardConfig::default()
    });
    sh.record_changes(1000);
    let mut out: Vec<Change> = Vec::new();
    let ev = |out: &[Change]| {
        out.iter()
            .map(|c| (c.key, c.node.to_string(), c.resident, c.kind))
            .collect::<Vec<_>>()
    };
    let a = node(1);
    let b = node(2);
    sh.insert(key(1), loc(&a, 1), 0);
    sh.insert(key(1), loc(&b, 1), 0);
    sh.insert(key(1), loc(&a, 2), 0); // a new generation, same tier: nothing to tell
    assert!(sh.mark_nonresident(key(1), &a, None));
    assert!(sh.remove(key(1), &b, None));
    assert_eq!(sh.take_changes(&mut out), 0);
    use ChangeKind::{Removed, Stored};
    assert_eq!(
        ev(&out),
        vec![
            (key(1), a.to_string(), true, Stored),
            (key(1), b.to_string(), true, Stored),
            (key(1), a.to_string(), true, Removed),
            (key(1), a.to_string(), false, Stored),
            (key(1), b.to_string(), true, Removed),
        ]
    );
    // The size cap evicts one entry (CLOCK: not used since the hand passed): its copies go.
    out.clear();
    for i in 2..=5 {
        sh.insert(key(i), loc(&b, 1), 0);
    }
    sh.take_changes(&mut out);
    let gone: Vec<&Change> = out.iter().filter(|c| c.kind == Removed).collect();
    assert_eq!(gone.len(), 1, "{out:?}");
    assert!(!sh.exists(gone[0].key, 0));
    // A hand-off away and back: gone from this shard, then listed again.
    out.clear();
    let moved = sh.peek(key(5)).unwrap();
    sh.drop_keys(&[key(5)]);
    sh.merge(key(5), &moved, 0);
    assert_eq!(sh.take_changes(&mut out), 0);
    assert_eq!(
        ev(&out),
        vec![
            (key(5), b.to_string(), true, Removed),
            (key(5), b.to_string(), true, Stored)
        ]
    );
    // An owner that leaves: each of its copies goes; the rest is the state a late subscriber
    // is sent.
    out.clear();
    let mut held_by_b = 0;
    sh.for_each_copy(|_, n, _| held_by_b += usize::from(*n == b));
    sh.set_live([a.clone()]);
    sh.take_changes(&mut out);
    assert_eq!(out.len(), held_by_b);
    assert!(out.iter().all(|c| c.node == b && c.kind == Removed));
    // What is left is what a late subscriber is sent.
    let mut state = Vec::new();
    sh.for_each_copy(|k, n, r| state.push((k, n.clone(), r)));
    assert!(state.iter().all(|(_, n, _)| *n == a), "{state:?}");
}

/// A page written by a node this shard does not count live yet (its first writes race its
/// join) is not in the state a late subscriber is sent, so it is not journaled either until
/// the node is counted live: then it appears, exactly once. The journal a subscriber followed
/// from an empty start always adds up to the state.
#[test]
fn a_copy_of_an_owner_not_yet_live_is_recorded_when_the_owner_is() {
    use peercache_directory::{Change, ChangeKind};
    use std::collections::HashSet;
    let mut sh = Shard::new(ShardConfig::default());
    sh.record_changes(1000);
    let (a, c) = (node(1), node(3));
    sh.set_live([a.clone()]);
    let mut followed: HashSet<(u128, String, bool)> = HashSet::new();
    let mut out: Vec<Change> = Vec::new();
    let mut follow = |sh: &mut Shard, followed: &mut HashSet<(u128, String, bool)>| {
        out.clear();
        assert_eq!(sh.take_changes(&mut out), 0);
        for ch in &out {
            let copy = (ch.key.0, ch.node.to_string(), ch.resident);
            match ch.kind {
                ChangeKind::Stored => followed.insert(copy),
                ChangeKind::Removed => followed.remove(&copy),
            };
        }
        let mut state = HashSet::new();
        sh.for_each_copy(|k, n, r| {
            state.insert((k.0, n.to_string(), r));
        });
        assert_eq!(*followed, state);
        out.len()
    };
    sh.insert(key(1), loc(&a, 1), 0);
    sh.insert(key(2), loc(&c, 1), 0); // c's probe, before this shard saw c join
    sh.merge(key(3), &[loc(&c, 1)], 0); // and one handed off to it
    assert!(sh.mark_nonresident(key(2), &c, None));
    assert_eq!(
        follow(&mut sh, &mut followed),
        1,
        "only a's copy is visible"
    );
    sh.set_live([a.clone(), c.clone()]);
    assert_eq!(
        follow(&mut sh, &mut followed),
        2,
        "c's two copies appear once c is live"
    );
    sh.set_live([a.clone(), c.clone()]);
    assert_eq!(follow(&mut sh, &mut followed), 0, "and only once");
    sh.set_live([a.clone()]);
    assert_eq!(follow(&mut sh, &mut followed), 2, "c leaves: its copies go");
    assert_eq!(followed.len(), 1);
}

#[test]
fn the_journal_keeps_its_cap_and_counts_the_rest_lost() {
    let mut sh = Shard::new(ShardConfig::default());
    sh.record_changes(10);
    for i in 0..25 {
        sh.insert(key(i), loc(&node(1), 1), 0);
    }
    let mut out = Vec::new();
    assert_eq!(sh.take_changes(&mut out), 15);
    assert_eq!(out.len(), 10);
    let mut state = 0;
    sh.for_each_copy(|_, _, _| state += 1);
    assert_eq!(state, 25);
    // In chunks of 7 slots (the lock is taken per chunk): the same copies, each once.
    let mut chunked = Vec::new();
    let mut from = Some(0);
    while let Some(f) = from {
        from = sh.for_each_copy_in(f, 7, |k, _, _| chunked.push(k));
    }
    chunked.sort();
    chunked.dedup();
    assert_eq!(chunked.len(), 25);
}

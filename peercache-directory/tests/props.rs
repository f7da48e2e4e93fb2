//! Property tests of the ring and the shard.

use std::collections::{HashMap, HashSet};

use peercache_directory::{CopyClass, Location, Rail, Ring, Shard, ShardConfig};
use peercache_wire::{Incarnation, NodeId, PageKey};
use proptest::prelude::*;

fn ids(n: usize, salt: u32) -> Vec<NodeId> {
    (0..n)
        .map(|i| NodeId::new(format!("n{salt}-{i}")).unwrap())
        .collect()
}

fn loc(node: &NodeId, generation: u64) -> Location {
    Location {
        node: node.clone(),
        incarnation: Incarnation(1),
        rails: smallvec::smallvec![Rail {
            endpoint: "127.0.0.1:1".parse().unwrap(),
            region: 1
        }],
        addr: generation,
        len: 1,
        valid_len: 1,
        generation,
        checksum: 0,
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Owners are distinct members, as many as asked (capped by the member count), the first is
    /// the primary, and the answer does not depend on the order members were given in.
    #[test]
    fn owners_are_distinct_and_order_independent(n in 1usize..12, salt in 0u32..1000, keys in prop::collection::vec(any::<u128>(), 1..50), r in 1usize..5) {
        let members = ids(n, salt);
        let ring = Ring::new(members.clone(), 40);
        let mut rev = members.clone();
        rev.reverse();
        let ring2 = Ring::new(rev, 40);
        for k in keys {
            let o = ring.owners(PageKey(k), r);
            prop_assert_eq!(o.len(), r.min(n));
            let set: HashSet<_> = o.iter().collect();
            prop_assert_eq!(set.len(), o.len());
            prop_assert_eq!(Some(&o[0]), ring.primary(PageKey(k)));
            prop_assert_eq!(o, ring2.owners(PageKey(k), r));
        }
    }

    /// Consistency: removing one member changes the primary only of keys it owned.
    #[test]
    fn removing_a_member_only_moves_its_keys(n in 2usize..12, salt in 0u32..1000, gone in 0usize..12, keys in prop::collection::vec(any::<u128>(), 1..100)) {
        let members = ids(n, salt);
        let gone = &members[gone % n];
        let before = Ring::new(members.clone(), 40);
        let after = Ring::new(members.iter().filter(|m| *m != gone).cloned(), 40);
        for k in keys {
            let p0 = before.primary(PageKey(k)).unwrap().clone();
            let p1 = after.primary(PageKey(k)).unwrap().clone();
            if &p0 != gone {
                prop_assert_eq!(p0, p1);
            }
        }
    }

    /// The shard agrees with a plain map model under random inserts and owner-conditional
    /// removes.
    #[test]
    fn shard_matches_a_model(ops in prop::collection::vec((0u8..3, 0u128..20, 0usize..3, 0u64..4), 1..200)) {
        let nodes = ids(3, 7);
        let mut sh = Shard::new(ShardConfig::default());
        let mut model: HashMap<u128, HashMap<usize, u64>> = HashMap::new();
        for (op, key, node, generation) in ops {
            match op {
                0 | 1 => {
                    sh.insert(PageKey(key), loc(&nodes[node], generation), 0);
                    model.entry(key).or_default().insert(node, generation);
                }
                _ => {
                    let removed = sh.remove(PageKey(key), &nodes[node], Some(generation));
                    let m = model.entry(key).or_default();
                    let expect = m.get(&node) == Some(&generation);
                    if expect {
                        m.remove(&node);
                    }
                    prop_assert_eq!(removed, expect);
                }
            }
        }
        for (key, owners) in &model {
            let found = sh.lookup(PageKey(*key), 0);
            if owners.is_empty() {
                prop_assert!(found.is_none());
            } else {
                let got: HashMap<usize, u64> = found
                    .unwrap()
                    .iter()
                    .map(|l| (nodes.iter().position(|n| *n == l.node).unwrap(), l.generation))
                    .collect();
                prop_assert_eq!(&got, owners);
            }
        }
    }
}

/// The hand-off plan as its definition reads, one key at a time with both rings walked.
fn naive_plan(
    keys: &[PageKey],
    me: &NodeId,
    old: &Ring,
    new: &Ring,
    r: usize,
) -> (HashMap<NodeId, Vec<PageKey>>, Vec<PageKey>) {
    let (mut sends, mut drops) = (HashMap::<NodeId, Vec<PageKey>>::new(), Vec::new());
    for &k in keys {
        let (o, n) = (old.owners(k, r), new.owners(k, r));
        let sender = o.iter().find(|x| new.contains(x)).unwrap_or(me);
        if sender == me {
            for x in n.iter().filter(|x| *x != me && !o.contains(x)) {
                sends.entry(x.clone()).or_default().push(k);
            }
        }
        if !n.contains(me) {
            drops.push(k);
        }
    }
    (sends, drops)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The planner's shortcuts (one ring walk where the change cannot touch a key) give the
    /// same plan and the same re-announcement as walking both rings for every key — for
    /// leaves, joins and both at once, including keys that reached a shard by another route.
    #[test]
    fn handoff_and_reannounce_match_their_definition(
        n in 2usize..10, salt in 0u32..1000, leave in prop::collection::vec(any::<bool>(), 10),
        join in 0usize..3, r in 1usize..4, me_at in 0usize..10,
        keys in prop::collection::vec(any::<u128>(), 1..200),
    ) {
        let old_members = ids(n, salt);
        let mut new_members: Vec<NodeId> =
            old_members.iter().zip(&leave).filter(|(_, l)| !**l).map(|(m, _)| m.clone()).collect();
        new_members.extend(ids(join, salt + 1));
        prop_assume!(!new_members.is_empty());
        let (old, new) = (Ring::new(old_members.clone(), 16), Ring::new(new_members, 16));
        let me = old_members[me_at % n].clone();
        let keys: Vec<PageKey> = keys.into_iter().map(PageKey).collect::<HashSet<_>>().into_iter().collect();
        let mut sh = Shard::new(ShardConfig::default());
        for &k in &keys {
            sh.insert(k, loc(&me, 1), 0);
        }
        let in_shard: Vec<PageKey> = sh.keys().collect();
        let plan = peercache_directory::handoff::plan(&sh, &me, &old, &new, r);
        let (sends, drops) = naive_plan(&in_shard, &me, &old, &new, r);
        prop_assert_eq!(&plan.sends, &sends);
        prop_assert_eq!(&plan.drops, &drops);
        // Re-announcement: each page to exactly the new owners it gained.
        let re = peercache_directory::handoff::reannounce_routes(&old, &new, r, keys.iter().copied());
        let mut got: HashMap<PageKey, HashSet<NodeId>> = HashMap::new();
        for (node, idx) in &re.routes {
            for &i in idx {
                got.entry(keys[re.pages[i]]).or_default().insert(node.clone());
            }
        }
        for &k in &keys {
            let o = old.owners(k, r);
            let want: HashSet<NodeId> = new.owners(k, r).into_iter().filter(|x| !o.contains(x)).collect();
            prop_assert_eq!(got.remove(&k).unwrap_or_default(), want);
        }
    }
}

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

//! The compact shard (owner table + 36-byte copies) against a plain model of what a shard
//! means: a map from key to a list of full `Location`s. Random operation sequences must give
//! the same answers, the same stored owners per key, and leave no owner record behind once
//! every copy naming it is gone. A second property runs the same operations under a cap of
//! four entries (evictions all the time) and checks the bound and that evicted entries give
//! their owner records back.

use std::collections::{BTreeMap, HashSet};

use peercache_directory::{CopyClass, Location, Owners, Rail, Shard, ShardConfig};
use peercache_wire::{Incarnation, NodeId, PageKey};
use proptest::prelude::*;

const THRESHOLD: u16 = 3;
const CAP: usize = 4;
const NO_CAP: usize = 1 << 20;

fn node(i: u8) -> NodeId {
    NodeId::new(format!("n{i}")).unwrap()
}

fn location(n: u8, inc: u8, region: u8, generation: u8, resident: bool) -> Location {
    Location {
        node: node(n),
        incarnation: Incarnation(u64::from(inc)),
        rails: smallvec::smallvec![Rail {
            endpoint: format!("127.0.0.{}:7000", n + 1).parse().unwrap(),
            region: u64::from(region),
        }],
        addr: u64::from(generation) * 4096 + u64::from(n),
        len: 4096,
        valid_len: 4096 - u32::from(generation % 3),
        generation: u64::from(generation),
        checksum: u64::from(generation) ^ (u64::from(n) << 32),
        resident,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u8, Location),
    Lookup(u8),
    Exists(u8),
    Remove(u8, u8, Option<u8>),
    MarkNonresident(u8, u8, Option<u8>),
    SetLive(Vec<u8>),
    DropIncarnations(u8, u8),
    Merge(u8, Vec<Location>),
    DropKeys(Vec<u8>),
    /// The batch forms the directory service uses (keys may repeat).
    Many(Vec<u8>),
}

fn loc_strategy() -> impl Strategy<Value = Location> {
    (0u8..5, 0u8..2, 0u8..2, 0u8..6, any::<bool>())
        .prop_map(|(n, inc, region, g, resident)| location(n, inc, region, g, resident))
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, loc_strategy()).prop_map(|(k, l)| Op::Insert(k, l)),
        2 => (0u8..6).prop_map(Op::Lookup),
        1 => (0u8..6).prop_map(Op::Exists),
        2 => (0u8..6, 0u8..5, proptest::option::of(0u8..6)).prop_map(|(k, n, g)| Op::Remove(k, n, g)),
        1 => (0u8..6, 0u8..5, proptest::option::of(0u8..6))
            .prop_map(|(k, n, g)| Op::MarkNonresident(k, n, g)),
        1 => proptest::collection::vec(0u8..5, 0..5).prop_map(Op::SetLive),
        1 => (0u8..5, 0u8..2).prop_map(|(n, i)| Op::DropIncarnations(n, i)),
        1 => (0u8..6, proptest::collection::vec(loc_strategy(), 1..4)).prop_map(|(k, l)| Op::Merge(k, l)),
        1 => proptest::collection::vec(0u8..6, 0..3).prop_map(Op::DropKeys),
        2 => proptest::collection::vec(0u8..6, 0..40).prop_map(Op::Many),
    ]
}

/// The meaning of a shard, without any of its representation.
#[derive(Default)]
struct Model {
    entries: BTreeMap<u8, Vec<Location>>,
    live: Option<HashSet<NodeId>>,
    /// Keys by recency, most recent first.
    recent: Vec<u8>,
}

impl Model {
    fn touch(&mut self, k: u8) {
        self.recent.retain(|&r| r != k);
        self.recent.insert(0, k);
    }

    fn forget(&mut self, k: u8) {
        self.entries.remove(&k);
        self.recent.retain(|&r| r != k);
    }

    /// The entry of `k`, made (evicting the least recent past the cap) if new; `touch` says
    /// whether an existing entry becomes the most recent.
    fn entry(&mut self, k: u8, touch: bool) -> &mut Vec<Location> {
        if self.entries.contains_key(&k) {
            if touch {
                self.touch(k);
            }
        } else {
            while self.entries.len() >= NO_CAP {
                let last = *self.recent.last().unwrap();
                self.forget(last);
            }
            self.entries.insert(k, Vec::new());
            self.touch(k);
        }
        self.entries.get_mut(&k).unwrap()
    }

    fn is_live(&self, n: &NodeId) -> bool {
        self.live.as_ref().is_none_or(|l| l.contains(n))
    }

    fn insert(&mut self, k: u8, loc: Location) -> (bool, u16, bool) {
        let live = self.live.clone();
        let owners = self.entry(k, true);
        owners.retain(|o| live.as_ref().is_none_or(|l| l.contains(&o.node)));
        let new_owner = match owners.iter_mut().find(|o| o.node == loc.node) {
            Some(o) => {
                *o = loc;
                false
            }
            None => {
                owners.push(loc);
                true
            }
        };
        let n = owners.len() as u16;
        let reclaimable = new_owner && n >= THRESHOLD;
        if reclaimable {
            owners.last_mut().unwrap().class = CopyClass::Reclaimable;
        }
        (new_owner, n, reclaimable)
    }

    fn lookup(&mut self, k: u8) -> Option<Vec<Location>> {
        if self.entries.contains_key(&k) {
            self.touch(k);
        }
        self.peek_live(k)
    }

    fn peek_live(&self, k: u8) -> Option<Vec<Location>> {
        let mut v: Vec<Location> = self
            .entries
            .get(&k)?
            .iter()
            .filter(|o| self.is_live(&o.node))
            .cloned()
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by_key(|o| (!o.resident, o.class == CopyClass::Reclaimable));
        Some(v)
    }

    fn drop_where(&mut self, gone: impl Fn(&Location) -> bool) -> usize {
        let mut n = 0;
        for owners in self.entries.values_mut() {
            let before = owners.len();
            owners.retain(|o| !gone(o));
            n += before - owners.len();
        }
        let empty: Vec<u8> = self
            .entries
            .iter()
            .filter(|(_, o)| o.is_empty())
            .map(|(&k, _)| k)
            .collect();
        for k in empty {
            self.forget(k);
        }
        n
    }
}

fn pk(k: u8) -> PageKey {
    PageKey::from_bytes(&[k, 0xA5])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_compact_shard_means_what_the_model_means(ops in proptest::collection::vec(op_strategy(), 1..60)) {
        let mut sh = Shard::new(ShardConfig { reclaim_threshold: THRESHOLD, max_entries: NO_CAP, ..ShardConfig::default() });
        let mut m = Model::default();
        for (t, op) in ops.into_iter().enumerate() {
            let now = t as u64;
            match op {
                Op::Insert(k, loc) => {
                    let o = sh.insert(pk(k), loc.clone(), now);
                    let (new_owner, live_owners, reclaimable) = m.insert(k, loc);
                    prop_assert_eq!((o.new_owner, o.live_owners, o.reclaimable), (new_owner, live_owners, reclaimable));
                }
                Op::Lookup(k) => {
                    let got: Option<Vec<Location>> = sh.lookup(pk(k), now).map(|o: Owners| o.into_vec());
                    prop_assert_eq!(got, m.lookup(k));
                }
                Op::Exists(k) => {
                    prop_assert_eq!(sh.exists(pk(k), now), m.peek_live(k).is_some());
                }
                Op::Remove(k, n, g) => {
                    let g = g.map(u64::from);
                    let got = sh.remove(pk(k), &node(n), g);
                    let want = match m.entries.get_mut(&k) {
                        Some(owners) => {
                            let before = owners.len();
                            owners.retain(|o| !(o.node == node(n) && g.is_none_or(|g| g == o.generation)));
                            let removed = owners.len() != before;
                            if owners.is_empty() {
                                m.forget(k);
                            }
                            removed
                        }
                        None => false,
                    };
                    prop_assert_eq!(got, want);
                }
                Op::MarkNonresident(k, n, g) => {
                    let g = g.map(u64::from);
                    let got = sh.mark_nonresident(pk(k), &node(n), g);
                    let want = match m.entries.get_mut(&k).and_then(|o| {
                        o.iter_mut().find(|o| o.node == node(n) && g.is_none_or(|g| g == o.generation))
                    }) {
                        Some(o) => {
                            o.resident = false;
                            true
                        }
                        None => false,
                    };
                    prop_assert_eq!(got, want);
                }
                Op::SetLive(nodes) => {
                    let live: HashSet<NodeId> = nodes.iter().map(|&n| node(n)).collect();
                    let got = sh.set_live(live.iter().cloned());
                    let want = m.drop_where(|o| !live.contains(&o.node));
                    m.live = Some(live);
                    prop_assert_eq!(got, want);
                }
                Op::DropIncarnations(n, inc) => {
                    let got = sh.drop_incarnations_before(&node(n), Incarnation(u64::from(inc)));
                    let want = m.drop_where(|o| o.node == node(n) && o.incarnation != Incarnation(u64::from(inc)));
                    prop_assert_eq!(got, want);
                }
                Op::Merge(k, incoming) => {
                    sh.merge(pk(k), &incoming, now);
                    let owners = m.entry(k, false);
                    for loc in &incoming {
                        match owners.iter_mut().find(|o| o.node == loc.node) {
                            Some(o) if o.generation >= loc.generation => {}
                            Some(o) => *o = loc.clone(),
                            None => owners.push(loc.clone()),
                        }
                    }
                }
                Op::DropKeys(ks) => {
                    let keys: Vec<PageKey> = ks.iter().map(|&k| pk(k)).collect();
                    sh.drop_keys(&keys);
                    for k in ks {
                        m.forget(k);
                    }
                }
                Op::Many(ks) => {
                    let keys: Vec<PageKey> = ks.iter().map(|&k| pk(k)).collect();
                    let exists = sh.exists_many(&keys, now);
                    let want: Vec<bool> = ks.iter().map(|&k| m.peek_live(k).is_some()).collect();
                    prop_assert_eq!(exists, want);
                    let got: Vec<Option<Vec<Location>>> =
                        sh.lookup_many(&keys, now).into_iter().map(|o| o.map(|o| o.into_vec())).collect();
                    let want: Vec<Option<Vec<Location>>> = ks.iter().map(|&k| m.lookup(k)).collect();
                    prop_assert_eq!(got, want);
                }
            }
            // Same keys, same stored owners in the same order.
            let mut keys: Vec<PageKey> = sh.keys().collect();
            keys.sort();
            let mut want: Vec<PageKey> = m.entries.keys().map(|&k| pk(k)).collect();
            want.sort();
            prop_assert_eq!(keys, want);
            for (&k, owners) in &m.entries {
                prop_assert_eq!(sh.peek(pk(k)).map(|o| o.into_vec()), Some(owners.clone()));
            }
            // One owner record per distinct (node, incarnation, rails) still named by a copy.
            let shapes: HashSet<(NodeId, Incarnation, u64)> = m
                .entries
                .values()
                .flatten()
                .map(|o| (o.node.clone(), o.incarnation, o.rails[0].region))
                .collect();
            prop_assert_eq!(sh.owner_records(), shapes.len());
        }
    }

    #[test]
    fn under_a_cap_the_bound_holds_and_evicted_entries_free_their_owner_records(
        ops in proptest::collection::vec(op_strategy(), 1..80)
    ) {
        let mut sh = Shard::new(ShardConfig { reclaim_threshold: THRESHOLD, max_entries: CAP, ..ShardConfig::default() });
        for (t, op) in ops.into_iter().enumerate() {
            let now = t as u64;
            match op {
                Op::Insert(k, loc) => {
                    sh.insert(pk(k), loc, now);
                }
                Op::Lookup(k) => {
                    sh.lookup(pk(k), now);
                }
                Op::Exists(k) => {
                    sh.exists(pk(k), now);
                }
                Op::Remove(k, n, g) => {
                    sh.remove(pk(k), &node(n), g.map(u64::from));
                }
                Op::MarkNonresident(k, n, g) => {
                    sh.mark_nonresident(pk(k), &node(n), g.map(u64::from));
                }
                Op::SetLive(nodes) => {
                    sh.set_live(nodes.iter().map(|&n| node(n)));
                }
                Op::DropIncarnations(n, inc) => {
                    sh.drop_incarnations_before(&node(n), Incarnation(u64::from(inc)));
                }
                Op::Merge(k, incoming) => sh.merge(pk(k), &incoming, now),
                Op::DropKeys(ks) => sh.drop_keys(&ks.iter().map(|&k| pk(k)).collect::<Vec<_>>()),
                Op::Many(ks) => {
                    let keys: Vec<PageKey> = ks.iter().map(|&k| pk(k)).collect();
                    let one_by_one: Vec<bool> = keys.iter().map(|k| sh.exists(*k, now)).collect();
                    prop_assert_eq!(sh.exists_many(&keys, now), one_by_one);
                    sh.lookup_many(&keys, now);
                }
            }
            prop_assert!(sh.len() <= CAP);
            let shapes: HashSet<(NodeId, Incarnation, u64)> = sh
                .keys()
                .flat_map(|k| sh.peek(k).unwrap().into_vec())
                .map(|o| (o.node, o.incarnation, o.rails[0].region))
                .collect();
            prop_assert_eq!(sh.owner_records(), shapes.len());
        }
        let all: Vec<PageKey> = sh.keys().collect();
        sh.drop_keys(&all);
        prop_assert!(sh.is_empty());
        prop_assert_eq!(sh.owner_records(), 0);
    }
}

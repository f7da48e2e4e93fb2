//! The consistent-hash ring: which nodes own a key.
//!
//! Points sit at `xxh3_64(node_id bytes ‖ vnode index as u32 LE)`, `vnodes` per node; a key
//! sits at the high 64 bits of its 128-bit [`PageKey`]; [`Ring::owners`] walks clockwise from
//! the key and collects *distinct* physical nodes. Every build and language computes the same
//! answer (test vectors in this module's tests).
//!
//! Why not the `hashring` crate: it has no virtual nodes, can return the same physical node
//! twice among replicas, clones the ring per replica lookup, and hashes through
//! `std::hash::Hash`, whose byte stream Rust does not promise to keep stable across versions
//! or platforms — a directory every node must compute identically cannot rest on that.

use peercache_wire::{NodeId, PageKey};

/// Default virtual nodes per member.
pub const DEFAULT_VNODES: u32 = 160;

/// A ring over a set of members.
#[derive(Clone, Debug, Default)]
pub struct Ring {
    members: Vec<NodeId>,
    points: Vec<(u64, u32)>,
    /// `starts[b]`: the first point whose top bits are `b` or more (one more entry than
    /// buckets), so finding a key's point searches a bucket of a point or two instead of the
    /// whole ring.
    starts: Vec<u32>,
    /// Right shift that leaves a position's bucket.
    shift: u32,
    vnodes: u32,
}

/// Most bucket bits: 64 Ki buckets (256 KiB of starts) however large the ring.
const MAX_BUCKET_BITS: u32 = 16;

/// Ring position of one virtual node.
pub fn point(node: &NodeId, vnode: u32) -> u64 {
    let mut buf = [0u8; peercache_wire::ids::MAX_NODE_ID_LEN + 4];
    let id = node.as_bytes();
    buf[..id.len()].copy_from_slice(id);
    buf[id.len()..id.len() + 4].copy_from_slice(&vnode.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&buf[..id.len() + 4])
}

impl Ring {
    /// Builds a ring over `members` (duplicates ignored, order irrelevant).
    pub fn new(members: impl IntoIterator<Item = NodeId>, vnodes: u32) -> Ring {
        let mut members: Vec<NodeId> = members.into_iter().collect();
        members.sort();
        members.dedup();
        let vnodes = vnodes.max(1);
        let mut points = Vec::with_capacity(members.len() * vnodes as usize);
        for (i, m) in members.iter().enumerate() {
            for v in 0..vnodes {
                points.push((point(m, v), i as u32));
            }
        }
        points.sort_unstable();
        let bits = points
            .len()
            .next_power_of_two()
            .trailing_zeros()
            .clamp(1, MAX_BUCKET_BITS);
        let shift = 64 - bits;
        let mut starts = Vec::with_capacity((1 << bits) + 1);
        let mut at = 0usize;
        for b in 0..=(1u64 << bits) {
            while at < points.len() && (points[at].0 >> shift) < b {
                at += 1;
            }
            starts.push(at as u32);
        }
        Ring {
            members,
            points,
            starts,
            shift,
            vnodes,
        }
    }

    /// Members, sorted by id.
    pub fn members(&self) -> &[NodeId] {
        &self.members
    }

    /// Virtual nodes per member.
    pub fn vnodes(&self) -> u32 {
        self.vnodes
    }

    /// True if `node` is a member.
    pub fn contains(&self, node: &NodeId) -> bool {
        self.members.binary_search(node).is_ok()
    }

    /// The member index of `node` (as [`Ring::owner_indices`] returns), if it is a member.
    pub fn index_of(&self, node: &NodeId) -> Option<u32> {
        self.members.binary_search(node).ok().map(|i| i as u32)
    }

    /// True if the ring has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Appends the member indices of up to `n` distinct owners of `key`, clockwise.
    pub fn owner_indices(&self, key: PageKey, n: usize, out: &mut Vec<u32>) {
        out.clear();
        if self.points.is_empty() {
            return;
        }
        let n = n.min(self.members.len());
        let start = self.first_point_at(key.hi());
        let (before, from) = self.points.split_at(start.min(self.points.len()));
        for &(_, m) in from.iter().chain(before) {
            if !out.contains(&m) {
                out.push(m);
                if out.len() == n {
                    break;
                }
            }
        }
    }

    /// The index of the first point at or after `pos` (the points' length when none is).
    fn first_point_at(&self, pos: u64) -> usize {
        let b = (pos >> self.shift) as usize;
        let (lo, hi) = match (self.starts.get(b), self.starts.get(b + 1)) {
            (Some(&lo), Some(&hi)) => (lo as usize, hi as usize),
            // A ring built without buckets (none is): search it whole.
            _ => (0, self.points.len()),
        };
        lo + self.points[lo..hi].partition_point(|&(p, _)| p < pos)
    }

    /// Up to `n` distinct owners of `key`, primary first.
    pub fn owners(&self, key: PageKey, n: usize) -> Vec<NodeId> {
        let mut idx = Vec::with_capacity(n);
        self.owner_indices(key, n, &mut idx);
        idx.into_iter()
            .map(|i| self.members[i as usize].clone())
            .collect()
    }

    /// The primary owner of `key`.
    pub fn primary(&self, key: PageKey) -> Option<&NodeId> {
        let mut idx = Vec::with_capacity(1);
        self.owner_indices(key, 1, &mut idx);
        idx.first().map(|&i| &self.members[i as usize])
    }

    /// The member at `index` (as returned by [`Ring::owner_indices`]).
    pub fn member(&self, index: u32) -> &NodeId {
        &self.members[index as usize]
    }

    /// Fraction of all entries each member stores when every key has `replicas` owners
    /// (sums to `min(replicas, members)`; fair is that divided by the member count).
    pub fn shares_with_replicas(&self, replicas: usize) -> Vec<f64> {
        let mut share = vec![0f64; self.members.len()];
        let len = self.points.len();
        if len == 0 {
            return share;
        }
        let mut idx = Vec::with_capacity(replicas);
        for i in 0..len {
            let (p, _) = self.points[i];
            let prev = self.points[(i + len - 1) % len].0;
            let arc = if len == 1 {
                u64::MAX
            } else {
                p.wrapping_sub(prev)
            };
            // Keys in (prev, p] walk clockwise from point i.
            self.owner_indices(PageKey((p as u128) << 64), replicas, &mut idx);
            for &m in &idx {
                share[m as usize] += arc as f64 / 2f64.powi(64);
            }
        }
        share
    }

    /// Fraction of the key space each member owns as primary (sums to 1).
    pub fn shares(&self) -> Vec<f64> {
        let mut share = vec![0f64; self.members.len()];
        if self.points.is_empty() {
            return share;
        }
        let len = self.points.len();
        for i in 0..len {
            let (p, m) = self.points[i];
            let prev = self.points[(i + len - 1) % len].0;
            // Keys in (prev, p] belong to the member at p.
            let arc = p.wrapping_sub(prev);
            share[m as usize] += arc as f64 / 2f64.powi(64);
        }
        if len == 1 {
            share[self.points[0].1 as usize] = 1.0;
        }
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn ids(n: usize) -> Vec<NodeId> {
        (0..n)
            .map(|i| NodeId::new(format!("node-{i}")).unwrap())
            .collect()
    }

    #[test]
    fn owners_are_distinct_and_stable() {
        let ring = Ring::new(ids(5), DEFAULT_VNODES);
        for k in 0..2000u64 {
            let key = PageKey::from_bytes(&k.to_le_bytes());
            let o = ring.owners(key, 3);
            assert_eq!(o.len(), 3);
            assert!(o[0] != o[1] && o[1] != o[2] && o[0] != o[2]);
            assert_eq!(Some(&o[0]), ring.primary(key));
        }
        assert_eq!(
            ring.owners(PageKey(1), 9).len(),
            5,
            "never more owners than members"
        );
        assert!(Ring::new(Vec::new(), 10).owners(PageKey(1), 2).is_empty());
    }

    /// Committed test vectors: keys → owners for a fixed member set. Any change to hashing,
    /// encoding or the walk breaks every deployed cluster, so it must break this test first.
    #[test]
    fn the_bucketed_search_finds_the_point_a_whole_ring_search_finds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (members, vnodes) in [(1, 1), (2, 3), (3, DEFAULT_VNODES), (1000, DEFAULT_VNODES)] {
            let ring = Ring::new(ids(members), vnodes);
            let mut probes: Vec<u64> = (0..2000).map(|_| rng.random()).collect();
            // The ends of the ring, every point itself and its neighbours.
            probes.extend([0, 1, u64::MAX - 1, u64::MAX]);
            for &(p, _) in ring.points.iter().step_by(97) {
                probes.extend([p.wrapping_sub(1), p, p.wrapping_add(1)]);
            }
            for pos in probes {
                let whole = ring.points.partition_point(|&(p, _)| p < pos);
                assert_eq!(
                    ring.first_point_at(pos),
                    whole,
                    "{members}x{vnodes} at {pos:#x}"
                );
            }
        }
        assert_eq!(
            Ring::default().first_point_at(42),
            0,
            "a ring with no points"
        );
    }

    #[test]
    fn committed_test_vectors() {
        assert_eq!(
            point(&NodeId::new("node-a").unwrap(), 0),
            xxhash_rust::xxh3::xxh3_64(b"node-a\0\0\0\0")
        );
        let ring = Ring::new(
            ["node-a", "node-b", "node-c", "node-d"]
                .iter()
                .map(|s| NodeId::new(s).unwrap()),
            DEFAULT_VNODES,
        );
        let got: Vec<String> = [
            "page-0",
            "page-1",
            "page-2",
            "page-3",
            "page-4",
            "prefix_abc_0_k",
        ]
        .iter()
        .map(|k| {
            ring.owners(PageKey::from_key(k), 2)
                .iter()
                .map(|n| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
        let expected = include_str!("../tests/fixtures/ring_vectors.txt");
        let expected: Vec<&str> = expected.lines().filter(|l| !l.starts_with('#')).collect();
        if std::env::var_os("PEERCACHE_BLESS").is_some() {
            let text = format!(
                "# owners(key, 2) on members node-a..node-d, 160 vnodes\n{}\n",
                got.join("\n")
            );
            std::fs::write(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/tests/fixtures/ring_vectors.txt"
                ),
                text,
            )
            .unwrap();
            return;
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn balance_over_random_member_sets() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut good, mut good_primary) = (0, 0);
        for _ in 0..1000 {
            let members: Vec<NodeId> = (0..10)
                .map(|_| {
                    NodeId::new(format!(
                        "10.{}.{}.{}:{}",
                        rng.random::<u8>(),
                        rng.random::<u8>(),
                        rng.random::<u8>(),
                        rng.random_range(1024..65535u16)
                    ))
                    .unwrap()
                })
                .collect();
            let ring = Ring::new(members, DEFAULT_VNODES);
            let n = ring.members().len() as f64;
            // What a node stores: its share of entries with the default two replicas.
            if ring
                .shares_with_replicas(2)
                .iter()
                .all(|s| (0.8..=1.25).contains(&(s / (2.0 / n))))
            {
                good += 1;
            }
            if ring
                .shares()
                .iter()
                .all(|s| (0.8..=1.25).contains(&(s * n)))
            {
                good_primary += 1;
            }
        }
        eprintln!(
            "balanced member sets: stored share {good}/1000, primary share {good_primary}/1000"
        );
        assert!(
            good >= 970,
            "only {good}/1000 member sets store within 0.8–1.25× of fair"
        );
        assert!(
            good_primary >= 950,
            "only {good_primary}/1000 member sets own within 0.8–1.25× of fair as primary"
        );
    }

    #[test]
    fn shares_sum_to_one() {
        let ring = Ring::new(ids(7), 50);
        let s: f64 = ring.shares().iter().sum();
        assert!((s - 1.0).abs() < 1e-9);
    }
}

//! The read plan: every decision of one `batch_get`, made without I/O.
//!
//! Fed with the owners the directory (or a primed `exists`) named, and told which pages were
//! served, it answers what to do next: which pages this node serves from its own pool or disk
//! tier, which disk-only copies to ask their owners to promote, and — round by round — which
//! owner to read each remaining page from. Several live copies are tried least-loaded first
//! (reads in flight from this node, ties spread by key), and a page whose read failed moves to
//! its next owner in the following round. The store's read path (`read/get.rs`) is the I/O shell
//! around it; the tests below drive it with no sockets.

use std::collections::HashMap;
use std::net::SocketAddr;

use peercache_directory::{Location, Owners};
use peercache_wire::{NodeId, PageKey};
use smallvec::SmallVec;

/// One transport batch the plan asks for: the owner's data endpoint and, per page, its index
/// in the request and the location read.
pub(crate) type Fetch = (SocketAddr, Vec<(usize, Location)>);

/// The decisions of one read of `keys` (page `i` has `lens[i]` bytes).
pub(crate) struct ReadPlan<'a> {
    me: &'a NodeId,
    keys: &'a [PageKey],
    lens: &'a [u64],
    owners: Vec<Option<Owners>>,
    served: Vec<bool>,
    valid: Vec<u32>,
    /// Remote rounds planned so far: round `r` reads each page from its `r`-th candidate.
    round: usize,
}

impl<'a> ReadPlan<'a> {
    /// A plan with no owner known yet.
    pub(crate) fn new(me: &'a NodeId, keys: &'a [PageKey], lens: &'a [u64]) -> Self {
        debug_assert_eq!(keys.len(), lens.len());
        ReadPlan {
            me,
            keys,
            lens,
            owners: vec![None; keys.len()],
            served: vec![false; keys.len()],
            valid: vec![0; keys.len()],
            round: 0,
        }
    }

    /// Pages in the request.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Records the owners of page `i` (`None`: the directory knows none).
    pub(crate) fn set_owners(&mut self, i: usize, owners: Option<Owners>) {
        self.owners[i] = owners;
    }

    /// The owners of every page (a promotion refreshes them in place).
    pub(crate) fn owners_mut(&mut self) -> &mut [Option<Owners>] {
        &mut self.owners
    }

    /// Unserved pages that list this node among their owners: served from its pool or disk
    /// tier (a page its own pool served before the directory was asked is not listed again).
    pub(crate) fn local(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| {
                !self.served[i]
                    && self.owners[i]
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|l| l.node == *self.me))
            })
            .collect()
    }

    /// The pages not served (yet), in order.
    pub(crate) fn unserved(&self) -> Vec<usize> {
        (0..self.len()).filter(|&i| !self.served[i]).collect()
    }

    /// Whether page `i` has been served.
    pub(crate) fn is_served(&self, i: usize) -> bool {
        self.served[i]
    }

    /// Unserved pages that no other owner holds in memory but another node holds on disk,
    /// grouped by that node (the first such copy of each page): ask it to promote them.
    pub(crate) fn disk_promotions(&self) -> Vec<(NodeId, Vec<usize>)> {
        let mut want: Vec<(NodeId, Vec<usize>)> = Vec::new();
        for i in (0..self.len()).filter(|&i| !self.served[i]) {
            let Some(o) = &self.owners[i] else { continue };
            let fits = |l: &&Location| l.node != *self.me && u64::from(l.len) == self.lens[i];
            if o.iter().filter(fits).any(|l| l.resident) {
                continue;
            }
            if let Some(l) = o.iter().filter(fits).find(|l| !l.resident) {
                match want.iter_mut().find(|w| w.0 == l.node) {
                    Some(w) => w.1.push(i),
                    None => want.push((l.node.clone(), vec![i])),
                }
            }
        }
        want
    }

    /// The next round of remote reads, grouped by owner endpoint: each unserved page from its
    /// next candidate — a remote, resident copy of the right length with an endpoint, ordered
    /// by `load` (reads in flight from this node per endpoint), ties spread by key. Empty when
    /// no page has a candidate left: the read is over.
    pub(crate) fn next_fetches(&mut self, load: &HashMap<SocketAddr, usize>) -> Vec<Fetch> {
        let mut groups: Vec<Fetch> = Vec::new();
        for i in 0..self.len() {
            if self.served[i] {
                continue;
            }
            let Some(o) = &self.owners[i] else { continue };
            let mut cands: SmallVec<[&Location; 2]> = o
                .iter()
                .filter(|l| {
                    l.node != *self.me
                        && l.resident
                        && u64::from(l.len) == self.lens[i]
                        && !l.rails.is_empty()
                })
                .collect();
            if cands.len() > 1 {
                let key = self.keys[i];
                cands.sort_by_key(|l| {
                    let ep = l.rails[0].endpoint;
                    let spread = key.lo() ^ l.addr.rotate_left(17) ^ u64::from(ep.port());
                    (load.get(&ep).copied().unwrap_or(0), spread)
                });
            }
            if let Some(l) = cands.get(self.round) {
                self.valid[i] = l.valid_len;
                let ep = l.rails[0].endpoint;
                match groups.iter_mut().find(|g| g.0 == ep) {
                    Some(g) => g.1.push((i, (*l).clone())),
                    None => groups.push((ep, vec![(i, (*l).clone())])),
                }
            }
        }
        self.round += 1;
        groups
    }

    /// Page `i` was read from a remote owner chosen by [`ReadPlan::next_fetches`] and verified;
    /// its header says `valid_len` bytes hold data.
    pub(crate) fn served_remote(&mut self, i: usize, valid_len: u32) {
        self.served[i] = true;
        self.valid[i] = valid_len;
    }

    /// Page `i` was served by this node, with `valid_len` bytes of data.
    pub(crate) fn served_local(&mut self, i: usize, valid_len: u32) {
        self.served[i] = true;
        self.valid[i] = valid_len;
    }

    /// Page `i`'s length in bytes.
    pub(crate) fn page_len(&self, i: usize) -> u64 {
        self.lens[i]
    }

    /// The data bytes of page `i` as its copy states them.
    pub(crate) fn valid_len(&self, i: usize) -> u32 {
        self.valid[i]
    }

    /// Pages that had owners but were not served (their cached locations are stale).
    pub(crate) fn missed_with_owners(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| !self.served[i] && self.owners[i].is_some())
    }

    /// Pages served.
    pub(crate) fn hits(&self) -> u64 {
        self.served.iter().filter(|s| **s).count() as u64
    }

    /// Per page: the data bytes if served.
    pub(crate) fn finish(self) -> Vec<Option<u32>> {
        self.served
            .iter()
            .zip(self.valid)
            .map(|(&s, v)| s.then_some(v))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peercache_directory::{CopyClass, Rail};
    use peercache_wire::Incarnation;
    use smallvec::smallvec;

    const LEN: u32 = 4096;

    fn node(n: u8) -> NodeId {
        NodeId::new(format!("node-{n}")).unwrap()
    }

    fn ep(n: u8) -> SocketAddr {
        format!("127.0.0.{n}:7000").parse().unwrap()
    }

    fn at(n: u8, resident: bool) -> Location {
        Location {
            node: node(n),
            incarnation: Incarnation(1),
            rails: smallvec![Rail {
                endpoint: ep(n),
                region: 1,
            }],
            addr: u64::from(n) << 20,
            len: LEN,
            valid_len: LEN - u32::from(n),
            generation: 1,
            checksum: 0,
            resident,
            class: CopyClass::Retained,
            layout: peercache_wire::Layout::NONE,
        }
    }

    fn keys(n: usize) -> Vec<PageKey> {
        (0..n)
            .map(|i| PageKey::from_key(&format!("k{i}")))
            .collect()
    }

    fn endpoints(f: &[Fetch]) -> Vec<(SocketAddr, Vec<usize>)> {
        f.iter()
            .map(|(e, p)| (*e, p.iter().map(|(i, _)| *i).collect()))
            .collect()
    }

    #[test]
    fn pages_this_node_owns_are_local_and_the_rest_go_to_their_owner() {
        let me = node(1);
        let (ks, lens) = (keys(3), vec![u64::from(LEN); 3]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        p.set_owners(0, Some(smallvec![at(2, true), at(1, true)]));
        p.set_owners(1, Some(smallvec![at(2, true)]));
        assert_eq!(p.local(), [0]);
        p.served_local(0, 100);
        assert!(p.is_served(0) && !p.is_served(1));
        assert!(
            p.local().is_empty(),
            "a served page is not local work any more"
        );
        let f = p.next_fetches(&HashMap::new());
        assert_eq!(endpoints(&f), [(ep(2), vec![1])]);
        p.served_remote(1, LEN - 2);
        assert!(
            p.next_fetches(&HashMap::new()).is_empty(),
            "nothing left to try"
        );
        assert_eq!(p.hits(), 2);
        assert_eq!(p.missed_with_owners().count(), 0, "page 2 had no owner");
        assert_eq!(p.finish(), [Some(100), Some(LEN - 2), None]);
    }

    #[test]
    fn the_least_loaded_owner_is_tried_first() {
        let me = node(1);
        let (ks, lens) = (keys(1), vec![u64::from(LEN)]);
        for (busy, expect) in [(2u8, 3u8), (3, 2)] {
            let mut p = ReadPlan::new(&me, &ks, &lens);
            p.set_owners(0, Some(smallvec![at(2, true), at(3, true)]));
            let load: HashMap<SocketAddr, usize> = [(ep(busy), 5)].into();
            assert_eq!(endpoints(&p.next_fetches(&load)), [(ep(expect), vec![0])]);
        }
    }

    #[test]
    fn equal_load_spreads_pages_over_owners_by_key() {
        let me = node(1);
        let (ks, lens) = (keys(64), vec![u64::from(LEN); 64]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        for i in 0..64 {
            p.set_owners(i, Some(smallvec![at(2, true), at(3, true)]));
        }
        let f = p.next_fetches(&HashMap::new());
        assert_eq!(f.len(), 2, "both owners get pages");
        let (a, b) = (f[0].1.len(), f[1].1.len());
        assert_eq!(a + b, 64);
        assert!(a.min(b) >= 16, "spread {a}/{b}");
    }

    #[test]
    fn a_failed_read_moves_to_the_next_owner_then_gives_up() {
        let me = node(1);
        let (ks, lens) = (keys(2), vec![u64::from(LEN); 2]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        p.set_owners(0, Some(smallvec![at(2, true), at(3, true)]));
        p.set_owners(1, Some(smallvec![at(2, true)]));
        let load: HashMap<SocketAddr, usize> = [(ep(3), 1)].into();
        // Round 1: both pages from node 2 (the idle one); neither is served.
        assert_eq!(endpoints(&p.next_fetches(&load)), [(ep(2), vec![0, 1])]);
        // Round 2: page 0 from its second owner; page 1 has no other owner.
        let f = p.next_fetches(&load);
        assert_eq!(endpoints(&f), [(ep(3), vec![0])]);
        assert_eq!(f[0].1[0].1.valid_len, LEN - 3);
        p.served_remote(0, LEN - 3);
        assert!(p.next_fetches(&load).is_empty());
        assert_eq!(p.missed_with_owners().collect::<Vec<_>>(), [1]);
        assert_eq!(p.finish(), [Some(LEN - 3), None]);
    }

    #[test]
    fn unusable_copies_are_never_read() {
        let me = node(1);
        let (ks, lens) = (keys(1), vec![u64::from(LEN)]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        let mut short = at(2, true);
        short.len = LEN / 2;
        let mut no_rails = at(3, true);
        no_rails.rails.clear();
        let on_disk = at(4, false);
        let mine = at(1, true);
        p.set_owners(0, Some(smallvec![short, no_rails, on_disk, mine]));
        assert!(p.next_fetches(&HashMap::new()).is_empty());
    }

    #[test]
    fn disk_only_copies_are_asked_for_per_owner_unless_a_live_copy_exists() {
        let me = node(1);
        let (ks, lens) = (keys(4), vec![u64::from(LEN); 4]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        p.set_owners(0, Some(smallvec![at(2, false)]));
        p.set_owners(1, Some(smallvec![at(3, false), at(2, false)]));
        p.set_owners(2, Some(smallvec![at(2, false), at(3, true)]));
        p.set_owners(3, Some(smallvec![at(2, false)]));
        p.served_local(3, LEN);
        assert_eq!(
            p.disk_promotions(),
            [(node(2), vec![0]), (node(3), vec![1])],
            "page 2 has a live copy on node 3; page 3 is served"
        );
    }

    #[test]
    fn the_valid_length_of_a_remote_page_is_its_verified_headers_not_the_directorys() {
        let me = node(1);
        let (ks, lens) = (keys(1), vec![u64::from(LEN)]);
        let mut p = ReadPlan::new(&me, &ks, &lens);
        // The directory says LEN - 2 bytes hold data; the slot header that verified says 100.
        p.set_owners(0, Some(smallvec![at(2, true)]));
        let f = p.next_fetches(&HashMap::new());
        assert_eq!(f[0].1[0].1.valid_len, LEN - 2);
        p.served_remote(0, 100);
        assert_eq!(p.finish(), [Some(100)]);
    }
}

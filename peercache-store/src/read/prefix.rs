//! Prefix location for routers: given a request's page keys in order and where the directory
//! says each lives, how long a leading run of them every node holds — the answer a
//! cache-aware router needs to send the request where its prefix already is.

use peercache_directory::{Holding, KeyHolders, Location};
use peercache_wire::NodeId;

/// One node's share of a request's prefix.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefixRun {
    /// The node.
    pub node: NodeId,
    /// Leading keys this node holds a copy of (in its pool or on its disk tier).
    pub leading: usize,
    /// Leading keys this node holds in memory (the fast part of the run: no disk promotion).
    pub resident: usize,
}

/// Every node that holds the first key, with its leading run, longest first (ties by node
/// id). `owners[i]` are key `i`'s copies as the directory lists them; a node absent from the
/// answer holds no leading key.
///
/// ```
/// use peercache_directory::{CopyClass, Location};
/// use peercache_store::prefix_runs;
/// use peercache_wire::{Incarnation, NodeId};
///
/// let at = |node: &str, resident: bool| Location {
///     node: NodeId::new(node).unwrap(), incarnation: Incarnation(1), rails: Default::default(),
///     addr: 0, len: 4096, valid_len: 4096, generation: 1, checksum: 0, resident,
///     class: CopyClass::Retained, layout: Default::default(),
/// };
/// // Keys 0–2: a holds all three (the last only on disk), b the first two.
/// let owners = vec![
///     vec![at("a", true), at("b", true)],
///     vec![at("a", true), at("b", true)],
///     vec![at("a", false)],
/// ];
/// let runs = prefix_runs(&owners);
/// assert_eq!((runs[0].node.as_str(), runs[0].leading, runs[0].resident), ("a", 3, 2));
/// assert_eq!((runs[1].node.as_str(), runs[1].leading, runs[1].resident), ("b", 2, 2));
/// ```
pub fn prefix_runs<O: AsRef<[Location]>>(owners: &[O]) -> Vec<PrefixRun> {
    finish(
        runs_of(
            owners
                .iter()
                .map(|o| o.as_ref().iter().map(|l| (&l.node, l.resident))),
        ),
        |n| (*n).clone(),
    )
}

/// [`prefix_runs`] of the compact answer the directory gives a prefix query: per key, each
/// holder and whether its copy is in memory.
///
/// ```
/// use peercache_directory::Holding;
/// use peercache_store::prefix_runs_of;
/// use peercache_wire::NodeId;
///
/// let (a, b) = (NodeId::new("a").unwrap(), NodeId::new("b").unwrap());
/// let keys: Vec<Holding> = vec![
///     [(a.clone(), true), (b.clone(), true)].into_iter().collect(),
///     [(a.clone(), false)].into_iter().collect(),
/// ];
/// let runs = prefix_runs_of(&keys);
/// assert_eq!((runs[0].node.as_str(), runs[0].leading, runs[0].resident), ("a", 2, 1));
/// assert_eq!((runs[1].node.as_str(), runs[1].leading, runs[1].resident), ("b", 1, 1));
/// ```
pub fn prefix_runs_of(holders: &[Holding]) -> Vec<PrefixRun> {
    finish(
        runs_of(holders.iter().map(|h| h.iter().map(|(n, r)| (n, *r)))),
        |n| (*n).clone(),
    )
}

/// [`prefix_runs`] of the directory's compact answer ([`KeyHolders`], from
/// `DirectoryClient::key_holders`): nodes are compared as indices into its table, so the walk
/// allocates nothing per key and clones no node id per copy. A batch whose copies name a node
/// past its table ([`KeyHolders::check`] refuses it) skips those copies.
///
/// ```
/// use peercache_directory::KeyHolders;
/// use peercache_store::prefix_runs_in;
/// use peercache_wire::NodeId;
///
/// let (a, b) = (NodeId::new("a").unwrap(), NodeId::new("b").unwrap());
/// let mut keys = KeyHolders::default();
/// keys.push_key([(&a, true), (&b, true)]);
/// keys.push_key([(&a, false)]);
/// let runs = prefix_runs_in(&keys);
/// assert_eq!((runs[0].node.as_str(), runs[0].leading, runs[0].resident), ("a", 2, 1));
/// assert_eq!((runs[1].node.as_str(), runs[1].leading, runs[1].resident), ("b", 1, 1));
/// ```
pub fn prefix_runs_in(holders: &KeyHolders) -> Vec<PrefixRun> {
    let nodes = &holders.nodes;
    let runs = runs_of((0..holders.len()).map(|i| {
        holders
            .copies(i)
            .iter()
            .filter(|&&c| ((c >> 1) as usize) < nodes.len())
            .map(|&c| (c >> 1, c & 1 == 1))
    }));
    finish(runs, |&i| nodes[i as usize].clone())
}

/// Runs as [`PrefixRun`]s, longest first (ties by node id).
fn finish<N>(runs: Vec<Open<N>>, id: impl Fn(&N) -> NodeId) -> Vec<PrefixRun> {
    let mut out: Vec<PrefixRun> = runs
        .iter()
        .map(|r| PrefixRun {
            node: id(&r.node),
            leading: r.leading.0,
            resident: r.resident.0,
        })
        .collect();
    out.sort_by(|a, b| b.leading.cmp(&a.leading).then_with(|| a.node.cmp(&b.node)));
    out
}

/// One node's run while the keys are walked.
struct Open<N> {
    /// The node (an id, or an index into a node table).
    node: N,
    /// Leading run, and whether it is still open.
    leading: (usize, bool),
    /// Resident run, and whether it is still open.
    resident: (usize, bool),
    /// This key: a copy seen, an in-memory copy seen.
    here: (bool, bool),
}

/// The runs of every node holding the first key: per key, its copies as (node, in memory).
fn runs_of<N, K, C>(keys: K) -> Vec<Open<N>>
where
    N: PartialEq,
    K: Iterator<Item = C>,
    C: Iterator<Item = (N, bool)>,
{
    let mut runs: Vec<Open<N>> = Vec::new();
    for (i, copies) in keys.enumerate() {
        if i > 0 && !runs.iter().any(|r| r.leading.1) {
            break;
        }
        for (node, resident) in copies {
            match runs.iter_mut().find(|r| r.node == node) {
                Some(r) => {
                    r.here.0 = true;
                    r.here.1 |= resident;
                }
                // Only a holder of the first key has a run.
                None if i == 0 => runs.push(Open {
                    node,
                    leading: (0, true),
                    resident: (0, true),
                    here: (true, resident),
                }),
                None => {}
            }
        }
        for r in &mut runs {
            let (held, in_memory) = std::mem::take(&mut r.here);
            if r.leading.1 {
                r.leading.1 = held;
                r.leading.0 += usize::from(held);
            }
            if r.resident.1 {
                r.resident.1 = in_memory;
                r.resident.0 += usize::from(in_memory);
            }
        }
    }
    runs
}

/// Prefix runs as JSON: `[{"node", "leading", "resident"}, …]`, longest first — what
/// `locate --prefix --json` prints under `nodes`, `POST /prefix` answers and the Python
/// bindings return.
///
/// ```
/// use peercache_store::{PrefixRun, prefix_json};
/// use peercache_wire::NodeId;
///
/// let runs = [PrefixRun { node: NodeId::new("a").unwrap(), leading: 3, resident: 2 }];
/// assert_eq!(prefix_json(&runs), serde_json::json!([{"node": "a", "leading": 3, "resident": 2}]));
/// ```
pub fn prefix_json(runs: &[PrefixRun]) -> serde_json::Value {
    runs.iter()
        .map(|r| {
            serde_json::json!({
                "node": r.node.as_str(), "leading": r.leading, "resident": r.resident,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use peercache_directory::CopyClass;
    use peercache_wire::Incarnation;

    fn at(node: &str, resident: bool) -> Location {
        Location {
            node: NodeId::new(node).unwrap(),
            incarnation: Incarnation(1),
            rails: Default::default(),
            addr: 0,
            len: 1,
            valid_len: 1,
            generation: 1,
            checksum: 0,
            resident,
            class: CopyClass::Retained,
            layout: Default::default(),
        }
    }

    /// The run of `node` by the definition: leading keys with a copy on it.
    fn brute(owners: &[Vec<Location>], node: &str, resident_only: bool) -> usize {
        owners
            .iter()
            .take_while(|o| {
                o.iter()
                    .any(|l| l.node.as_str() == node && (l.resident || !resident_only))
            })
            .count()
    }

    #[test]
    fn runs_equal_a_brute_force_scan_on_random_placements() {
        let nodes = ["a", "b", "c"];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..500 {
            let len = (x % 40) as usize;
            let owners: Vec<Vec<Location>> = (0..len)
                .map(|_| {
                    let mut o = Vec::new();
                    for n in nodes {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if x % 10 < 8 {
                            o.push(at(n, !x.is_multiple_of(3)));
                        }
                    }
                    o
                })
                .collect();
            let runs = prefix_runs(&owners);
            let holding: Vec<Holding> = owners
                .iter()
                .map(|o| o.iter().map(|l| (l.node.clone(), l.resident)).collect())
                .collect();
            assert_eq!(prefix_runs_of(&holding), runs, "both forms agree");
            let mut compact = KeyHolders::default();
            for o in &owners {
                compact.push_key(o.iter().map(|l| (&l.node, l.resident)));
            }
            assert_eq!(prefix_runs_in(&compact), runs, "the compact form agrees");
            for n in nodes {
                let got = runs.iter().find(|r| r.node.as_str() == n);
                let (leading, resident) = (brute(&owners, n, false), brute(&owners, n, true));
                match got {
                    Some(r) => assert_eq!((r.leading, r.resident), (leading, resident), "{n}"),
                    None => assert_eq!(leading, 0, "{n} holds the first key"),
                }
            }
            assert!(runs.windows(2).all(|w| w[0].leading >= w[1].leading));
        }
    }

    #[test]
    fn no_keys_or_no_first_copy_is_no_run() {
        assert!(prefix_runs::<Vec<Location>>(&[]).is_empty());
        assert!(prefix_runs(&[vec![], vec![at("a", true)]]).is_empty());
    }
}

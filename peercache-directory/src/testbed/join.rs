//! A node joins with an empty shard while readers look keys up ([`run`]): the members hand it
//! their entries at `handoff_bytes_per_s`, and the readers count what they miss.
//!
//! Old members are [`TestNode`]s `first..first + members`, the newcomer is `first + members`.
//! Each old member publishes every `members`-th entry through its own client (real inserts on
//! the ring owners). The newcomer installs the new ring first (so its shard is the one asked
//! while empty); then the old members install it, each on its own thread, and hand off paced.
//! Readers on the newcomer and on an old member look up 256-key batches of the published
//! entries throughout, and once more after the last sender finished.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use peercache_wire::Incarnation;

use super::{TestNode, page_key};
use crate::DirError;
use crate::client::{ClientConfig, Member};
use crate::location::Location;

/// What a join run is made of.
#[derive(Clone, Debug)]
pub struct JoinConfig {
    /// Index of the first test node (addresses `127.0.0.(first+1)`…).
    pub first: usize,
    /// Members before the join.
    pub members: usize,
    /// Entries published before the join.
    pub entries: u64,
    /// Owners per entry.
    pub replicas: usize,
    /// Each sender's hand-off pace (bytes per second; 0: unpaced).
    pub rate: u64,
    /// The ring change grace (`handoff_grace`): misses are retried on every member this long.
    pub grace: Duration,
    /// How much later each old member learns of the join than the one before it (discovery
    /// reaches members at different times): old member `o` installs the new ring `o ×
    /// stagger` after the first.
    pub stagger: Duration,
}

impl Default for JoinConfig {
    fn default() -> Self {
        JoinConfig {
            first: 60,
            members: 3,
            entries: 100_000,
            replicas: 2,
            rate: 1 << 20,
            grace: Duration::from_millis(50),
            stagger: Duration::ZERO,
        }
    }
}

/// What a join run measured.
#[derive(Clone, Debug, Default)]
pub struct Join {
    /// From the first old member's ring change to the last one's hand-off done.
    pub handoff: Duration,
    /// Entries handed off to the newcomer.
    pub sent: usize,
    /// Entries whose hand-off failed.
    pub failed: usize,
    /// Keys looked up by the readers.
    pub lookups: u64,
    /// Of them, not found (each published entry exists throughout: every miss is spurious).
    pub misses: u64,
    /// Of them, found with another location than the one published.
    pub wrong: u64,
    /// Keys the readers were pointed at a previous holder for.
    pub redirects: u64,
    /// Whether the newcomer still counted itself as receiving after the last sender finished.
    pub still_receiving: bool,
    /// Entries in the newcomer's shard at the end.
    pub newcomer_entries: usize,
}

/// The location entry `i` was published at by old member `owner` (a node index).
pub fn location(owner: usize, i: u64) -> Location {
    super::published(owner, Incarnation(1), i, i * 4096)
}

/// Runs the join (see the module docs).
///
/// # Errors
/// [`DirError::Wire`] when a node cannot bind; an insert's error.
pub fn run(cfg: &JoinConfig) -> Result<Join, DirError> {
    let client = ClientConfig {
        replicas: cfg.replicas,
        handoff_grace: cfg.grace,
        handoff_bytes_per_s: cfg.rate,
        max_keys_per_request: 2048,
        ..ClientConfig::default()
    };
    let nodes: Vec<Arc<TestNode>> = (cfg.first..=cfg.first + cfg.members)
        .map(|i| TestNode::start(i, Incarnation(1), client.clone()).map(Arc::new))
        .collect::<Result<_, _>>()?;
    let (old, newcomer) = nodes.split_at(cfg.members);
    let old_ring: Vec<Member> = old.iter().map(|n| n.member()).collect();
    for n in old {
        n.client.apply_membership(&old_ring);
    }
    let m = cfg.members as u64;
    let mut batch = Vec::with_capacity(8192);
    for (o, n) in old.iter().enumerate() {
        let mut i = o as u64;
        while i < cfg.entries {
            batch.clear();
            while i < cfg.entries && batch.len() < 8192 {
                batch.push((page_key(i), location(cfg.first + o, i)));
                i += m;
            }
            n.client.insert(&batch)?;
        }
    }
    let all: Vec<Member> = nodes.iter().map(|n| n.member()).collect();
    newcomer[0].client.apply_membership(&all);
    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let readers: Vec<_> = [newcomer[0].clone(), old[0].clone()]
        .into_iter()
        .enumerate()
        .map(|(r, node)| {
            let (done, tally, entries, first) =
                (done.clone(), tally.clone(), cfg.entries, cfg.first);
            std::thread::spawn(move || {
                let mut next = r as u64 * 7919;
                let mut last_round = false;
                let mut ids = Vec::with_capacity(256);
                let mut keys = Vec::with_capacity(256);
                loop {
                    let finished = done.load(Ordering::Acquire);
                    ids.clear();
                    keys.clear();
                    for j in 0..256u64 {
                        let i = (next + j * 389) % entries;
                        ids.push(i);
                        keys.push(page_key(i));
                    }
                    next = (next + 256 * 389 + 1) % entries;
                    let (mut miss, mut wrong) = (0, 0);
                    match node.client.lookup(&keys) {
                        Ok(found) => {
                            for (&i, owners) in ids.iter().zip(found) {
                                let want = location(first + (i % m) as usize, i);
                                match owners {
                                    Some(o) if o.contains(&want) => {}
                                    Some(_) => wrong += 1,
                                    None => miss += 1,
                                }
                            }
                        }
                        Err(_) => miss += keys.len() as u64,
                    }
                    tally[0].fetch_add(keys.len() as u64, Ordering::Relaxed);
                    tally[1].fetch_add(miss, Ordering::Relaxed);
                    tally[2].fetch_add(wrong, Ordering::Relaxed);
                    if last_round {
                        return;
                    }
                    last_round = finished;
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let senders: Vec<_> = old
        .iter()
        .enumerate()
        .map(|(o, n)| {
            let (n, all, late) = (n.clone(), all.clone(), cfg.stagger * o as u32);
            std::thread::spawn(move || {
                // The emulated propagation delay of the join to this member.
                std::thread::sleep(late);
                n.client.apply_membership(&all)
            })
        })
        .collect();
    let reports: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().unwrap_or_default())
        .collect();
    let handoff = t0.elapsed();
    let still_receiving = newcomer[0].service.receiving();
    done.store(true, Ordering::Release);
    for r in readers {
        let _ = r.join();
    }
    Ok(Join {
        handoff,
        sent: reports.iter().map(|r| r.sent).sum(),
        failed: reports.iter().map(|r| r.failed).sum(),
        lookups: tally[0].load(Ordering::Relaxed),
        misses: tally[1].load(Ordering::Relaxed),
        wrong: tally[2].load(Ordering::Relaxed),
        redirects: nodes.iter().map(|n| n.client.stats().redirects).sum(),
        still_receiving,
        newcomer_entries: newcomer[0].service.with_shard(|s, _| s.len()),
    })
}

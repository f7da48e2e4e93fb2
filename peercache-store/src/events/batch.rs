//! Changes of a directory shard as vLLM `KVEventBatch`es (`vllm.distributed.kv_events`): one
//! batch per holding node, its events in the shard's order, consecutive changes of the same
//! kind and tier folded into one event. Encoded as msgspec encodes those classes (the batch an
//! array `[ts, events]`, each event a map tagged by `type`), so vLLM's own decoder reads them.
//!
//! A page's block hash is its 16-byte PeerCache page key (`xxh3_128` of the key string, big
//! endian; `peercache.page_hash(key)` in Python); the tier is the event's `medium` (`CPU`: in
//! the holder's memory, `STORAGE`: only on its disk tier).

use peercache_directory::{Change, ChangeKind};
use peercache_wire::NodeId;

use super::msgpack as mp;

/// Most block hashes in one batch (a batch is one ZeroMQ message, about 18 bytes a hash).
pub(crate) const MAX_HASHES_PER_BATCH: usize = 4096;

/// One batch, ready to frame: the node whose copies it reports, and the encoded batch.
#[derive(Debug)]
pub(crate) struct Encoded {
    pub(crate) holder: NodeId,
    pub(crate) payload: Vec<u8>,
}

/// Encodes `changes` into batches stamped `ts` (seconds since the Unix epoch), telling
/// `block_size` tokens per page.
pub(crate) fn encode(changes: &[Change], block_size: u64, ts: f64) -> Vec<Encoded> {
    // Each holder's changes, in the shard's order (few holders: a linear search).
    let mut by_holder: Vec<(NodeId, Vec<&Change>)> = Vec::new();
    for c in changes {
        match by_holder.iter_mut().find(|(n, _)| *n == c.node) {
            Some((_, v)) => v.push(c),
            None => by_holder.push((c.node.clone(), vec![c])),
        }
    }
    let mut out = Vec::new();
    for (holder, list) in by_holder {
        for chunk in list.chunks(MAX_HASHES_PER_BATCH) {
            out.push(Encoded {
                holder: holder.clone(),
                payload: batch(chunk, block_size, ts),
            });
        }
    }
    out
}

/// The batch that tells a subscriber to forget what this publisher told it (the state follows).
pub(crate) fn all_cleared(ts: f64) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    mp::array(&mut b, 2);
    mp::f64(&mut b, ts);
    mp::array(&mut b, 1);
    mp::map(&mut b, 1);
    mp::str(&mut b, "type");
    mp::str(&mut b, "AllBlocksCleared");
    b
}

fn same_event(a: &Change, b: &Change) -> bool {
    a.kind == b.kind && a.resident == b.resident
}

fn batch(list: &[&Change], block_size: u64, ts: f64) -> Vec<u8> {
    let events = list
        .iter()
        .enumerate()
        .filter(|(i, c)| *i == 0 || !same_event(list[i - 1], c))
        .count();
    let mut b = Vec::with_capacity(32 + list.len() * 18 + events * 120);
    mp::array(&mut b, 2);
    mp::f64(&mut b, ts);
    mp::array(&mut b, events);
    let mut at = 0;
    while at < list.len() {
        let first = list[at];
        let run = list[at..]
            .iter()
            .take_while(|c| same_event(first, c))
            .count();
        let medium = if first.resident { "CPU" } else { "STORAGE" };
        match first.kind {
            ChangeKind::Stored => {
                mp::map(&mut b, 8);
                mp::str(&mut b, "type");
                mp::str(&mut b, "BlockStored");
                hashes(&mut b, &list[at..at + run]);
                mp::str(&mut b, "parent_block_hash");
                mp::nil(&mut b);
                mp::str(&mut b, "token_ids");
                mp::array(&mut b, 0);
                mp::str(&mut b, "block_size");
                mp::uint(&mut b, block_size);
                mp::str(&mut b, "lora_id");
                mp::nil(&mut b);
                mp::str(&mut b, "medium");
                mp::str(&mut b, medium);
                mp::str(&mut b, "lora_name");
                mp::nil(&mut b);
            }
            ChangeKind::Removed => {
                mp::map(&mut b, 3);
                mp::str(&mut b, "type");
                mp::str(&mut b, "BlockRemoved");
                hashes(&mut b, &list[at..at + run]);
                mp::str(&mut b, "medium");
                mp::str(&mut b, medium);
            }
        }
        at += run;
    }
    b
}

fn hashes(b: &mut Vec<u8>, run: &[&Change]) {
    mp::str(b, "block_hashes");
    mp::array(b, run.len());
    for c in run {
        mp::bin8(b, &c.key.0.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peercache_wire::PageKey;

    fn ch(k: u128, n: &str, resident: bool, kind: ChangeKind) -> Change {
        Change {
            key: PageKey(k),
            node: NodeId::new(n).unwrap(),
            resident,
            kind,
        }
    }

    #[test]
    fn one_batch_per_holder_with_runs_folded_in_order() {
        use ChangeKind::*;
        let changes = [
            ch(1, "a", true, Stored),
            ch(2, "b", true, Stored),
            ch(3, "a", true, Stored),
            ch(1, "a", true, Removed),
            ch(1, "a", false, Stored),
        ];
        let out = encode(&changes, 16, 2.0);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].holder.as_str(), "a");
        let p = &out[0].payload;
        // [ts, [3 events]]
        assert_eq!(&p[..10], &[0x92, 0xcb, 0x40, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(p[10], 0x93);
        // The first event folds keys 1 and 3.
        let stored = b"\xa4type\xabBlockStored\xacblock_hashes\x92";
        let at = p.windows(stored.len()).position(|w| w == stored).unwrap();
        assert_eq!(p[at + stored.len()], 0xc4);
        assert_eq!(p[at + stored.len() + 1], 16);
        assert_eq!(
            p.windows(b"STORAGE".len())
                .filter(|w| w == b"STORAGE")
                .count(),
            1
        );
        let long: Vec<Change> = (0..(MAX_HASHES_PER_BATCH as u128 + 1))
            .map(|k| ch(k, "a", true, Stored))
            .collect();
        assert_eq!(encode(&long, 16, 0.0).len(), 2);
        assert!(all_cleared(1.0).ends_with(b"\x81\xa4type\xb0AllBlocksCleared"));
    }
}

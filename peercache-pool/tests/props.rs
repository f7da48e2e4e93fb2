//! Property test of the pool: random publish / remove / demote / lease sequences keep the
//! invariants, and every resident page reads back exactly what was written.

use std::collections::HashMap;

use peercache_pool::{PageWrite, Pool, PoolConfig, PublishScratch, Published, ReplClass};
use peercache_wire::{Layout, PageKey};
use proptest::prelude::*;

fn bytes(key: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (key as usize * 31 + i) as u8).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn pool_invariants_hold_and_pages_read_back(ops in prop::collection::vec((0u8..4, 0u64..300, prop::sample::select(vec![1000usize, 4096, 20000, 70000])), 1..300)) {
        let pool = Pool::new(PoolConfig { slab_bytes: 1 << 20, ..PoolConfig::new(4 << 20) }).unwrap();
        let mut lens: HashMap<u64, usize> = HashMap::new();
        let mut scratch = PublishScratch::default();
        let (mut out, mut evicted) = (Vec::new(), Vec::new());
        for (op, k, len) in ops {
            let key = PageKey(k as u128 + 1);
            match op {
                0 | 1 => {
                    let data = bytes(k, len);
                    let segs = [data.as_slice()];
                    let class = if op == 0 { ReplClass::Retained } else { ReplClass::Reclaimable };
                    pool.publish_batch(&[PageWrite { key, segments: &segs, valid_len: None, layout: Layout::NONE }], class, &mut scratch, &mut out, &mut evicted);
                    if let Published::New(_) = out[0] {
                        lens.insert(k, len);
                    }
                    for e in evicted.drain(..) {
                        lens.remove(&(e.key.0 as u64 - 1));
                    }
                }
                2 => {
                    if pool.remove_batch(&[(key, None)]) == 1 {
                        lens.remove(&k);
                    }
                }
                _ => {
                    pool.mark_reclaimable(&[key]);
                }
            }
            pool.check_invariants();
        }
        for (k, len) in &lens {
            let key = PageKey(*k as u128 + 1);
            prop_assert!(pool.contains(key));
            let leases = pool.lease_batch(&[key]);
            let mut buf = vec![0u8; *len];
            pool.read_leased(&leases, 0, key, &mut [&mut buf[..]]).unwrap();
            prop_assert_eq!(&buf, &bytes(*k, *len));
        }
        let s = pool.stats();
        prop_assert_eq!((s.retained + s.reclaimable) as usize, lens.len());
    }
}

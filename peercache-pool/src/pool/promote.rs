//! Promotion: pages read back from the disk tier into the pool, verified on the way.

use peercache_wire::{Layout, PageKey};

use super::{Evicted, PageWrite, Pool, PublishScratch, Published, ReplClass};
use crate::PoolError;

impl Pool {
    /// Reads pages back from the disk tier into the pool as *retained* (verified on the way;
    /// a corrupt record is deleted by the tier and reported `Failed`). Pages already resident
    /// are `Duplicate`. Evicted pages are appended to `evicted`.
    pub fn promote_batch(
        &self,
        disk: &crate::disk::DiskTier,
        keys: &[PageKey],
        scratch: &mut PublishScratch,
        out: &mut Vec<Published>,
        evicted: &mut Vec<Evicted>,
    ) {
        // Read every record first (one reused buffer per batch), then publish them together.
        let mut lens = Vec::with_capacity(keys.len());
        let mut layouts = Vec::with_capacity(keys.len());
        let mut buf = Vec::new();
        let mut failed: Vec<Option<PoolError>> = Vec::with_capacity(keys.len());
        for k in keys {
            layouts.push(Layout::NONE);
            if self.contains(*k) {
                lens.push(0usize);
                failed.push(None);
                continue;
            }
            let Some(len) = disk.len_of(*k) else {
                lens.push(0);
                failed.push(Some(PoolError::NotFound(*k)));
                continue;
            };
            let start = buf.len();
            buf.resize(start + len as usize, 0);
            match disk.read(*k, &mut [&mut buf[start..]]) {
                Ok(h) => {
                    *layouts.last_mut().expect("pushed above") = h.layout;
                    lens.push(len as usize);
                    failed.push(None);
                }
                Err(_) => {
                    buf.truncate(start);
                    lens.push(0);
                    failed.push(Some(PoolError::NotFound(*k)));
                }
            }
        }
        let mut segs: Vec<[&[u8]; 1]> = Vec::with_capacity(keys.len());
        let mut at = 0;
        for &l in &lens {
            segs.push([&buf[at..at + l]]);
            at += l;
        }
        let pages: Vec<PageWrite<'_>> = keys
            .iter()
            .zip(&segs)
            .zip(&layouts)
            .map(|((k, s), &layout)| PageWrite {
                key: *k,
                segments: s,
                valid_len: None,
                layout,
            })
            .collect();
        let todo: Vec<PageWrite<'_>> = pages
            .iter()
            .zip(&failed)
            .filter(|(p, f)| f.is_none() && !p.segments[0].is_empty())
            .map(|(p, _)| *p)
            .collect();
        let mut published = Vec::new();
        self.publish_batch(&todo, ReplClass::Retained, scratch, &mut published, evicted);
        let mut it = published.into_iter();
        out.clear();
        for (p, f) in pages.iter().zip(failed) {
            match f {
                Some(e) => out.push(Published::Failed(e)),
                None if p.segments[0].is_empty() => {
                    let mut locs = Vec::new();
                    self.lookup_batch(&[p.key], &mut locs);
                    out.push(match locs[0] {
                        Some(l) => Published::Duplicate(l),
                        None => Published::Failed(PoolError::NotFound(p.key)),
                    });
                }
                None => out.push(
                    it.next()
                        .unwrap_or(Published::Failed(PoolError::NotFound(p.key))),
                ),
            }
        }
        let promoted = out
            .iter()
            .filter(|p| matches!(p, Published::New(_)))
            .count();
        metrics::counter!(crate::metrics::PROMOTES_TOTAL).increment(promoted as u64);
    }
}

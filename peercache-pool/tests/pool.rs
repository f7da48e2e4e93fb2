//! Pool behaviour through its public API.

use std::cell::RefCell;

use peercache_pool::{
    Evicted, PageWrite, Pool, PoolConfig, PoolError, PublishScratch, Published, ReplClass,
    VerifyError,
};
use peercache_wire::{Layout, PageKey};

fn key(i: u64) -> PageKey {
    PageKey::from_key(&format!("page-{i}"))
}

fn bytes_for(k: PageKey, len: usize) -> Vec<u8> {
    peercache_wire::testkit::pattern(k.lo(), len)
}

struct Harness {
    pool: Pool,
    scratch: RefCell<PublishScratch>,
    out: RefCell<Vec<Published>>,
    evicted: RefCell<Vec<Evicted>>,
}

impl Harness {
    fn new(size: usize, slab: usize) -> Self {
        Harness {
            pool: Pool::new(PoolConfig {
                slab_bytes: slab,
                ..PoolConfig::new(size)
            })
            .unwrap(),
            scratch: RefCell::default(),
            out: RefCell::default(),
            evicted: RefCell::default(),
        }
    }

    fn publish(&self, keys: &[PageKey], len: usize, class: ReplClass) -> Vec<Published> {
        let data: Vec<Vec<u8>> = keys.iter().map(|k| bytes_for(*k, len)).collect();
        let segs: Vec<[&[u8]; 1]> = data.iter().map(|d| [d.as_slice()]).collect();
        let pages: Vec<PageWrite<'_>> = keys
            .iter()
            .zip(&segs)
            .map(|(k, s)| PageWrite {
                key: *k,
                segments: s,
                valid_len: None,
                layout: Layout::NONE,
            })
            .collect();
        self.pool.publish_batch(
            &pages,
            class,
            &mut self.scratch.borrow_mut(),
            &mut self.out.borrow_mut(),
            &mut self.evicted.borrow_mut(),
        );
        self.out.borrow().clone()
    }

    fn evicted(&self) -> Vec<Evicted> {
        self.evicted.borrow().clone()
    }

    fn publish_raw(&self, pages: &[PageWrite<'_>]) -> Vec<Published> {
        self.pool.publish_batch(
            pages,
            ReplClass::Retained,
            &mut self.scratch.borrow_mut(),
            &mut self.out.borrow_mut(),
            &mut self.evicted.borrow_mut(),
        );
        self.out.borrow().clone()
    }

    fn read(&self, k: PageKey, len: usize) -> Result<Vec<u8>, PoolError> {
        let leases = self.pool.lease_batch(&[k]);
        let mut buf = vec![0u8; len];
        self.pool.read_leased(&leases, 0, k, &mut [&mut buf[..]])?;
        Ok(buf)
    }
}

#[test]
fn published_pages_read_back_byte_exact_including_multi_segment() {
    let h = Harness::new(8 << 20, 1 << 20);
    let keys: Vec<_> = (0..20).map(key).collect();
    let res = h.publish(&keys, 4096, ReplClass::Retained);
    assert!(res.iter().all(|r| matches!(r, Published::New(_))));
    for k in &keys {
        assert_eq!(h.read(*k, 4096).unwrap(), bytes_for(*k, 4096));
    }
    // A page gathered from K and V segments reads back scattered into two destinations.
    let k = PageKey::from_key("kv");
    let kk = vec![1u8; 3000];
    let vv = vec![2u8; 5000];
    let segs: [&[u8]; 2] = [&kk, &vv];
    h.publish_raw(&[PageWrite {
        key: k,
        segments: &segs,
        valid_len: None,
        layout: Layout::NONE,
    }]);
    let leases = h.pool.lease_batch(&[k]);
    let (mut a, mut b) = (vec![0u8; 3000], vec![0u8; 5000]);
    h.pool
        .read_leased(&leases, 0, k, &mut [&mut a[..], &mut b[..]])
        .unwrap();
    assert_eq!((a, b), (kk, vv));
    drop(leases);
    h.pool.check_invariants();
}

#[test]
fn duplicate_publish_is_answered_without_a_new_slot() {
    let h = Harness::new(4 << 20, 1 << 20);
    let k = [key(1)];
    let first = h.publish(&k, 4096, ReplClass::Retained);
    let second = h.publish(&k, 4096, ReplClass::Retained);
    let (Published::New(a), Published::Duplicate(b)) = (&first[0], &second[0]) else {
        panic!("{first:?} {second:?}");
    };
    assert_eq!(a, b);
    assert_eq!(h.pool.stats().retained, 1);
}

#[test]
fn reclaimable_pages_are_evicted_before_retained_pages() {
    // One slab of 4 KiB pages: 1 MiB / 4160 = 252 slots.
    let h = Harness::new(1 << 20, 1 << 20);
    let retained: Vec<_> = (0..200).map(key).collect();
    let fetched: Vec<_> = (1000..1052).map(key).collect();
    h.publish(&retained, 4096, ReplClass::Retained);
    h.publish(&fetched, 4096, ReplClass::Reclaimable);
    assert_eq!(h.pool.stats().reclaimable, 52);
    // 52 more retained pages need 52 slots: every reclaimable page goes first, even though
    // the retained pages are older.
    let more: Vec<_> = (2000..2052).map(key).collect();
    h.publish(&more, 4096, ReplClass::Retained);
    let gone: std::collections::HashSet<_> = h.evicted().iter().map(|e| e.key).collect();
    assert_eq!(gone.len(), 52);
    assert!(fetched.iter().all(|k| gone.contains(k)));
    assert!(
        h.evicted()
            .iter()
            .all(|e| e.class == ReplClass::Reclaimable)
    );
    assert!(retained.iter().all(|k| h.pool.contains(*k)));
    h.evicted.borrow_mut().clear();
    // Only now do retained pages go, oldest first.
    h.publish(&[key(3000)], 4096, ReplClass::Retained);
    assert_eq!(h.evicted().len(), 1);
    assert_eq!(h.evicted()[0].key, retained[0]);
    h.pool.check_invariants();
}

#[test]
fn hits_refresh_recency_within_class_and_never_migrate() {
    let h = Harness::new(1 << 20, 1 << 20);
    let ks: Vec<_> = (0..252).map(key).collect();
    h.publish(&ks[..100], 4096, ReplClass::Reclaimable);
    h.publish(&ks[100..], 4096, ReplClass::Retained);
    // Hit the oldest reclaimable page: it stays reclaimable but becomes its class's newest.
    let mut locs = Vec::new();
    h.pool.lookup_batch(&[ks[0]], &mut locs);
    assert_eq!(locs[0].unwrap().class, ReplClass::Reclaimable);
    h.publish(&[key(9999)], 4096, ReplClass::Retained);
    assert_eq!(
        h.evicted()[0].key,
        ks[1],
        "the next-oldest reclaimable page goes, not the hit one"
    );
    assert_eq!(h.pool.stats().reclaimable, 99);
    assert_eq!(h.pool.stats().retained, 153);
}

#[test]
fn mark_reclaimable_demotes_retained_pages() {
    let h = Harness::new(1 << 20, 1 << 20);
    let ks: Vec<_> = (0..252).map(key).collect();
    h.publish(&ks, 4096, ReplClass::Retained);
    assert_eq!(h.pool.mark_reclaimable(&[ks[200], ks[201]]), 2);
    assert_eq!(
        h.pool.mark_reclaimable(&[ks[200]]),
        0,
        "already reclaimable"
    );
    h.publish(&[key(5000), key(5001)], 4096, ReplClass::Retained);
    let gone: Vec<_> = h.evicted().iter().map(|e| e.key).collect();
    assert_eq!(gone, vec![ks[200], ks[201]]);
}

#[test]
fn leased_pages_are_never_evicted() {
    let h = Harness::new(1 << 20, 1 << 20);
    let ks: Vec<_> = (0..252).map(key).collect();
    h.publish(&ks, 4096, ReplClass::Retained);
    let leases = h.pool.lease_batch(&ks[..10]);
    // Replace every unleased page; the leased ten stay.
    let more: Vec<_> = (1000..1242).map(key).collect();
    let res = h.publish(&more, 4096, ReplClass::Retained);
    assert!(res.iter().all(|r| matches!(r, Published::New(_))));
    assert!(
        ks[..10].iter().all(|k| h.pool.contains(*k)),
        "leased pages stayed"
    );
    assert!(h.evicted().iter().all(|e| !ks[..10].contains(&e.key)));
    drop(leases);
    // With every page leased, nothing is evictable: a typed error, not an eviction.
    let all: Vec<_> = ks[..10].iter().chain(&more).copied().collect();
    let leases = h.pool.lease_batch(&all);
    let res = h.publish(&[key(2000)], 4096, ReplClass::Retained);
    assert!(
        matches!(res[0], Published::Failed(PoolError::Full { .. })),
        "{res:?}"
    );
    drop(leases);
    let res = h.publish(&[key(2000)], 4096, ReplClass::Retained);
    assert!(
        matches!(res[0], Published::New(_)),
        "after release pages are evictable again"
    );
    h.pool.check_invariants();
}

#[test]
fn mixed_page_sizes_share_the_pool_by_moving_slabs() {
    let h = Harness::new(4 << 20, 1 << 20);
    let small: Vec<_> = (0..1000).map(key).collect();
    h.publish(&small, 4096, ReplClass::Retained);
    // Small pages took every slab; big pages must still get room.
    let big: Vec<_> = (5000..5010).map(key).collect();
    let res = h.publish(&big, 128 << 10, ReplClass::Retained);
    assert!(
        res.iter().all(|r| matches!(r, Published::New(_))),
        "{res:?}"
    );
    assert!(h.pool.stats().slab_steals >= 1);
    for k in &big {
        assert_eq!(h.read(*k, 128 << 10).unwrap(), bytes_for(*k, 128 << 10));
    }
    h.pool.check_invariants();
}

#[test]
fn bad_pages_get_typed_errors() {
    let h = Harness::new(1 << 20, 1 << 20);
    let empty: [&[u8]; 0] = [];
    let big = vec![0u8; 2 << 20];
    let one: [&[u8]; 1] = [&big];
    let small = [0u8; 10];
    let s: [&[u8]; 1] = [&small];
    let out = h.publish_raw(&[
        PageWrite {
            key: key(1),
            segments: &empty,
            valid_len: None,
            layout: Layout::NONE,
        },
        PageWrite {
            key: key(2),
            segments: &one,
            valid_len: None,
            layout: Layout::NONE,
        },
        PageWrite {
            key: key(3),
            segments: &s,
            valid_len: Some(11),
            layout: Layout::NONE,
        },
    ]);
    assert!(matches!(out[0], Published::Failed(PoolError::EmptyPage(_))));
    assert!(matches!(
        out[1],
        Published::Failed(PoolError::TooLarge { .. })
    ));
    assert!(matches!(
        out[2],
        Published::Failed(PoolError::BadValidLength {
            valid: 11,
            len: 10,
            ..
        })
    ));
    assert!(matches!(h.read(key(4), 10), Err(PoolError::NotFound(_))));
    assert!(matches!(
        Pool::new(PoolConfig {
            slab_bytes: 100,
            ..PoolConfig::new(1 << 20)
        }),
        Err(PoolError::Geometry(_))
    ));
}

#[test]
fn a_stale_location_is_rejected_not_served_as_another_key() {
    let h = Harness::new(1 << 20, 1 << 20);
    let victim = key(1);
    let res = h.publish(&[victim], 4096, ReplClass::Retained);
    let Published::New(loc) = res[0] else {
        panic!()
    };
    h.pool.remove_batch(&[(victim, None)]);
    // The freed slot is reused by another key.
    let res = h.publish(&[key(2)], 4096, ReplClass::Retained);
    let Published::New(loc2) = res[0] else {
        panic!()
    };
    assert_eq!(loc.offset, loc2.offset, "slot reused");
    let mut buf = vec![0u8; 4096];
    let err = h.pool.read_unleased(&loc, victim, &mut buf).unwrap_err();
    assert!(
        matches!(
            err,
            PoolError::Verify {
                reason: VerifyError::Stale,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(h.pool.read_unleased(&loc2, key(2), &mut buf).is_ok());
    assert_eq!(buf, bytes_for(key(2), 4096));
    assert_eq!(h.pool.stats().verify_rejects, 1);
}

#[test]
fn reserved_slots_are_written_in_place_then_committed_or_aborted() {
    let pool = Pool::new(PoolConfig::new(8 << 20)).unwrap();
    let (a, b, c) = (key(9001), key(9002), key(9003));
    let len = 64 << 10;
    let mut out = Vec::new();
    let mut evicted = Vec::new();
    pool.reserve_batch(
        &[(a, len, None), (b, len, Some(1000)), (c, 0, None)],
        Layout::NONE,
        ReplClass::Retained,
        &mut out,
        &mut evicted,
    );
    let (ra, rb) = match (&out[0], &out[1]) {
        (peercache_pool::Reserved::Slot(x), peercache_pool::Reserved::Slot(y)) => (*x, *y),
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        out[2],
        peercache_pool::Reserved::Failed(PoolError::EmptyPage(_))
    ));
    // Reserved pages are invisible until committed.
    assert!(!pool.contains(a));
    // The writer (here: this test, standing in for a peer's one-sided write) fills the payload.
    let data = bytes_for(a, len as usize);
    // SAFETY: the reservation's payload range lies in the pool mapping and is reserved for us.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), ra.payload_addr as *mut u8, data.len());
    }
    let mut locs = Vec::new();
    pool.commit_reserved(&[ra], &mut locs);
    let loc = locs[0].expect("committed");
    assert_eq!(loc.generation, ra.generation);
    assert_eq!(loc.checksum, peercache_pool::header::checksum(&data));
    let mut back = vec![0u8; len as usize];
    pool.read_unleased(&loc, a, &mut back).unwrap();
    assert_eq!(back, data);
    // Re-reserving a resident page answers with its location.
    pool.reserve_batch(
        &[(a, len, None)],
        Layout::NONE,
        ReplClass::Retained,
        &mut out,
        &mut evicted,
    );
    assert!(matches!(out[0], peercache_pool::Reserved::Duplicate(_)));
    // Aborting frees the slot; committing after the abort is refused.
    assert_eq!(pool.abort_reserved(&[rb]), 1);
    assert!(!pool.contains(b));
    pool.commit_reserved(&[rb], &mut locs);
    assert_eq!(locs, vec![None]);
    assert_eq!(pool.abort_reserved(&[rb]), 0, "aborting twice is a no-op");
    pool.check_invariants();
    // The freed slot is reusable.
    pool.reserve_batch(
        &[(b, len, None)],
        Layout::NONE,
        ReplClass::Retained,
        &mut out,
        &mut evicted,
    );
    assert!(matches!(out[0], peercache_pool::Reserved::Slot(_)));
    pool.check_invariants();
}

#[test]
fn a_verified_commit_refuses_a_payload_that_differs_from_the_writers() {
    let pool = Pool::new(PoolConfig::new(4 << 20)).unwrap();
    let (a, b) = (PageKey::from_key("va"), PageKey::from_key("vb"));
    let len = 8192u32;
    let mut out = Vec::new();
    let mut evicted = Vec::new();
    pool.reserve_batch(
        &[(a, len, None), (b, len, None)],
        Layout::NONE,
        ReplClass::Retained,
        &mut out,
        &mut evicted,
    );
    let (ra, rb) = match (&out[0], &out[1]) {
        (peercache_pool::Reserved::Slot(x), peercache_pool::Reserved::Slot(y)) => (*x, *y),
        other => panic!("{other:?}"),
    };
    let (da, db) = (bytes_for(a, len as usize), bytes_for(b, len as usize));
    // SAFETY: both payload ranges lie in the pool mapping and are reserved for this test.
    unsafe {
        std::ptr::copy_nonoverlapping(da.as_ptr(), ra.payload_addr as *mut u8, da.len());
        std::ptr::copy_nonoverlapping(db.as_ptr(), rb.payload_addr as *mut u8, db.len());
        // A stray write into b's slot after the writer's.
        *(rb.payload_addr as *mut u8).add(100) ^= 0xff;
    }
    // The writer's checksums, computed over its segments without joining them.
    let sum = |d: &[u8]| peercache_pool::header::checksum_segments(&[&d[..64], &d[64..]]);
    assert_eq!(sum(&da), peercache_pool::header::checksum(&da));
    let mut locs = Vec::new();
    pool.commit_reserved_verified(&[ra, rb], &[sum(&da), sum(&db)], &mut locs);
    assert!(locs[0].is_some(), "the intact page is committed");
    assert_eq!(locs[1], None, "the altered page is refused");
    assert!(pool.contains(a) && !pool.contains(b));
    pool.check_invariants();
    // The refused slot was released: the key can be reserved again.
    pool.reserve_batch(
        &[(b, len, None)],
        Layout::NONE,
        ReplClass::Retained,
        &mut out,
        &mut evicted,
    );
    assert!(matches!(out[0], peercache_pool::Reserved::Slot(_)));
    pool.check_invariants();
}

/// A key written again in another layout replaces the resident page (the old copy is reported
/// evicted, so the directory forgets it); in the same layout it stays a duplicate; a leased
/// page is never pulled from under its reader.
#[test]
fn a_key_rewritten_in_another_layout_replaces_the_page_and_a_same_layout_write_is_a_duplicate() {
    let pool = Pool::new(PoolConfig::new(8 << 20)).unwrap();
    let k = key(1);
    let (a, b) = (vec![1u8; 4096], vec![2u8; 4096]);
    let (bf16, fp8) = (Layout(0xb16), Layout(0xf8));
    let (mut scratch, mut out, mut evicted) = (PublishScratch::default(), Vec::new(), Vec::new());
    let mut publish = |bytes: &[u8], layout, out: &mut Vec<Published>, ev: &mut Vec<Evicted>| {
        let segs = [bytes];
        pool.publish_batch(
            &[PageWrite {
                key: k,
                segments: &segs,
                valid_len: None,
                layout,
            }],
            ReplClass::Retained,
            &mut scratch,
            out,
            ev,
        );
    };
    publish(&a, bf16, &mut out, &mut evicted);
    let Published::New(first) = out[0] else {
        panic!("{:?}", out[0])
    };
    assert_eq!(first.layout, bf16);
    publish(&a, bf16, &mut out, &mut evicted);
    assert!(matches!(out[0], Published::Duplicate(_)));
    assert!(evicted.is_empty());

    publish(&b, fp8, &mut out, &mut evicted);
    let Published::New(second) = out[0] else {
        panic!("{:?}", out[0])
    };
    assert_eq!(second.layout, fp8);
    assert_eq!(evicted.len(), 1);
    assert_eq!(
        (evicted[0].key, evicted[0].generation),
        (k, first.generation)
    );
    let mut page = vec![0u8; 4096];
    // The copy a remote reader of the old layout fetches is refused; the new layout's verifies.
    let stale = peercache_pool::PageLocation {
        layout: bf16,
        ..second
    };
    assert!(matches!(
        pool.read_unleased(&stale, k, &mut page),
        Err(PoolError::Verify {
            reason: VerifyError::Layout,
            ..
        })
    ));
    pool.read_unleased(&second, k, &mut page).unwrap();
    assert_eq!(page, b);

    // While a reader holds a lease, another layout's write does not replace the page.
    let leases = pool.lease_batch(&[k]);
    evicted.clear();
    let segs: [&[u8]; 1] = [&a];
    let mut scratch = PublishScratch::default();
    pool.publish_batch(
        &[PageWrite {
            key: k,
            segments: &segs,
            valid_len: None,
            layout: bf16,
        }],
        ReplClass::Retained,
        &mut scratch,
        &mut out,
        &mut evicted,
    );
    assert!(matches!(out[0], Published::Duplicate(l) if l.layout == fp8));
    assert!(evicted.is_empty());
    drop(leases);
}

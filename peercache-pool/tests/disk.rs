//! The disk tier over real files: write-through, verified reads, bounded memory and capacity,
//! recovery after a restart and after `kill -9` mid-write, corrupt records never served.

use std::path::Path;
use std::time::{Duration, Instant};

use peercache_pool::disk::{DiskConfig, DiskError, DiskTier, RecordError};
use peercache_wire::testkit::pattern as page;
use peercache_wire::{Layout, PageKey};

fn key(i: u64) -> PageKey {
    PageKey::from_key(&format!("disk-{i}"))
}

fn open(dir: &Path, capacity: u64, depth: usize) -> DiskTier {
    open_seg(dir, capacity, depth, 0)
}

/// `segment` = record size puts every record in its own segment, so eviction is exact LRU.
/// Returns once the recovery scan of what the folder held is done.
fn open_seg(dir: &Path, capacity: u64, depth: usize, segment: u64) -> DiskTier {
    let t = DiskTier::open(DiskConfig {
        dir: dir.to_path_buf(),
        capacity,
        queue_depth: depth,
        segment_bytes: segment,
    })
    .unwrap();
    assert!(t.wait_recovered(std::time::Duration::from_secs(60)));
    assert!(!t.is_recovering() && !t.stats().recovering);
    t
}

fn seg(dir: &Path, id: u64) -> std::path::PathBuf {
    dir.join(format!("seg-{id:016x}.log"))
}

fn read(t: &DiskTier, k: PageKey, len: usize) -> Result<Vec<u8>, DiskError> {
    let mut v = vec![0u8; len];
    t.read(k, &mut [&mut v[..]])?;
    Ok(v)
}

#[test]
fn pages_written_through_read_back_verified() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), 64 << 20, 64);
    for i in 0..50 {
        let p = page(i, 8192);
        assert!(t.put(key(i), &[&p[..4096], &p[4096..]], 8192, i, Layout::NONE));
    }
    t.flush();
    assert_eq!(t.stats().writes, 50);
    for i in 0..50 {
        assert_eq!(read(&t, key(i), 8192).unwrap(), page(i, 8192));
    }
    // Scattered into two destinations.
    let (mut a, mut b) = (vec![0u8; 1000], vec![0u8; 7192]);
    t.read(key(3), &mut [&mut a[..], &mut b[..]]).unwrap();
    assert_eq!([a, b].concat(), page(3, 8192));
    assert!(matches!(
        read(&t, key(999), 8192),
        Err(DiskError::NotFound(_))
    ));
    assert!(matches!(
        read(&t, key(1), 100),
        Err(DiskError::LengthMismatch { .. })
    ));
    assert!(
        !t.put(key(1000), &[], 0, 0, Layout::NONE),
        "an empty page is refused"
    );
}

#[test]
fn capacity_is_enforced_least_recently_used_first() {
    let dir = tempfile::tempdir().unwrap();
    // Room for 10 records of 4 KiB + header, one record per segment.
    let t = open_seg(dir.path(), 10 * (4096 + 64), 64, 4096 + 64);
    for i in 0..10 {
        t.put(key(i), &[&page(i, 4096)], 4096, 0, Layout::NONE);
    }
    t.flush();
    read(&t, key(0), 4096).unwrap(); // key 0 is now the most recent
    for i in 10..15 {
        t.put(key(i), &[&page(i, 4096)], 4096, 0, Layout::NONE);
    }
    t.flush();
    let s = t.stats();
    assert_eq!(s.keys, 10);
    assert_eq!(s.evictions, 5);
    assert!(s.bytes <= 10 * (4096 + 64));
    assert!(t.contains(key(0)), "the recently read record stayed");
    assert!(!t.contains(key(1)), "the oldest unread record went");
    assert_eq!(
        walk(dir.path()),
        10,
        "evicted segments are deleted from disk too"
    );
}

/// Segment files in the folder.
fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("seg-")
        })
        .count()
}

#[test]
fn a_full_queue_skips_and_counts_instead_of_growing() {
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), 1 << 30, 2);
    let p = page(1, 256 << 10);
    let mut accepted = 0;
    for i in 0..400 {
        accepted += t.put(key(i), &[&p], p.len() as u32, 0, Layout::NONE) as u64;
    }
    t.flush();
    let s = t.stats();
    eprintln!("queue depth 2: {accepted} accepted, {} dropped", s.dropped);
    assert!(
        s.dropped > 0,
        "the disk cannot keep up with 400 back-to-back 256 KiB puts at depth 2"
    );
    assert_eq!(s.writes + s.dropped, 400);
    assert_eq!(s.writes, accepted);
}

#[test]
fn a_restart_recovers_every_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = open(dir.path(), 64 << 20, 64);
        for i in 0..30 {
            t.put(key(i), &[&page(i, 4096)], 4000, 9, Layout::NONE);
        }
        t.flush();
    }
    let t = open(dir.path(), 64 << 20, 64);
    let s = t.stats();
    assert_eq!((s.recovered, s.keys, s.corrupt), (30, 30, 0));
    let mut keys = t.keys();
    keys.sort();
    let mut want: Vec<_> = (0..30).map(key).collect();
    want.sort();
    assert_eq!(keys, want);
    for i in 0..30 {
        let mut v = vec![0u8; 4096];
        let h = t.read(key(i), &mut [&mut v[..]]).unwrap();
        assert_eq!(v, page(i, 4096));
        assert_eq!((h.valid_len, h.generation), (4000, 9));
    }
}

#[test]
fn torn_and_corrupt_records_are_skipped_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let rec = 4096 + 64;
    {
        let t = open_seg(dir.path(), 64 << 20, 64, rec);
        for i in 0..5 {
            t.put(key(i), &[&page(i, 4096)], 4096, 0, Layout::NONE);
        }
        t.flush();
    }
    // Segment i+1 holds record i. Torn: cut short. Foreign: garbage. Corrupt: one flipped bit.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(seg(dir.path(), 2))
        .unwrap();
    f.set_len(1000).unwrap();
    std::fs::write(seg(dir.path(), 3), b"not a record at all").unwrap();
    let mut bytes = std::fs::read(seg(dir.path(), 4)).unwrap();
    bytes[64 + 100] ^= 1;
    std::fs::write(seg(dir.path(), 4), bytes).unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"a foreign file is ignored").unwrap();

    let t = open_seg(dir.path(), 64 << 20, 64, rec);
    let s = t.stats();
    assert_eq!(s.recovered, 3, "records 0, 3 and 4 have sound headers");
    assert_eq!(s.corrupt, 2, "the torn and the garbage segment");
    assert!(!t.contains(key(1)) && !t.contains(key(2)));
    let err = read(&t, key(3), 4096).unwrap_err();
    assert!(
        matches!(
            err,
            DiskError::Corrupt {
                reason: RecordError::PayloadChecksum,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        !t.contains(key(3)),
        "a corrupt record is dropped once found"
    );
    assert_eq!(read(&t, key(0), 4096).unwrap(), page(0, 4096));
    assert_eq!(read(&t, key(4), 4096).unwrap(), page(4, 4096));
}

#[test]
fn a_bad_record_mid_segment_costs_that_record_alone() {
    // 64 records in one segment; record 10's header and record 40's payload are damaged.
    let dir = tempfile::tempdir().unwrap();
    let rec = 4096 + 64;
    {
        let t = open(dir.path(), 64 << 20, 128);
        for i in 0..64 {
            t.put(key(i), &[&page(i, 4096)], 4096, 0, Layout::NONE);
        }
        t.flush();
    }
    let path = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 64 * rec, "one segment holds every record");
    bytes[10 * rec + 20] ^= 0x40; // record 10: a header byte (its key)
    for b in &mut bytes[40 * rec + 64 + 500..40 * rec + 64 + 508] {
        *b ^= 0xff; // record 40: eight payload bytes
    }
    std::fs::write(&path, &bytes).unwrap();

    let t = open(dir.path(), 64 << 20, 128);
    let s = t.stats();
    assert_eq!(
        s.recovered, 63,
        "every record but the one with the bad header"
    );
    assert_eq!(s.corrupt, 1, "one bad span counted");
    assert!(!t.contains(key(10)));
    for i in (0..64).filter(|&i| i != 10 && i != 40) {
        assert_eq!(read(&t, key(i), 4096).unwrap(), page(i, 4096), "record {i}");
    }
    // The damaged payload is found when read: refused, never served.
    assert!(matches!(
        read(&t, key(40), 4096),
        Err(DiskError::Corrupt {
            reason: RecordError::PayloadChecksum,
            ..
        })
    ));
    // The segment stays on disk with its sound records.
    assert!(path.exists());
}

/// The child side of the kill -9 test: writes records until killed.
#[test]
fn child_writer_until_killed() {
    let Some(dir) = std::env::var_os("PEERCACHE_DISK_CHILD") else {
        return;
    };
    let t = open_seg(Path::new(&dir), 1 << 30, 16, 4 << 20);
    for i in 0.. {
        let p = page(i, 64 << 10);
        while !t.put(key(i), &[&p], p.len() as u32, i, Layout::NONE) {
            std::thread::yield_now();
        }
    }
}

#[test]
fn kill_9_mid_write_loses_nothing_already_written_and_serves_nothing_torn() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_writer_until_killed",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("PEERCACHE_DISK_CHILD", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (on a condition, with a deadline) until a good number of records exist.
    let deadline = Instant::now() + Duration::from_secs(30);
    while dir_bytes(dir.path()) < 200 * ((64 << 10) + 64) {
        assert!(Instant::now() < deadline, "child wrote too little");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: sends SIGKILL to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let t = open_seg(dir.path(), 1 << 30, 16, 4 << 20);
    let s = t.stats();
    assert!(s.corrupt <= 1, "only the record being written can be torn");
    eprintln!(
        "after kill -9: {} records recovered, {} torn skipped",
        s.recovered, s.corrupt
    );
    assert!(s.recovered >= 200);
    let mut served = 0;
    for k in t.keys() {
        let len = t.len_of(k).unwrap() as usize;
        let mut v = vec![0u8; len];
        let h = t.read(k, &mut [&mut v[..]]).unwrap();
        assert_eq!(
            v,
            page(h.generation, len),
            "record content must match its key"
        );
        served += 1;
    }
    assert_eq!(served as u64, s.recovered);
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_full_disk_disables_the_tier_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let rec = 4096 + 64;
    let t = open_seg(dir.path(), 64 << 20, 8, rec);
    assert!(t.put(key(0), &[&page(0, 4096)], 4096, 0, Layout::NONE));
    t.flush();
    // The next segment is /dev/full: every write to it fails with ENOSPC.
    std::os::unix::fs::symlink("/dev/full", seg(dir.path(), 2)).unwrap();
    t.put(key(1), &[&page(1, 4096)], 4096, 0, Layout::NONE);
    t.flush();
    let s = t.stats();
    assert!(s.disabled, "a failing write disables the tier");
    assert!(!t.contains(key(1)));
    assert!(
        !t.put(key(2), &[&page(2, 4096)], 4096, 0, Layout::NONE),
        "no more writes once disabled"
    );
    assert_eq!(
        read(&t, key(0), 4096).unwrap(),
        page(0, 4096),
        "records already on disk still read"
    );
}

#[test]
fn promote_reads_pages_back_into_the_pool_as_retained() {
    use peercache_pool::{Pool, PoolConfig, PublishScratch, Published, ReplClass};
    let dir = tempfile::tempdir().unwrap();
    let t = open(dir.path(), 64 << 20, 64);
    for i in 0..8 {
        t.put(key(i), &[&page(i, 16384)], 16384, 0, Layout::NONE);
    }
    t.flush();
    let pool = Pool::new(PoolConfig::new(8 << 20)).unwrap();
    let keys: Vec<PageKey> = (0..10).map(key).collect();
    let (mut out, mut ev) = (Vec::new(), Vec::new());
    pool.promote_batch(&t, &keys, &mut PublishScratch::default(), &mut out, &mut ev);
    assert!(
        out[..8]
            .iter()
            .all(|p| matches!(p, Published::New(l) if l.class == ReplClass::Retained))
    );
    assert!(
        out[8..].iter().all(|p| matches!(p, Published::Failed(_))),
        "keys not on disk fail"
    );
    let leases = pool.lease_batch(&keys[..8]);
    for (i, k) in keys[..8].iter().enumerate() {
        let mut v = vec![0u8; 16384];
        pool.read_leased(&leases, i, *k, &mut [&mut v[..]]).unwrap();
        assert_eq!(v, page(i as u64, 16384));
    }
    drop(leases);
    pool.promote_batch(
        &t,
        &keys[..2],
        &mut PublishScratch::default(),
        &mut out,
        &mut ev,
    );
    assert!(
        out.iter().all(|p| matches!(p, Published::Duplicate(_))),
        "already resident"
    );
}

#[test]
fn the_tier_is_private_to_its_user_folders_0700_files_0600() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("root/node-a");
    let t = open(&dir, 8 << 20, 16);
    let p = page(1, 4096);
    assert!(t.put(key(1), &[&p], 4096, 1, Layout::NONE));
    t.flush();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("root")), 0o700);
    assert_eq!(mode(&seg(&dir, 1)), 0o600);
    drop(t);
    // A segment an older version left readable by others is tightened on recovery.
    std::fs::set_permissions(seg(&dir, 1), std::fs::Permissions::from_mode(0o644)).unwrap();
    let t = open(&dir, 8 << 20, 16);
    assert_eq!(read(&t, key(1), 4096).unwrap(), p);
    assert_eq!(mode(&seg(&dir, 1)), 0o600);
}

#[test]
fn a_folder_someone_else_controls_is_refused_and_never_read() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    // Pre-filled by "someone else": a real segment with a page in it.
    let planted = tmp.path().join("planted");
    {
        let t = open(&planted, 8 << 20, 16);
        assert!(t.put(key(9), &[&page(9, 4096)], 4096, 1, Layout::NONE));
        t.flush();
    }
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = DiskTier::open(DiskConfig::new(planted.clone(), 8 << 20));
    assert!(
        matches!(refused, Err(DiskError::UnsafeFolder { .. })),
        "{refused:?}"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&planted, Some(4242), Some(4242)).unwrap();
        let refused = DiskTier::open(DiskConfig::new(planted, 8 << 20));
        let msg = refused.as_ref().map(|_| ()).unwrap_err().to_string();
        assert!(msg.contains("uid 4242"), "{msg}");
    }
}

/// The scan runs beside the tier: whatever the interleaving, a page written or forgotten right
/// after the open is never undone by the scan reaching that key's older record, and a reader
/// gets either a miss or the page as it is now, never an older one.
#[test]
fn the_recovery_scan_never_undoes_a_write_or_a_remove_made_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    const N: u64 = 4000;
    {
        // Many segments, so the scan takes a while.
        let t = open_seg(dir.path(), 1 << 30, 256, 64 * (4096 + 64));
        for i in 0..N {
            if i % 200 == 0 {
                t.flush();
            }
            assert!(t.put(key(i), &[&page(i, 4096)], 4096, 1, Layout::NONE));
        }
        t.flush();
    }
    let t = DiskTier::open(DiskConfig {
        dir: dir.path().to_path_buf(),
        capacity: 1 << 30,
        queue_depth: 256,
        segment_bytes: 64 * (4096 + 64),
    })
    .unwrap();
    assert!(t.found_previous_run());
    // Right away, probably before the scan reaches them: the last keys are rewritten in
    // another layout (new bytes) or forgotten.
    let newer = page(N + 1, 4096);
    let moved = Layout(0xabc);
    for i in N - 50..N - 25 {
        assert!(t.put(key(i), &[&newer], 4096, 2, moved));
    }
    for i in N - 25..N {
        t.remove(key(i));
    }
    t.flush();
    // Meanwhile a reader sees a miss or a verified page, never another key's bytes.
    for i in (0..N - 50).step_by(97) {
        match read(&t, key(i), 4096) {
            Ok(p) => assert_eq!(p, page(i, 4096)),
            Err(e) => assert!(matches!(e, DiskError::NotFound(_)), "{e}"),
        }
    }
    assert!(t.wait_recovered(std::time::Duration::from_secs(60)));
    for i in N - 50..N - 25 {
        assert_eq!(
            read(&t, key(i), 4096).unwrap(),
            newer,
            "page {i} as rewritten"
        );
    }
    for i in N - 25..N {
        assert!(!t.contains(key(i)), "page {i} stays forgotten");
    }
    for i in (0..N - 50).step_by(97) {
        assert_eq!(read(&t, key(i), 4096).unwrap(), page(i, 4096));
    }
    // The scan takes every record of the previous run it reaches before that key was touched:
    // all of them less the 50 touched since when it is slower than the writes above, up to all
    // of them when it got there first (the interleaving is the scheduler's). Either way the
    // pages read back above are the current ones.
    let s = t.stats();
    assert!(
        (N - 50..=N).contains(&s.recovered),
        "the scan's records: {} (expected {}..={N})",
        s.recovered,
        N - 50
    );
    // The re-publish inventory is the previous run's records only.
    assert_eq!(t.inventory().len() as u64, N - 50);
}

/// A tier dropped while its scan runs stops the scan between records instead of finishing it.
#[test]
fn dropping_a_tier_mid_recovery_stops_the_scan() {
    let dir = tempfile::tempdir().unwrap();
    {
        let t = open_seg(dir.path(), 1 << 30, 256, 64 * (512 + 64));
        assert!(!t.found_previous_run(), "an empty folder");
        for i in 0..20_000u64 {
            if i % 200 == 0 {
                t.flush();
            }
            assert!(t.put(key(i), &[&page(i, 512)], 512, 1, Layout::NONE));
        }
        t.flush();
    }
    let t0 = std::time::Instant::now();
    let t = DiskTier::open(DiskConfig::new(dir.path().to_path_buf(), 1 << 30)).unwrap();
    drop(t);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    // Nothing was lost by stopping: the next open recovers every record.
    let t = open(dir.path(), 1 << 30, 16);
    assert_eq!(t.stats().recovered, 20_000);
}

#[test]
fn a_segment_id_no_tier_writes_is_refused_with_a_typed_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tier");
    // A tier made the folder; a stray file with the last possible id was put beside its segment.
    {
        let t = open(&dir, 8 << 20, 16);
        assert!(t.put(key(1), &[&page(1, 4096)], 4096, 1, Layout::NONE));
        t.flush();
    }
    std::fs::write(seg(&dir, u64::MAX), b"not a segment").unwrap();
    let refused = DiskTier::open(DiskConfig::new(dir.clone(), 8 << 20));
    match refused {
        Err(DiskError::Folder { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidData);
            assert!(source.to_string().contains("move it aside"), "{source}");
        }
        other => panic!("expected a typed refusal, got {other:?}"),
    }
    // Moved aside, the tier opens and still has its page.
    std::fs::remove_file(seg(&dir, u64::MAX)).unwrap();
    let t = open(&dir, 8 << 20, 16);
    assert_eq!(read(&t, key(1), 4096).unwrap(), page(1, 4096));
}

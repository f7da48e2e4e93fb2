//! Router hints on three loopback nodes: a read whose hint names the node that holds its pages
//! sends no directory request and returns the written bytes; a wrong, unknown or partial hint
//! still returns the written bytes through the directory, each page counted once.

use peercache_store::{Store, StoreError};
use serde_json::json;

mod common;

const PAGE: usize = 4096;

fn read(s: &Store, keys: &[String], hint: &str) -> Vec<Vec<u8>> {
    let mut bufs = vec![vec![0u8; PAGE]; keys.len()];
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = s.batch_get_hinted(keys, &mut slices, hint).unwrap();
    assert!(got.iter().all(|g| *g), "{hint}: {got:?}");
    bufs
}

#[test]
fn a_correct_hint_skips_the_directory_and_a_wrong_one_still_returns_the_written_bytes() {
    let nodes = common::cluster(&[71, 72, 73], json!({}));
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let keys: Vec<String> = (0..64).map(|i| format!("hint/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..64).map(|i| common::page(i, PAGE)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
    assert!(a.batch_set(&keys, &refs).unwrap().iter().all(|s| *s));
    let a_id = a.node_id().to_string();

    // The hint names A: C asks A where the pages are, not the directory shards.
    let before = c.stats();
    assert_eq!(read(c, &keys, &a_id), pages);
    let after = c.stats();
    assert_eq!(
        after.directory_rpcs, before.directory_rpcs,
        "a correct hint sent a directory request"
    );
    assert_eq!(after.directory_local_calls, before.directory_local_calls);
    assert_eq!(
        (
            after.read_hint_hits - before.read_hint_hits,
            after.read_hint_misses - before.read_hint_misses
        ),
        (64, 0)
    );

    // Without a hint the same read asks the directory (the control for the check above).
    let mut bufs = vec![vec![0u8; PAGE]; 64];
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let before = c.stats();
    assert!(c.batch_get(&keys, &mut slices).unwrap().iter().all(|g| *g));
    assert!(
        c.stats().directory_rpcs > before.directory_rpcs,
        "64 keys on three shards: some remote"
    );

    // Wrong hints — a node that holds none of them, this reader itself, a node not in the
    // cluster — cost a round trip at most: the bytes are the written ones, counted as misses.
    for wrong in [
        b.node_id().to_string(),
        c.node_id().to_string(),
        "no-such-node".to_string(),
    ] {
        let before = c.stats();
        assert_eq!(read(c, &keys, &wrong), pages, "hint {wrong}");
        let after = c.stats();
        assert_eq!(
            after.read_hint_misses - before.read_hint_misses,
            64,
            "hint {wrong}"
        );
        assert_eq!(after.read_hint_hits, before.read_hint_hits, "hint {wrong}");
    }

    // A partial hint: B wrote half the keys again under new bytes after A's; a hint naming A
    // locates A's pages, the directory finds the rest.
    let more: Vec<String> = (64..96).map(|i| format!("hint/{i}")).collect();
    let more_pages: Vec<Vec<u8>> = (64..96).map(|i| common::page(i, PAGE)).collect();
    let more_refs: Vec<&[u8]> = more_pages.iter().map(|p| &p[..]).collect();
    assert!(b.batch_set(&more, &more_refs).unwrap().iter().all(|s| *s));
    let mixed: Vec<String> = keys.iter().chain(&more).cloned().collect();
    let before = c.stats();
    let got = read(c, &mixed, &a_id);
    assert_eq!(&got[..64], &pages[..]);
    assert_eq!(&got[64..], &more_pages[..]);
    let after = c.stats();
    assert_eq!(
        (
            after.read_hint_hits - before.read_hint_hits,
            after.read_hint_misses - before.read_hint_misses
        ),
        (64, 32)
    );

    // A hint that is no node id is refused with a reason, not guessed at.
    let mut one = vec![0u8; PAGE];
    match c.batch_get_hinted(&keys[..1], &mut [&mut one[..]], "bad id with spaces") {
        Err(StoreError::BadRequest(why)) => assert!(why.contains("hint"), "{why}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    for n in &nodes {
        n.shutdown();
    }
}

#[test]
fn a_hinted_exists_counts_the_holders_run_without_the_directory_and_the_rest_through_it() {
    let nodes = common::cluster(&[74, 75, 76], json!({}));
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let keys: Vec<String> = (0..48).map(|i| format!("hint-exists/{i}")).collect();
    let pages: Vec<Vec<u8>> = (0..48).map(|i| common::page(i, PAGE)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
    // A holds keys 0..32, B keys 32..40; 40..48 nobody.
    assert!(
        a.batch_set(&keys[..32], &refs[..32])
            .unwrap()
            .iter()
            .all(|s| *s)
    );
    assert!(
        b.batch_set(&keys[32..40], &refs[32..40])
            .unwrap()
            .iter()
            .all(|s| *s)
    );
    let a_id = a.node_id().to_string();

    // Every key on A: the answer with no directory request, the same as without a hint.
    let before = c.stats();
    assert_eq!(c.batch_exists_hinted(&keys[..32], &a_id).unwrap(), 32);
    let after = c.stats();
    assert_eq!(
        after.directory_rpcs, before.directory_rpcs,
        "a directory request was sent"
    );
    assert_eq!(after.directory_local_calls, before.directory_local_calls);
    assert_eq!(after.read_hint_hits - before.read_hint_hits, 32);
    assert_eq!(c.batch_exists(&keys[..32]).unwrap(), 32);

    // Past A's run the directory answers: B's keys count, the first missing key ends the run.
    let before = c.stats();
    assert_eq!(c.batch_exists_hinted(&keys, &a_id).unwrap(), 40);
    let after = c.stats();
    assert_eq!(
        (
            after.read_hint_hits - before.read_hint_hits,
            after.read_hint_misses - before.read_hint_misses
        ),
        (32, 16)
    );
    assert_eq!(
        c.batch_exists(&keys).unwrap(),
        40,
        "the hint changed the answer"
    );

    // Wrong hints give the directory's answer.
    for wrong in [b.node_id().to_string(), "no-such-node".to_string()] {
        assert_eq!(c.batch_exists_hinted(&keys, &wrong).unwrap(), 40, "{wrong}");
    }
    // The located run is primed: the get that follows on C reads A's bytes with no lookup.
    assert_eq!(c.batch_exists_hinted(&keys[..32], &a_id).unwrap(), 32);
    let before = c.stats();
    let mut bufs = vec![vec![0u8; PAGE]; 32];
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    assert!(
        c.batch_get(&keys[..32], &mut slices)
            .unwrap()
            .iter()
            .all(|g| *g)
    );
    assert_eq!(bufs, pages[..32]);
    assert_eq!(
        c.stats().directory_rpcs,
        before.directory_rpcs,
        "the primed run was looked up"
    );
    match c.batch_exists_hinted(&keys[..1], "bad id with spaces") {
        Err(StoreError::BadRequest(why)) => assert!(why.contains("hint"), "{why}"),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    for n in &nodes {
        n.shutdown();
    }
}

//! A node answers reads and `exists` for the pages its own pool holds beside the directory:
//! without a directory call where a lookup would cost a round trip (more members than
//! replicas), from the pool for the pages the directory does not name where its own shard
//! holds every entry; and a batch mixing its own pages, a peer's and misses lands every page
//! byte-exact either way.

use serde_json::json;

mod common;
use common::{cluster, free_port, get, node, page};

const LEN: usize = 16 << 10;

/// Writes `keys` on `s`, page `seed + i` each.
fn write(s: &peercache_store::Store, keys: &[String], seed: u64) {
    let pages: Vec<Vec<u8>> = (0..keys.len() as u64)
        .map(|i| page(seed + i, LEN))
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| p.as_slice()).collect();
    assert!(s.batch_set(keys, &refs).unwrap().iter().all(|&ok| ok));
}

/// Directory calls `s` has made so far, to its own shard and to peers.
fn directory_calls(s: &peercache_store::Store) -> u64 {
    let st = s.stats();
    st.directory_rpcs + st.directory_local_calls
}

#[test]
fn a_batch_of_its_own_pages_is_read_and_found_without_a_directory_call() {
    // Three members, two replicas: most keys' entries live on other nodes' shards.
    let nodes = cluster(&[198, 199, 226], json!({}));
    let s = &nodes[0];
    let keys: Vec<String> = (0..32).map(|i| format!("own-{i}")).collect();
    write(s, &keys, 100);
    let before = directory_calls(s);

    let (hits, pages) = get(s, &keys, LEN);
    for (i, (hit, bytes)) in hits.iter().zip(&pages).enumerate() {
        assert!(hit, "own-{i} missed");
        assert!(
            *bytes == page(100 + i as u64, LEN),
            "own-{i}: not the page written"
        );
    }
    assert_eq!(s.batch_exists(&keys).unwrap(), 32);
    assert_eq!(s.batch_contains(&keys).unwrap(), vec![true; 32]);
    assert_eq!(s.batch_exists_valid(&keys).unwrap(), vec![LEN as u32; 32]);
    assert_eq!(
        directory_calls(s),
        before,
        "the node asked the directory about pages its own pool holds"
    );

    // A key it does not hold still goes to the directory (and misses).
    let mut more = keys.clone();
    more.push("own-never".into());
    assert_eq!(
        s.batch_contains(&more)
            .unwrap()
            .iter()
            .filter(|&&p| p)
            .count(),
        32
    );
    assert!(directory_calls(s) > before);
}

#[test]
fn its_own_pages_stay_readable_after_the_directory_dropped_their_entries() {
    // A directory shard capped at 16 entries keeps the 16 pages named last of the 64 written;
    // the pool (32 MiB) keeps all 64.
    let s = node(28, 28, free_port(), json!({"directory_max_entries": 16}));
    let keys: Vec<String> = (0..64).map(|i| format!("capped-{i}")).collect();
    for (c, chunk) in keys.chunks(16).enumerate() {
        write(&s, chunk, 500 + 16 * c as u64);
    }
    let st = s.stats();
    assert!(
        st.shard_entries <= 16,
        "the shard holds {} entries",
        st.shard_entries
    );
    assert_eq!(st.pool_pages, 64);
    let (named, _) = s.audit(&keys).unwrap();
    assert!(
        named <= 16,
        "the directory still names {named} of the 64 pages"
    );

    let (hits, pages) = get(&s, &keys, LEN);
    for (i, (hit, bytes)) in hits.iter().zip(&pages).enumerate() {
        assert!(hit, "capped-{i} missed although the node's pool holds it");
        assert!(
            *bytes == page(500 + i as u64, LEN),
            "capped-{i}: not the page written"
        );
    }
    assert_eq!(s.batch_exists(&keys).unwrap(), 64);
    assert_eq!(s.batch_exists_valid(&keys).unwrap().len(), 64);
}

/// `a` reads and asks about its own pages, `b`'s and never-written ones interleaved: every
/// page byte-exact, every miss a miss.
fn own_peers_and_misses(a: &peercache_store::Store, b: &peercache_store::Store, tag: &str) {
    let mine: Vec<String> = (0..8).map(|i| format!("{tag}-a-{i}")).collect();
    let theirs: Vec<String> = (0..8).map(|i| format!("{tag}-b-{i}")).collect();
    write(a, &mine, 900);
    write(b, &theirs, 1900);

    let mut asked = Vec::new();
    let mut want: Vec<Option<Vec<u8>>> = Vec::new();
    for i in 0..8 {
        asked.push(mine[i].clone());
        want.push(Some(page(900 + i as u64, LEN)));
        asked.push(theirs[i].clone());
        want.push(Some(page(1900 + i as u64, LEN)));
        if i % 3 == 0 {
            asked.push(format!("{tag}-never-{i}"));
            want.push(None);
        }
    }
    let (hits, pages) = get(a, &asked, LEN);
    for ((k, w), (hit, bytes)) in asked.iter().zip(&want).zip(hits.iter().zip(&pages)) {
        match w {
            Some(w) => {
                assert!(hit, "{k} missed");
                assert!(bytes == w, "{k}: not the page written");
            }
            None => assert!(!hit, "{k} was never written"),
        }
    }
    // `exists` counts the leading run across own and peer's pages, stopping at the first miss.
    assert_eq!(a.batch_exists(&asked).unwrap(), 2);
    assert_eq!(
        a.batch_contains(&asked).unwrap(),
        want.iter().map(Option::is_some).collect::<Vec<_>>()
    );
    assert_eq!(
        a.batch_exists_valid(&asked[1..]).unwrap(),
        vec![LEN as u32; 1],
        "a peer's page then a miss"
    );
}

#[test]
fn own_pages_a_peers_and_misses_land_byte_exact_where_the_directory_goes_first() {
    // Two members, two replicas: each node's shard holds every entry.
    let nodes = cluster(&[196, 197], json!({}));
    own_peers_and_misses(&nodes[0], &nodes[1], "two");
}

#[test]
fn own_pages_a_peers_and_misses_land_byte_exact_where_the_pool_goes_first() {
    let nodes = cluster(&[227, 228, 229], json!({}));
    own_peers_and_misses(&nodes[0], &nodes[1], "three");
}

//! Version-1 directory messages keep decoding from committed bytes.
//! Regenerate only when adding a message: `PEERCACHE_BLESS=1 cargo test -p peercache-directory`.

mod common;

use std::path::PathBuf;

use common::{key, loc, node};
use peercache_directory::shard::InsertOutcome;
use peercache_directory::{DirReply, DirRequest, OwnerRef};
use peercache_wire::envelope::Message;

fn check<M: Message + PartialEq + std::fmt::Debug>(name: &str, msg: M) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    peercache_wire::testkit::check_fixture(&dir, name, &msg);
}

#[test]
fn v1_directory_fixtures_decode() {
    let a = node(1);
    check(
        "dir_insert.bin",
        DirRequest::Insert(vec![(key(1), loc(&a, 2))].into()),
    );
    check(
        "dir_lookup.bin",
        DirRequest::Lookup(vec![key(1), key(2)].into()),
    );
    check("dir_exists.bin", DirRequest::Exists(vec![key(3)].into()));
    let r = OwnerRef {
        key: key(4),
        node: a.clone(),
        generation: Some(9),
    };
    check("dir_remove.bin", DirRequest::Remove(vec![r.clone()].into()));
    check(
        "dir_mark_nonresident.bin",
        DirRequest::MarkNonResident(vec![r].into()),
    );
    check(
        "dir_handoff.bin",
        DirRequest::Handoff(
            vec![(key(5), smallvec::smallvec![loc(&a, 1), loc(&node(2), 3)])].into(),
        ),
    );
    check(
        "dir_inserted.bin",
        DirReply::Inserted(vec![InsertOutcome {
            new_owner: true,
            live_owners: 3,
            reclaimable: true,
        }]),
    );
    check(
        "dir_found.bin",
        DirReply::Found(vec![Some(smallvec::smallvec![loc(&a, 1)]), None]),
    );
    check("dir_exists_reply.bin", DirReply::Exists(vec![true, false]));
    check("dir_applied.bin", DirReply::Applied(7));
}

//! Version-1 store control and client-API messages keep decoding from committed bytes.
//! Regenerate only when adding a message: `PEERCACHE_BLESS=1 cargo test -p peercache-store
//! --test compat`.

use std::path::PathBuf;

use peercache_directory::{CopyClass, Location, Rail};
use peercache_store::client::{ClientReply, ClientRequest};
use peercache_store::control::{PrepareOutcome, StoreReply, StoreRequest};
use peercache_wire::envelope::Message;
use peercache_wire::{Incarnation, NodeId, PageKey};
use serde_bytes::ByteBuf;

fn check<M: Message + PartialEq + std::fmt::Debug>(name: &str, msg: M) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    peercache_wire::testkit::check_fixture(&dir, name, &msg);
}

fn loc() -> Location {
    Location {
        node: NodeId::new("node-1").unwrap(),
        incarnation: Incarnation(3),
        rails: smallvec::smallvec![Rail {
            endpoint: "127.0.0.1:4000".parse().unwrap(),
            region: 7,
        }],
        addr: 0x4000,
        len: 4096,
        valid_len: 1000,
        generation: 12,
        checksum: 0xfeed,
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

#[test]
fn v1_store_control_fixtures_decode() {
    let k = PageKey::from_key("key-1");
    check("store_promote.bin", StoreRequest::Promote(vec![k]));
    check(
        "store_prepare.bin",
        StoreRequest::Prepare {
            writer: NodeId::new("writer").unwrap(),
            pages: vec![(k, 4096, 1000)],
        },
    );
    check("store_commit.bin", StoreRequest::Commit(vec![1, 2]));
    check("store_abort.bin", StoreRequest::Abort(vec![3]));
    check(
        "store_commit_verified.bin",
        StoreRequest::CommitVerified(vec![(1, 0xfeed_beef)]),
    );
    check(
        "store_ingest.bin",
        StoreRequest::Ingest(vec![(k, 2, vec![1, 2, 3])]),
    );
    check(
        "store_slot_write.bin",
        StoreRequest::SlotWrite(vec![(k, vec![4, 5])]),
    );
    check(
        "store_promoted.bin",
        StoreReply::Promoted(vec![Some(loc()), None]),
    );
    check(
        "store_prepared.bin",
        StoreReply::Prepared(vec![
            PrepareOutcome::Slot {
                token: 9,
                addr: 0x8000,
                region: 7,
            },
            PrepareOutcome::Present(loc()),
            PrepareOutcome::Refused("pool full".into()),
        ]),
    );
    check(
        "store_committed.bin",
        StoreReply::Committed(vec![Some(loc())]),
    );
    check("store_aborted.bin", StoreReply::Aborted(1));
    check("store_ingested.bin", StoreReply::Ingested(vec![None]));
    check(
        "store_slot_written.bin",
        StoreReply::SlotWritten(vec![true, false]),
    );
}

#[test]
fn v1_client_fixtures_decode() {
    check(
        "client_put.bin",
        ClientRequest::Put {
            keys: vec!["a".into(), "b".into()],
            page_bytes: 2,
            data: ByteBuf::from(vec![1, 2, 3, 4]),
        },
    );
    check(
        "client_get.bin",
        ClientRequest::Get {
            keys: vec!["a".into()],
            page_bytes: 4096,
        },
    );
    check(
        "client_exists.bin",
        ClientRequest::Exists {
            keys: vec!["a".into()],
        },
    );
    check("client_stored.bin", ClientReply::Stored(vec![true, false]));
    check(
        "client_pages.bin",
        ClientReply::Pages {
            valid: vec![Some(2), None],
            data: ByteBuf::from(vec![7, 8]),
        },
    );
    check(
        "client_present.bin",
        ClientReply::Present(vec![false, true]),
    );
    check(
        "client_locate.bin",
        ClientRequest::Locate {
            keys: vec!["a".into()],
        },
    );
    check(
        "client_located.bin",
        ClientReply::Located(vec![vec![loc()], vec![]]),
    );
    check(
        "client_prefix.bin",
        ClientRequest::Prefix {
            keys: vec!["a".into(), "b".into()],
        },
    );
    check(
        "client_prefix_runs.bin",
        ClientReply::Prefix(vec![peercache_store::PrefixRun {
            node: peercache_wire::NodeId::new("node-a").unwrap(),
            leading: 2,
            resident: 1,
        }]),
    );
}

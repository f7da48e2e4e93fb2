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
    let mut holders = peercache_directory::KeyHolders::default();
    holders.push_key([(&a, true), (&node(2), false)]);
    holders.push_key([]);
    check("dir_holders.bin", DirReply::Holders(holders));
}

/// Writes (with `PEERCACHE_BLESS`) or reads a committed frame and checks it is still what this
/// release encodes.
fn committed_frame(name: &str, frame: &[u8]) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/v1")
        .join(name);
    if std::env::var_os("PEERCACHE_BLESS").is_some() {
        std::fs::write(&path, frame).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    assert_eq!(
        bytes, frame,
        "fixture {name}: this release encodes it differently"
    );
    bytes
}

/// The paced hand-off's two extensions (a shard's "still receiving, ask this member" hint and
/// a sender's "this many more") ride as non-critical envelope extensions: a reader of the
/// previous release decodes the same message and sees a plain miss or a plain hand-off; this
/// release reads them.
#[test]
fn hand_off_extensions_are_skipped_by_older_readers_and_read_by_this_one() {
    use peercache_directory::msg::{EXT_HANDOFF_MORE, EXT_MOVING, Moving};
    use peercache_wire::envelope::{self, Envelope, Extension};

    let a = node(1);
    let reply = DirReply::Found(vec![Some(smallvec::smallvec![loc(&a, 1)]), None]);
    let moving = Moving {
        keys: vec![(1, node(2))],
    };
    let frame = envelope::encode(&reply, &[Extension::of(EXT_MOVING, &moving).unwrap()]).unwrap();
    let bytes = committed_frame("dir_found_moving.bin", &frame);
    // The previous release's decode: extensions it does not know and that are not critical
    // are skipped, the reply is the same.
    assert_eq!(envelope::decode::<DirReply>(&bytes).unwrap(), reply);
    assert_eq!(
        envelope::decode::<DirReply>(
            &std::fs::read(
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/dir_found.bin")
            )
            .unwrap()
        )
        .unwrap(),
        reply,
        "the same reply from the previous release has no hint"
    );
    let env = Envelope::parse(&bytes).unwrap();
    assert_eq!(
        env.extension_value::<Moving>(EXT_MOVING).unwrap(),
        Some(moving)
    );

    let handoff = DirRequest::Handoff(
        vec![(key(5), smallvec::smallvec![loc(&a, 1), loc(&node(2), 3)])].into(),
    );
    let frame = envelope::encode(
        &handoff,
        &[Extension::of(EXT_HANDOFF_MORE, &4096u64).unwrap()],
    )
    .unwrap();
    let bytes = committed_frame("dir_handoff_more.bin", &frame);
    assert_eq!(envelope::decode::<DirRequest<'_>>(&bytes).unwrap(), handoff);
    let env = Envelope::parse(&bytes).unwrap();
    assert_eq!(
        env.extension_value::<u64>(EXT_HANDOFF_MORE).unwrap(),
        Some(4096)
    );
}

/// A running shard of this release serves the previous release's committed lookup frame, and
/// answers a frame of a later envelope version with a typed refusal naming the version (no
/// hang, no panic).
#[test]
fn a_shard_serves_the_previous_release_and_refuses_a_later_one_by_version() {
    use peercache_directory::ClientConfig;
    use peercache_directory::testbed::TestNode;
    use peercache_wire::rpc::RpcError;
    use peercache_wire::{Incarnation, WIRE_VERSION, WireError};

    let n: Vec<TestNode> = (70..72)
        .map(|i| TestNode::start(i, Incarnation(1), ClientConfig::default()).unwrap())
        .collect();
    let members: Vec<_> = n.iter().map(|t| t.member()).collect();
    for t in &n {
        t.client.apply_membership(&members);
    }
    let old = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1/dir_lookup.bin"),
    )
    .unwrap();
    let addr = n[0].server.local_addr();
    let t = std::time::Duration::from_secs(2);
    let reply = n[1].client.rpc().call(addr, &old, t).unwrap();
    assert_eq!(
        peercache_wire::rpc::decode_reply::<DirReply>(&reply).unwrap(),
        DirReply::Found(vec![None, None]),
        "the previous release's lookup is answered"
    );
    let mut later = old.clone();
    later[2] = WIRE_VERSION + 1;
    match n[1].client.rpc().call(addr, &later, t) {
        Ok(f) => match peercache_wire::rpc::decode_reply::<DirReply>(&f) {
            Err(WireError::Remote { code, message }) => {
                assert_eq!(code, RpcError::CODE_MALFORMED);
                assert!(message.contains("version"), "{message}");
            }
            other => panic!("a later version must be refused by version: {other:?}"),
        },
        Err(WireError::Remote { code, message }) => {
            assert_eq!(code, RpcError::CODE_MALFORMED);
            assert!(message.contains("version"), "{message}");
        }
        Err(e) => panic!("a later version must be refused with a typed reply: {e}"),
    }
    assert!(matches!(
        peercache_wire::Envelope::parse(&later),
        Err(WireError::UnsupportedVersion { got, .. }) if got == WIRE_VERSION + 1
    ));
}

/// Layout fingerprints ride as the non-critical [`EXT_LAYOUTS`] extension on inserts, hand-offs
/// and lookup answers: the previous release decodes the same message (its locations have no
/// layout), this one reads each location's layout back.
///
/// [`EXT_LAYOUTS`]: peercache_directory::msg::EXT_LAYOUTS
#[test]
fn layout_runs_are_skipped_by_older_readers_and_read_by_this_one() {
    use peercache_directory::Location;
    use peercache_directory::msg::{LayoutRuns, Locations};
    use peercache_wire::Layout;
    use peercache_wire::envelope::{self, Envelope};

    let a = node(1);
    let with = |generation: u64, layout: u64| Location {
        layout: Layout(layout),
        ..loc(&a, generation)
    };
    /// A fixture's name and how to make its frame, with layouts or without.
    type Case<'a> = (&'static str, Box<dyn Fn(bool) -> Vec<u8> + 'a>);
    let cases: [Case<'_>; 3] = [
        (
            "dir_insert_layouts.bin",
            Box::new(|laid| {
                let l = |g, x| if laid { with(g, x) } else { loc(&a, g) };
                let m =
                    DirRequest::Insert(vec![(key(1), l(1, 0xbf16)), (key(2), l(2, 0xbf16))].into());
                check_layouts(&m, laid)
            }),
        ),
        (
            "dir_handoff_layouts.bin",
            Box::new(|laid| {
                let l = |g, x| if laid { with(g, x) } else { loc(&a, g) };
                let m = DirRequest::Handoff(
                    vec![(key(5), smallvec::smallvec![l(1, 0xf8), l(3, 0)])].into(),
                );
                check_layouts(&m, laid)
            }),
        ),
        (
            "dir_found_layouts.bin",
            Box::new(|laid| {
                let l = |g, x| if laid { with(g, x) } else { loc(&a, g) };
                let m = DirReply::Found(vec![
                    Some(smallvec::smallvec![l(1, 0xbf16), l(2, 0xf8)]),
                    None,
                ]);
                check_layouts(&m, laid)
            }),
        ),
    ];

    /// Encodes `m` with its layouts, checks what an older reader and this one decode, and
    /// returns the frame.
    fn check_layouts<M>(m: &M, laid: bool) -> Vec<u8>
    where
        M: peercache_wire::Message + Locations + Clone + PartialEq + std::fmt::Debug,
    {
        let ext: Vec<_> = LayoutRuns::extension(m).unwrap().into_iter().collect();
        assert_eq!(
            ext.len(),
            usize::from(laid),
            "sent only when some page has a layout"
        );
        let frame = envelope::encode(m, &ext).unwrap();
        let env = Envelope::parse(&frame).unwrap();
        let mut older: M = env.decode().unwrap();
        assert!(older.locations().iter().all(|l| l.layout.is_none()));
        LayoutRuns::read(&env, &mut older).unwrap();
        assert_eq!(&older, m, "this release reads every layout back");
        frame
    }

    for (name, make) in cases {
        let frame = make(true);
        let bytes = committed_frame(name, &frame);
        // Without layouts the message is the version-1 message, byte for byte.
        let plain = make(false);
        let older = Envelope::parse(&bytes).unwrap();
        assert_eq!(
            older.body,
            Envelope::parse(&plain).unwrap().body,
            "{name}: same body"
        );
    }
}

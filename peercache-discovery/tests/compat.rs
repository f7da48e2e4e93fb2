//! Version-1 discovery messages keep decoding from committed bytes.
//! Regenerate only when adding a message: `PEERCACHE_BLESS=1 cargo test -p peercache-discovery`.

use std::net::SocketAddr;
use std::path::PathBuf;

use peercache_discovery::{DiscReply, DiscRequest, NodeInfo};
use peercache_wire::envelope::Message;
use peercache_wire::{Incarnation, NodeId};

fn check<M: Message + PartialEq + std::fmt::Debug>(name: &str, msg: M) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1");
    peercache_wire::testkit::check_fixture(&dir, name, &msg);
}

fn info() -> NodeInfo {
    let a: SocketAddr = "10.0.0.2:31998".parse().unwrap();
    NodeInfo {
        node: NodeId::new("10.0.0.2:31998:tp0pp0dp0").unwrap(),
        incarnation: Incarnation(77),
        host: a.ip(),
        meta: Some(a),
        control: "10.0.0.2:40001".parse().unwrap(),
        data: vec!["10.0.0.2:40002".parse().unwrap()],
        role: "inference".into(),
        attrs: vec![("tp_size".into(), "8".into())],
    }
}

#[test]
fn v1_discovery_fixtures_decode() {
    let i = info();
    check("disc_register.bin", DiscRequest::Register(i.clone()));
    check(
        "disc_heartbeat.bin",
        DiscRequest::Heartbeat {
            node: i.node.clone(),
            incarnation: i.incarnation,
            known_version: 12,
        },
    );
    check(
        "disc_deregister.bin",
        DiscRequest::Deregister {
            node: i.node.clone(),
            incarnation: i.incarnation,
        },
    );
    check("disc_members_req.bin", DiscRequest::Members);
    check(
        "disc_members.bin",
        DiscReply::Members {
            version: 3,
            members: vec![i.clone()],
        },
    );
    check(
        "disc_heartbeat_reply.bin",
        DiscReply::Heartbeat {
            known: true,
            version: 4,
            members: Some(vec![i]),
        },
    );
    check("disc_ok.bin", DiscReply::Ok);
}

/// The delta heartbeat (added after version 1): its bytes are pinned from here on.
#[test]
fn delta_heartbeat_fixtures_decode() {
    let i = info();
    check(
        "disc_sync.bin",
        DiscRequest::Sync {
            node: i.node.clone(),
            incarnation: i.incarnation,
            known_version: 12,
        },
    );
    check(
        "disc_changes.bin",
        DiscReply::Changes {
            known: true,
            since: 12,
            version: 14,
            upserted: vec![i.clone()],
            removed: vec![NodeId::new("10.0.0.3:31998:tp0pp0dp0").unwrap()],
        },
    );
}

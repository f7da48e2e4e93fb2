//! Shared by the discovery integration tests: a member announcement on loopback.

use peercache_discovery::NodeInfo;
use peercache_wire::{Incarnation, NodeId};

/// The announcement of node `name` in its incarnation `inc`, every endpoint on 127.0.0.1.
pub(crate) fn info(name: &str, inc: u64) -> NodeInfo {
    NodeInfo {
        node: NodeId::new(name).unwrap(),
        incarnation: Incarnation(inc),
        host: "127.0.0.1".parse().unwrap(),
        meta: None,
        control: "127.0.0.1:1000".parse().unwrap(),
        data: vec!["127.0.0.1:2000".parse().unwrap()],
        role: "inference".into(),
        attrs: vec![],
    }
}

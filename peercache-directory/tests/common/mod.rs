//! Helpers shared by the directory tests.
#![allow(dead_code)]

use std::net::SocketAddr;

use peercache_directory::{CopyClass, Location, Rail};
use peercache_wire::{Incarnation, NodeId, PageKey};

pub(crate) fn node(i: usize) -> NodeId {
    NodeId::new(format!("node-{i}")).unwrap()
}

pub(crate) fn key(i: u64) -> PageKey {
    PageKey::from_key(&format!("key-{i}"))
}

pub(crate) fn loc(owner: &NodeId, generation: u64) -> Location {
    let ep: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    Location {
        node: owner.clone(),
        incarnation: Incarnation(1),
        rails: smallvec::smallvec![Rail {
            endpoint: ep,
            region: 7
        }],
        addr: 0x1000 * generation,
        len: 4096,
        valid_len: 4096,
        generation,
        checksum: generation * 31,
        resident: true,
        class: CopyClass::Retained,
        layout: peercache_wire::Layout::NONE,
    }
}

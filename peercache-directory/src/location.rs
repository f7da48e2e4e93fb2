//! What the directory stores about a page: where each of its owners keeps it.

use std::net::SocketAddr;

use peercache_wire::{Incarnation, Layout, NodeId};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// One transport rail of an owner: where to connect and which region to name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rail {
    /// Data endpoint (TCP data server or RDMA bootstrap) of this rail.
    pub endpoint: SocketAddr,
    /// Region key on this rail.
    pub region: u64,
}

/// Replacement class of an owner's copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyClass {
    /// A primary copy (published locally or promoted from disk).
    Retained,
    /// A copy fetched from a peer (or demoted): evicted first.
    Reclaimable,
}

/// Where one owner keeps a page.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    /// The data owner.
    pub node: NodeId,
    /// The owner's incarnation when it published.
    pub incarnation: Incarnation,
    /// Rails (rail 0 first); the address is the same on every rail.
    pub rails: SmallVec<[Rail; 1]>,
    /// Address of the slot header in the owner's region (the payload follows the header).
    pub addr: u64,
    /// Payload bytes.
    pub len: u32,
    /// Bytes holding data (partial tail pages).
    pub valid_len: u32,
    /// Slot generation at publish time (readers verify it).
    pub generation: u64,
    /// Payload checksum.
    pub checksum: u64,
    /// False when the page lives only on the owner's disk tier.
    pub resident: bool,
    /// Replacement class of this copy.
    pub class: CopyClass,
    /// Layout fingerprint of the owner's page ([`Layout::NONE`] when the owner declared none
    /// or is of a release before layouts). Not in the version-1 message body: it travels in
    /// the messages' `EXT_LAYOUTS` extension (written and read by the `msg` module, which
    /// depends on this one), so older members decode the same messages and see no layout.
    #[serde(skip)]
    pub layout: Layout,
}

/// Owners of one key.
pub type Owners = SmallVec<[Location; 2]>;

/// A location for unit tests: `node` in life `incarnation`, one rail naming `region`, a
/// one-byte resident retained page of no layout.
#[cfg(test)]
pub(crate) fn sample(node: &str, incarnation: u64, region: u64) -> Location {
    Location {
        node: NodeId::new(node).unwrap(),
        incarnation: Incarnation(incarnation),
        rails: smallvec::smallvec![Rail {
            endpoint: "127.0.0.1:9".parse().unwrap(),
            region,
        }],
        addr: 0,
        len: 1,
        valid_len: 1,
        generation: 1,
        checksum: 0,
        resident: true,
        class: CopyClass::Retained,
        layout: Layout::NONE,
    }
}

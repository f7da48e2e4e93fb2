//! Directory messages on the wire (kinds `0x02xx`). Version-1 fixtures live in
//! `tests/fixtures/v1/`.

use std::borrow::Cow;

use peercache_wire::envelope::Message;
use peercache_wire::{NodeId, PageKey};
use serde::{Deserialize, Serialize};

use crate::location::{Location, Owners};
use crate::shard::InsertOutcome;

/// Identifies one owner's copy for removal or demotion to disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRef {
    /// Page key.
    pub key: PageKey,
    /// Owner.
    pub node: NodeId,
    /// Only this generation (None: any).
    pub generation: Option<u64>,
}

/// A request to a directory shard. Borrowed on the sending side, owned when decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirRequest<'a> {
    /// Record locations.
    Insert(Cow<'a, [(PageKey, Location)]>),
    /// Owners of keys.
    Lookup(Cow<'a, [PageKey]>),
    /// Presence of keys.
    Exists(Cow<'a, [PageKey]>),
    /// Remove owners' copies.
    Remove(Cow<'a, [OwnerRef]>),
    /// Mark owners' copies disk-only.
    MarkNonResident(Cow<'a, [OwnerRef]>),
    /// Entries handed off after a ring change.
    Handoff(Cow<'a, [(PageKey, Owners)]>),
}

impl Message for DirRequest<'_> {
    const KIND: u16 = 0x0201;
    const NAME: &'static str = "DirRequest";
}

/// A shard's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirReply {
    /// One outcome per inserted entry.
    Inserted(Vec<InsertOutcome>),
    /// One owner list per looked-up key.
    Found(Vec<Option<Owners>>),
    /// One flag per key.
    Exists(Vec<bool>),
    /// How many items changed something.
    Applied(u32),
}

impl Message for DirReply {
    const KIND: u16 = 0x0202;
    const NAME: &'static str = "DirReply";
}

/// Extension of a [`DirReply::Found`] or [`DirReply::Exists`] reply (not critical: a reader
/// that does not know it sees plain misses): keys this shard gained in the last ring change and
/// is still receiving by hand-off, each with the member that held it before and keeps it until
/// the hand-off is done — ask that one. Payload: a postcard [`Moving`].
pub const EXT_MOVING: u16 = 0x0201;

/// Extension of a [`DirRequest::Handoff`] (not critical: an older shard ignores it): how many
/// more entries the sender will hand this shard after this request, for the ring change it is
/// handing off. A shard keeps answering [`EXT_MOVING`] until every sender reached 0. Payload:
/// a postcard `u64`.
pub const EXT_HANDOFF_MORE: u16 = 0x0202;

/// The payload of [`EXT_MOVING`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moving {
    /// (index of the key in the request, member that held it before the ring change).
    pub keys: Vec<(u32, NodeId)>,
}

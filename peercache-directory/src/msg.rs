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

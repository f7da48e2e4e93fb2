//! Store-level control messages, served on the control port beside the directory's:
//! a reader asks a page's owner to promote pages it holds only on its disk tier.
//!
//! Kinds `0x03xx`. The owner reads the records back into its pool (verified), answers with the
//! fresh resident locations at once, and re-publishes them to the directory off its control
//! thread (so two owners promoting for each other never wait on each other's control port).

use peercache_directory::Location;
use peercache_wire::PageKey;
use peercache_wire::envelope::Message;
use serde::{Deserialize, Serialize};

/// Most keys in one promote request; larger requests are refused (the reader splits).
pub const MAX_PROMOTE_KEYS: usize = 4096;

/// A request to a page owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreRequest {
    /// Bring these disk-tier pages back into the pool and return where they now live.
    Promote(Vec<PageKey>),
}

impl Message for StoreRequest {
    const KIND: u16 = 0x0301;
    const NAME: &'static str = "StoreRequest";
}

/// An owner's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreReply {
    /// One entry per requested key: its resident location, or None (not held, or corrupt).
    Promoted(Vec<Option<Location>>),
}

impl Message for StoreReply {
    const KIND: u16 = 0x0302;
    const NAME: &'static str = "StoreReply";
}

//! Store-level control messages, served on the control port beside the directory's: a reader
//! asks a page's owner to promote pages it holds only on its disk tier; an inference node
//! prepares, commits (checked against the writer's checksums), aborts or ingests writes on a
//! storage server (see `central`).
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
/// Most pages in one prepare or ingest request.
pub const MAX_WRITE_PAGES: usize = 16384;

/// Extension of a [`StoreRequest::Prepare`], [`StoreRequest::Ingest`] or
/// [`StoreRequest::SlotWrite`] (not critical): the writer's layout fingerprint, which the
/// owner writes into each page's header. An owner of an earlier release ignores it and stores
/// the pages with no layout, which readers that declared one then refuse as misses. Payload:
/// a postcard `u64`.
pub const EXT_LAYOUT: u16 = 0x0301;

/// A request to a page owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreRequest {
    /// Bring these disk-tier pages back into the pool and return where they now live.
    Promote(Vec<PageKey>),
    /// Reserve slots for pages (key, length, valid length) that `writer` will write remotely.
    Prepare {
        /// The node that will write (only it may write the reserved ranges).
        writer: peercache_wire::NodeId,
        /// (key, payload length, valid length) per page.
        pages: Vec<(PageKey, u32, u32)>,
    },
    /// Make written reservations live.
    Commit(Vec<u64>),
    /// Release reservations that will not be written.
    Abort(Vec<u64>),
    /// Publish pages whose bytes travel in the request: (key, valid length, bytes).
    Ingest(Vec<(PageKey, u32, Vec<u8>)>),
    /// Slotmap mode: write these pages into the owner's slotmap region.
    SlotWrite(Vec<(PageKey, Vec<u8>)>),
    /// Make written reservations live, each only if its payload's checksum is the writer's
    /// (token, XXH3-64 of the page): a torn or stray write is released, not published.
    CommitVerified(Vec<(u64, u64)>),
    /// Where this node's own pool holds these pages (a router's hint named it): its resident
    /// copies only, no promotion. At most `MAX_PROMOTE_KEYS` keys.
    Locate(Vec<PageKey>),
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
    /// One outcome per prepared page.
    Prepared(Vec<PrepareOutcome>),
    /// One location per committed token (None: the reservation had expired).
    Committed(Vec<Option<Location>>),
    /// Reservations released.
    Aborted(u32),
    /// One location per ingested page (None: refused).
    Ingested(Vec<Option<Location>>),
    /// One outcome per slot-written page.
    SlotWritten(Vec<bool>),
    /// One entry per located key: the node's resident copy, or None (not in its pool).
    Located(Vec<Option<Location>>),
}

/// What a storage server did with one page of a prepare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareOutcome {
    /// A reserved slot: write the payload at `addr` in region `region`, then commit `token`.
    Slot {
        /// Reservation token.
        token: u64,
        /// Payload address in the server's pool.
        addr: u64,
        /// The pool's region key.
        region: u64,
    },
    /// Already stored there.
    Present(Location),
    /// Refused (pool full, bad length, not a storage server).
    Refused(String),
}

impl Message for StoreReply {
    const KIND: u16 = 0x0302;
    const NAME: &'static str = "StoreReply";
}

/// The envelope extension that carries `layout` to an owner a node writes to.
pub(crate) fn layout_extension(layout: peercache_wire::Layout) -> Vec<peercache_wire::Extension> {
    peercache_wire::Extension::of(EXT_LAYOUT, &layout.0)
        .into_iter()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use peercache_wire::envelope;

    #[test]
    fn round_trip_and_hostile_bytes_never_panic() {
        let req = StoreRequest::Prepare {
            writer: peercache_wire::NodeId::new("w").unwrap(),
            pages: vec![(PageKey::from_key("k"), 4096, 100)],
        };
        let bytes = envelope::encode(&req, &[]).unwrap();
        assert_eq!(envelope::decode::<StoreRequest>(&bytes).unwrap(), req);
        // Every truncation and many corruptions decode to an error or a value, never a panic
        // (and never an allocation sized by a hostile length: postcard checks lengths against
        // the bytes present).
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for cut in 0..bytes.len() {
            let _ = envelope::decode::<StoreRequest>(&bytes[..cut]);
        }
        for _ in 0..20_000 {
            let mut b = bytes.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % b.len();
                b[i] = (x >> 32) as u8;
            }
            let _ = envelope::decode::<StoreRequest>(&b);
            let _ = envelope::decode::<StoreReply>(&b);
        }
    }
}

//! Store-level control requests (kinds `0x03xx`) a node serves on its control port:
//! promotions for readers, the storage-server write protocol and slot writes, each refused
//! with a typed error while the node starts or stops, or when the request is out of bounds.

use std::sync::atomic::Ordering;

use peercache_wire::envelope;
use peercache_wire::rpc::{self, Peer, Reply, RpcError};

use crate::control::{EXT_LAYOUT, MAX_PROMOTE_KEYS, MAX_WRITE_PAGES, StoreReply, StoreRequest};

/// Serves a store-level control request (kinds `0x03xx`).
pub(crate) fn serve_store(
    cell: &crate::node::core::NodeCell,
    peer: &Peer,
    env: peercache_wire::Envelope<'_>,
) -> Reply {
    let refuse = |code, message: String, close| Reply::Error {
        error: RpcError { code, message },
        close,
    };
    let req: StoreRequest = match env.decode() {
        Ok(r) => r,
        Err(e) => return refuse(RpcError::CODE_MALFORMED, e.to_string(), true),
    };
    // The writer's layout rides as an extension; a malformed one is refused, an absent one
    // (an earlier writer) is no layout.
    let layout = match env.extension_value::<u64>(EXT_LAYOUT) {
        Ok(l) => peercache_wire::Layout(l.unwrap_or(0)),
        Err(e) => return refuse(RpcError::CODE_MALFORMED, e.to_string(), true),
    };
    let Some(inner) = cell.get().and_then(|w| w.upgrade()) else {
        return refuse(
            RpcError::CODE_SHUTDOWN,
            "node is starting or stopping".into(),
            false,
        );
    };
    if inner.stopping.load(Ordering::Acquire) {
        return refuse(RpcError::CODE_SHUTDOWN, "node is stopping".into(), false);
    }
    let frame = |r: StoreReply| match envelope::encode(&r, &[]) {
        Ok(f) => Reply::Frame(f),
        Err(e) => refuse(RpcError::CODE_REFUSED, e.to_string(), false),
    };
    // The storage write protocol belongs to the writer the connection announced: it reserves,
    // commits and aborts only for itself.
    let writer = || match &peer.node {
        Some(n) => Ok(n),
        None => {
            inner.metrics.identity_refused.add(1);
            Err(rpc::forbidden(peer, "storage writes need a node identity"))
        }
    };
    match req {
        StoreRequest::Prepare {
            writer: claimed,
            pages,
        } => {
            if pages.len() > MAX_WRITE_PAGES {
                return refuse(RpcError::CODE_REFUSED, "too many pages".into(), false);
            }
            let me = match writer() {
                Ok(w) => w,
                Err(r) => return r,
            };
            if claimed != *me {
                inner.metrics.identity_refused.add(1);
                static LOG: peercache_wire::limits::Throttle =
                    peercache_wire::limits::Throttle::new();
                if let Some(held) = LOG.admit() {
                    tracing::warn!(peer = %peer.label(), claimed = %claimed, refused_since_last = held, "refused a prepare for another writer");
                }
                return rpc::forbidden(peer, &format!("prepare for writer {claimed}"));
            }
            frame(StoreReply::Prepared(
                inner.storage_owner().prepare(me, &pages, layout),
            ))
        }
        StoreRequest::Commit(_) => refuse(
            RpcError::CODE_REFUSED,
            "an unverified commit is not served: send CommitVerified with the writer's checksum \
             of every page"
                .into(),
            false,
        ),
        StoreRequest::CommitVerified(pairs) => {
            if pairs.len() > MAX_WRITE_PAGES {
                return refuse(RpcError::CODE_REFUSED, "too many pages".into(), false);
            }
            match writer() {
                Ok(w) => frame(StoreReply::Committed(
                    inner.storage_owner().commit_verified(w, &pairs),
                )),
                Err(r) => r,
            }
        }
        StoreRequest::SlotWrite(pages) => {
            if pages.len() > MAX_WRITE_PAGES {
                return refuse(RpcError::CODE_REFUSED, "too many pages".into(), false);
            }
            frame(StoreReply::SlotWritten(match inner.mode.slots() {
                Some(slots) => inner.slot_io(slots).write(&pages, layout),
                None => vec![false; pages.len()],
            }))
        }
        StoreRequest::Abort(tokens) => {
            if tokens.len() > MAX_WRITE_PAGES {
                return refuse(RpcError::CODE_REFUSED, "too many pages".into(), false);
            }
            match writer() {
                Ok(w) => frame(StoreReply::Aborted(inner.storage_owner().abort(w, &tokens))),
                Err(r) => r,
            }
        }
        StoreRequest::Ingest(pages) => {
            if pages.len() > MAX_WRITE_PAGES {
                return refuse(RpcError::CODE_REFUSED, "too many pages".into(), false);
            }
            frame(StoreReply::Ingested(
                inner.storage_owner().ingest(&pages, layout),
            ))
        }
        StoreRequest::Promote(keys) if keys.len() > MAX_PROMOTE_KEYS => refuse(
            RpcError::CODE_REFUSED,
            format!(
                "{} keys in one promote (limit {MAX_PROMOTE_KEYS})",
                keys.len()
            ),
            false,
        ),
        StoreRequest::Locate(keys) if keys.len() > MAX_PROMOTE_KEYS => refuse(
            RpcError::CODE_REFUSED,
            format!(
                "{} keys in one locate (limit {MAX_PROMOTE_KEYS})",
                keys.len()
            ),
            false,
        ),
        StoreRequest::Locate(keys) => frame(StoreReply::Located(inner.resident_locations(&keys))),
        StoreRequest::Promote(keys) => {
            let locs = inner.promotion().promote_here(&keys, false);
            match envelope::encode(&StoreReply::Promoted(locs), &[]) {
                Ok(f) => Reply::Frame(f),
                Err(e) => refuse(RpcError::CODE_REFUSED, e.to_string(), false),
            }
        }
    }
}

//! Centralized and hybrid modes: inference nodes write into storage servers' pools.
//!
//! A write to storage is three steps per storage owner (the ring of storage nodes places each
//! key; all owners are asked at once):
//!
//! 1. **prepare** — the owner reserves pool slots for the pages and returns their payload
//!    addresses; only these ranges accept remote writes, only from the node that reserved them
//!    ([`ReservationGuard`] on the owner's pool registration), only until the reservation
//!    expires (`reservation_timeout`; expired ones are released, so nothing leaks);
//! 2. **write** — one-sided WRITE of the payloads straight from the caller's registered buffer
//!    (or a registered staging copy) into those slots;
//! 3. **commit** — the owner checksums the payloads in place, writes the slot headers and makes
//!    the pages live; the writer records the returned locations in the directory.
//!
//! A page whose write failed is aborted and sent again inside an **ingest** request that
//! carries its bytes. Reads need nothing new: the directory names the storage node, and readers
//! read its pool one-sided like any peer's.

pub(crate) mod owner;
pub(crate) mod writer;

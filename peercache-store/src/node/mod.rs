//! The node itself: its shared [`core::Core`] and the parts it is made of, start-up, the
//! write path, membership and shutdown, and the public [`Store`](store::Store) handle.

pub(crate) mod core;
pub(crate) mod fdlimit;
pub(crate) mod home;
pub(crate) mod identity;
pub(crate) mod keys;
pub(crate) mod parts;
pub(crate) mod reach;
pub(crate) mod setup;
pub(crate) mod stamp;
pub(crate) mod start;
pub(crate) mod stats;
pub(crate) mod store;
pub(crate) mod threads;
pub(crate) mod write;

//! `peercache-wire`: the leaf crate every networked PeerCache crate shares.
//!
//! It owns everything that crosses a socket, whatever the plane (discovery, directory,
//! store control, transport bootstrap):
//!
//! * [`frame`] — length-delimited framing with a hard maximum frame size, for blocking
//!   (`std::net`) and async (`tokio-util` codec) sockets;
//! * [`envelope`] — the versioned envelope `{magic, version, kind, flags, body_len}` followed by
//!   a `postcard` body and a trailing extension list that older readers skip;
//! * [`handshake`] — the connection handshake (version negotiation and, with [`auth`], mutual
//!   challenge–response authentication on the shared cluster secret);
//! * [`limits`] — accept back-off when descriptors run out, throttled warnings;
//! * [`ids`] — the identifiers every plane shares: [`NodeId`], [`Incarnation`], [`PageKey`].
//!
//! Nothing here depends on another PeerCache crate.

#![forbid(unsafe_code)]

pub mod auth;
pub mod budgeted;
pub mod describe;
pub mod envelope;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod identity;
pub mod ids;
pub mod limits;
pub mod metrics;
pub mod qp;
pub mod rpc;
pub mod seal;
pub mod shares;
pub mod tally;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use auth::Auth;
pub use envelope::{Envelope, Extension, Message, WIRE_VERSION};
pub use error::WireError;
pub use ids::{Incarnation, Layout, NodeId, PageKey};

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

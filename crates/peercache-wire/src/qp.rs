//! Wire messages of the RDMA queue-pair bootstrap (`peercache-transport`'s `rdma::bootstrap`
//! runs the exchange): what one side must know of the other's reliable-connected queue pair.

use serde::{Deserialize, Serialize};

use crate::envelope::Message;

/// One side's queue pair, as the other side needs it to connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QpInfo {
    /// Rail index (rails pair by index on both hosts).
    pub rail: u8,
    /// Queue-pair number.
    pub qpn: u32,
    /// First packet sequence number this side sends with (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (RoCE and routed InfiniBand).
    pub gid: [u8; 16],
    /// Active path MTU as the verbs enum value (1 = 256 … 5 = 4096).
    pub mtu: u8,
    /// Outstanding RDMA READs this side can have in flight as initiator, and accept as target.
    pub rd_atomic: u8,
}

impl Message for QpInfo {
    const KIND: u16 = 0x0401;
    const NAME: &'static str = "QpInfo";
}

/// The server's answer to a [`QpInfo`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QpReply {
    /// Connected: the server's queue pair.
    Accept(QpInfo),
    /// Refused, with the reason (no such rail, out of queue pairs…).
    Reject(String),
}

impl Message for QpReply {
    const KIND: u16 = 0x0402;
    const NAME: &'static str = "QpReply";
}

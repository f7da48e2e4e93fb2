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

/// Client → server on the bootstrap plane: connect a queue pair, or list the regions peers may
/// target with their per-rail remote keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BootstrapRequest {
    /// Connect a queue pair to this one.
    Qp(QpInfo),
    /// Send [`RegionTable`].
    Regions,
}

impl Message for BootstrapRequest {
    const KIND: u16 = 0x0403;
    const NAME: &'static str = "BootstrapRequest";
}

/// One remotely accessible region: the transport's region key, its range, and its remote key
/// on each rail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRkeys {
    /// The transport's region key (what locations name).
    pub key: u64,
    /// Start address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key per rail.
    pub rkeys: Vec<u32>,
    /// Whether peers may write it.
    pub writable: bool,
}

/// Server → client: every region peers may read (or write) over RDMA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionTable {
    /// The regions.
    pub regions: Vec<RegionRkeys>,
}

impl Message for RegionTable {
    const KIND: u16 = 0x0404;
    const NAME: &'static str = "RegionTable";
}

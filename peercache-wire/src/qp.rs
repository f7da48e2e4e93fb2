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

/// Extension tag of a [`BootstrapRequest::Regions`] from a client that reads chunked regions:
/// the server then lists them in a [`TAG_CHUNKED_REGIONS`] extension of its [`RegionTable`].
/// Not critical: a server of an earlier release ignores it and sends its one table.
pub const TAG_READS_CHUNKS: u16 = 0x0001;

/// Extension tag of a [`RegionTable`] carrying its [`ChunkedRegions`]. Sent only to a client
/// that asked with [`TAG_READS_CHUNKS`]; a client of an earlier release gets a table without
/// the chunked regions (and reads them over TCP), never one chunk of a region as the whole.
pub const TAG_CHUNKED_REGIONS: u16 = 0x0002;

/// A region registered with the NIC in chunks of `chunk` bytes: chunk `i` covers
/// `[base + i * chunk, min(base + (i + 1) * chunk, base + len))` and has its own remote keys.
/// Chunks are registered in order from the first, so those with keys are a prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkedRegion {
    /// The transport's region key (what locations name).
    pub key: u64,
    /// Start address.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Chunk length in bytes (the last chunk may be shorter).
    pub chunk: u64,
    /// Chunks in all, once every one is registered.
    pub chunks: u32,
    /// Remote keys of the chunks registered so far, first chunk first; one key per rail each.
    pub rkeys: Vec<Vec<u32>>,
    /// Whether peers may write it.
    pub writable: bool,
}

impl ChunkedRegion {
    /// Whether every chunk is registered (the table will not grow).
    pub fn complete(&self) -> bool {
        self.rkeys.len() as u64 >= u64::from(self.chunks)
    }

    /// The index of the chunk holding all of `[addr, addr + len)`, when its keys are known;
    /// `None` outside the region, across a chunk boundary, or in a chunk not registered yet.
    ///
    /// ```
    /// use peercache_wire::qp::ChunkedRegion;
    /// let r = ChunkedRegion {
    ///     key: 1, base: 0x1000, len: 300, chunk: 100, chunks: 3,
    ///     rkeys: vec![vec![7], vec![8]], writable: false,
    /// };
    /// assert_eq!(r.chunk_of(0x1000 + 150, 50), Some(1));
    /// assert_eq!(r.chunk_of(0x1000 + 90, 20), None, "spans two chunks");
    /// assert_eq!(r.chunk_of(0x1000 + 250, 10), None, "chunk 2 is not registered yet");
    /// assert!(!r.complete());
    /// ```
    pub fn chunk_of(&self, addr: u64, len: u64) -> Option<usize> {
        chunk_index(self.base, self.len, self.chunk, self.rkeys.len(), addr, len)
    }
}

/// The index of the chunk holding all of `[addr, addr + len)` in a region of `region_len`
/// bytes at `base` cut into chunks of `chunk` bytes, of which the first `ready` are usable;
/// `None` outside the region, across a chunk boundary or beyond the ready ones. The one rule
/// both ends of a chunked registration apply (the owner to its local keys, a reader to the
/// table).
pub fn chunk_index(
    base: u64,
    region_len: u64,
    chunk: u64,
    ready: usize,
    addr: u64,
    len: u64,
) -> Option<usize> {
    if chunk == 0 || addr < base {
        return None;
    }
    let off = addr - base;
    let end = off.checked_add(len)?;
    if end > region_len {
        return None;
    }
    let i = off / chunk;
    if end > (i + 1).saturating_mul(chunk) || i >= ready as u64 {
        return None;
    }
    Some(i as usize)
}

/// The chunked regions of a [`RegionTable`], in its [`TAG_CHUNKED_REGIONS`] extension.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkedRegions {
    /// The regions.
    pub regions: Vec<ChunkedRegion>,
}

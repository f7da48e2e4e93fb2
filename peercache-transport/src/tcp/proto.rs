//! The TCP data-plane protocol (after the `peercache-wire` handshake on [`Plane::Data`]).
//!
//! All integers little-endian. A request is a 16-byte header, `count` 24-byte op descriptors
//! and, for writes, the payloads of all ops in order. A reply is a 16-byte header, `count`
//! status bytes (0 = ok, else an [`OpError`] code) and, for reads, the payloads of the ops
//! that succeeded, in order. Status bytes come before payloads so the client can receive each
//! payload straight into its destination.
//!
//! [`Plane::Data`]: peercache_wire::handshake::Plane::Data
//! [`OpError`]: crate::OpError

use crate::RegionKey;

/// Request magic.
pub(crate) const REQ_MAGIC: [u8; 2] = *b"PD";
/// Reply magic.
pub(crate) const REP_MAGIC: [u8; 2] = *b"PR";
/// Header size (request and reply).
pub(crate) const HDR_LEN: usize = 16;
/// Op descriptor size.
pub(crate) const OP_LEN: usize = 24;

/// Op kind: read the remote range.
pub(crate) const OP_READ: u8 = 1;
/// Op kind: write the remote range.
pub(crate) const OP_WRITE: u8 = 2;

/// Batch status: accepted (per-op statuses follow).
pub(crate) const BATCH_OK: u8 = 0;
/// Batch status: more ops than the server allows.
pub(crate) const BATCH_TOO_MANY_OPS: u8 = 1;
/// Batch status: unknown op kind.
pub(crate) const BATCH_BAD_KIND: u8 = 2;
/// Batch status: more bytes than the server allows.
pub(crate) const BATCH_TOO_MANY_BYTES: u8 = 3;

/// A request or reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) magic: [u8; 2],
    /// Op kind (request) or batch status (reply).
    pub(crate) code: u8,
    pub(crate) count: u32,
    pub(crate) req_id: u64,
}

impl Header {
    pub(crate) fn encode(&self, out: &mut [u8; HDR_LEN]) {
        out[0..2].copy_from_slice(&self.magic);
        out[2] = self.code;
        out[3] = 0;
        out[4..8].copy_from_slice(&self.count.to_le_bytes());
        out[8..16].copy_from_slice(&self.req_id.to_le_bytes());
    }

    pub(crate) fn decode(b: &[u8; HDR_LEN]) -> Header {
        Header {
            magic: [b[0], b[1]],
            code: b[2],
            count: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            req_id: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        }
    }
}

/// One op descriptor on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WireOp {
    pub(crate) region: RegionKey,
    pub(crate) addr: u64,
    pub(crate) len: u32,
}

impl WireOp {
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.region.0.to_le_bytes());
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&[0u8; 4]);
    }

    pub(crate) fn decode(b: &[u8]) -> WireOp {
        WireOp {
            region: RegionKey(u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"))),
            addr: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            len: u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_op_round_trip() {
        let h = Header {
            magic: REQ_MAGIC,
            code: OP_WRITE,
            count: 77,
            req_id: u64::MAX - 3,
        };
        let mut b = [0u8; HDR_LEN];
        h.encode(&mut b);
        assert_eq!(Header::decode(&b), h);
        let op = WireOp {
            region: RegionKey(0xdead_beef_0000_0001),
            addr: 0x7fff_0000_1000,
            len: 131072,
        };
        let mut v = Vec::new();
        op.encode_into(&mut v);
        assert_eq!(v.len(), OP_LEN);
        assert_eq!(WireOp::decode(&v), op);
    }
}

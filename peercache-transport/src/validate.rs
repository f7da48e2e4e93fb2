//! The per-op checks every data path and every server makes, written once.
//!
//! An op names a remote range (region key, address, length) and a list of local segments. Before
//! any byte moves, the side that owns a memory range checks it: the TCP server checks a peer's
//! op against its region table, the client checks the local segments, the same-host path checks
//! a peer's range against the mapping it received, and the RDMA path checks both against the
//! tables it holds (the NIC itself would only say "remote access error"). All of them use the
//! functions here, so a check cannot differ between paths.
//!
//! Range arithmetic never overflows: a range is inside a region when `addr >= base` and
//! `len <= region_len - (addr - base)`, computed without `addr + len`.

use std::collections::HashMap;

use peercache_wire::NodeId;

use crate::batch::{Batch, OpDesc};
use crate::region::Region;
use crate::{OpError, RegionKey};

/// Whether `[addr, addr + len)` lies inside `[base, base + region_len)`, without overflow.
pub(crate) fn contains(base: u64, region_len: u64, addr: u64, len: u64) -> bool {
    addr >= base && {
        let off = addr - base;
        off <= region_len && len <= region_len - off
    }
}

/// [`contains`] as a typed error naming the region.
pub(crate) fn range(
    key: RegionKey,
    base: u64,
    region_len: u64,
    addr: u64,
    len: u64,
) -> Result<(), OpError> {
    if contains(base, region_len, addr, len) {
        Ok(())
    } else {
        Err(OpError::OutOfRegion {
            region: key,
            addr,
            len,
            region_len,
        })
    }
}

/// An op's length must be in `1..=max_op_bytes`.
pub(crate) fn op_len(len: u32, max_op_bytes: u32) -> Result<(), OpError> {
    if len == 0 || len > max_op_bytes {
        Err(OpError::BadLength {
            len: u64::from(len),
            max: u64::from(max_op_bytes),
        })
    } else {
        Ok(())
    }
}

/// An op's local segments must add up to its remote length.
pub(crate) fn segments_add_up(batch: &Batch, op: &OpDesc) -> Result<(), OpError> {
    let sum: u64 = batch.op_segments(op).iter().map(|s| u64::from(s.len)).sum();
    let remote = u64::from(op.remote.len);
    if sum == remote {
        Ok(())
    } else {
        Err(OpError::LengthMismatch {
            segments: sum,
            remote,
        })
    }
}

/// Which way a peer's op moves bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Way<'a> {
    /// The peer reads.
    Read,
    /// The peer writes: who it is, and the latest its payload can finish landing.
    Write {
        /// The node id of the writer's handshake.
        peer: Option<&'a NodeId>,
        /// The data server's deadline for the payload.
        done_by: std::time::Instant,
    },
}

/// A peer's op against this node's region table: length, region known, not device memory
/// (the TCP planes never touch it), access allowed, range inside, write guard.
pub(crate) fn remote_op(
    regions: &HashMap<RegionKey, Region>,
    key: RegionKey,
    addr: u64,
    len: u32,
    way: Way<'_>,
    max_op_bytes: u32,
) -> Result<(), OpError> {
    let write = matches!(way, Way::Write { .. });
    op_len(len, max_op_bytes)?;
    let region = regions.get(&key).ok_or(OpError::UnknownRegion(key))?;
    if region.device {
        return Err(OpError::DeviceOnly(key));
    }
    let allowed = if write {
        region.access.allows_remote_write()
    } else {
        region.access.allows_remote_read()
    };
    if !allowed {
        return Err(OpError::AccessDenied(key));
    }
    range(key, region.base, region.len, addr, u64::from(len))?;
    if let Way::Write { peer, done_by } = way
        && let Some(g) = &region.guard
        && !g.allow_write(peer, addr, u64::from(len), done_by)
    {
        return Err(OpError::AccessDenied(key));
    }
    Ok(())
}

/// An op's local segments, for a path that moves bytes with the CPU (TCP, same-host):
/// registered host memory (or [`RegionKey::UNREGISTERED`] caller memory the batch vouches
/// for), in bounds, adding up to the remote length.
pub(crate) fn local_segments(
    regions: &HashMap<RegionKey, Region>,
    batch: &Batch,
    op: &OpDesc,
    max_op_bytes: u32,
) -> Result<(), OpError> {
    op_len(op.remote.len, max_op_bytes)?;
    for s in batch.op_segments(op) {
        let len = u64::from(s.len);
        if s.region == RegionKey::UNREGISTERED && batch.allows_unregistered() {
            // Caller memory valid for the call (its unsafe promise): a sane range suffices.
            if s.addr == 0 || s.addr.checked_add(len).is_none() {
                return Err(OpError::OutOfRegion {
                    region: s.region,
                    addr: s.addr,
                    len,
                    region_len: 0,
                });
            }
            continue;
        }
        let r = regions
            .get(&s.region)
            .ok_or(OpError::UnknownRegion(s.region))?;
        if r.device {
            return Err(OpError::DeviceOnly(s.region));
        }
        range(s.region, r.base, r.len, s.addr, len)?;
    }
    segments_add_up(batch, op)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_near_the_end_of_the_address_space_do_not_wrap() {
        let top = u64::MAX - 4095;
        assert!(contains(top, 4096, top, 4096));
        assert!(!contains(top, 4096, top + 1, 4096));
        assert!(!contains(top, 4096, u64::MAX, 2));
        assert!(!contains(0x1000, 0x1000, u64::MAX - 10, 20));
        assert!(
            contains(0x1000, 0x1000, 0x2000, 0),
            "an empty range at the end"
        );
        assert!(!contains(0x1000, 0x1000, 0xfff, 1));
    }

    #[test]
    fn zero_and_oversized_ops_are_bad_lengths() {
        assert!(op_len(1, 8).is_ok() && op_len(8, 8).is_ok());
        assert_eq!(op_len(0, 8), Err(OpError::BadLength { len: 0, max: 8 }));
        assert_eq!(op_len(9, 8), Err(OpError::BadLength { len: 9, max: 8 }));
    }
}

#[cfg(test)]
mod props {
    //! The checks against a model written in 128-bit arithmetic, on random tables and ops.
    use super::*;
    use crate::Access;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    struct ModelRegion {
        base: u64,
        len: u64,
        access: Access,
        device: bool,
    }

    fn access() -> impl Strategy<Value = Access> {
        prop_oneof![
            Just(Access::LocalOnly),
            Just(Access::RemoteRead),
            Just(Access::RemoteReadWrite)
        ]
    }

    /// Bases and lengths that crowd the edges of the address space as often as the middle.
    fn edgy() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..0x10000, (u64::MAX - 0x10000)..=u64::MAX, any::<u64>(),]
    }

    fn region() -> impl Strategy<Value = ModelRegion> {
        (edgy(), 1u64..0x20000, access(), any::<bool>()).prop_map(|(base, len, access, device)| {
            ModelRegion {
                base,
                len,
                access,
                device,
            }
        })
    }

    fn model(
        regions: &[ModelRegion],
        idx: usize,
        addr: u64,
        len: u32,
        write: bool,
        max: u32,
    ) -> Result<(), &'static str> {
        if len == 0 || len > max {
            return Err("bad_length");
        }
        let Some(r) = regions.get(idx) else {
            return Err("unknown_region");
        };
        if r.device {
            return Err("device_only");
        }
        let ok = match r.access {
            Access::LocalOnly => false,
            Access::RemoteRead => !write,
            Access::RemoteReadWrite => true,
        };
        if !ok {
            return Err("access_denied");
        }
        let (a, l, b, rl) = (addr as u128, len as u128, r.base as u128, r.len as u128);
        if a < b || a + l > b + rl {
            return Err("out_of_region");
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn remote_op_agrees_with_the_model(
            regions in proptest::collection::vec(region(), 1..6),
            idx in 0usize..8,
            addr in edgy(),
            len in prop_oneof![Just(0u32), 1u32..0x30000, Just(u32::MAX)],
            write in any::<bool>(),
            max in prop_oneof![Just(64u32 << 20), 1u32..0x10000],
        ) {
            let table: HashMap<RegionKey, Region> = regions
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    (
                        RegionKey(i as u64 + 1),
                        Region {
                            base: r.base,
                            len: r.len,
                            access: r.access,
                            guard: None,
                            device: r.device,
                            shared: None,
                        },
                    )
                })
                .collect();
            let way = if write {
                Way::Write { peer: None, done_by: std::time::Instant::now() }
            } else {
                Way::Read
            };
            let got = remote_op(&table, RegionKey(idx as u64 + 1), addr, len, way, max)
                .map_err(|e| e.label());
            prop_assert_eq!(got, model(&regions, idx, addr, len, write, max));
        }

        #[test]
        fn contains_agrees_with_wide_arithmetic(base in edgy(), rlen in edgy(), addr in edgy(), len in edgy()) {
            let (b, rl, a, l) = (base as u128, rlen as u128, addr as u128, len as u128);
            // A region itself never wraps (registration refuses it).
            prop_assume!(b + rl <= u64::MAX as u128 + 1);
            prop_assert_eq!(contains(base, rlen, addr, len), a >= b && a + l <= b + rl);
        }
    }
}

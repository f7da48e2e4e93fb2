//! `peercache-transport`: the PeerCache data plane.
//!
//! A node registers memory regions with an [`Access`] level; peers read from and write into
//! them by `(region key, address, length)` without the owner's code touching each page. The
//! unit of work is a [`Batch`]: each op names one remote range and a list of local segments
//! (scatter/gather), so a header and a payload, K and V, or many layers land where they belong
//! in one call.
//!
//! [`Transport`] owns the region table and the data server, and hands each batch to the first
//! of its data paths that can carry it for that peer — one module each, behind one small
//! internal trait (`path`):
//!
//! * `local/` — peers on the same host skip the network: a region registered with its memory
//!   file ([`Transport::share`]) is mapped read-only by such peers, whose reads become one copy
//!   out of shared memory (the host-local path; `TransportConfig::host_local`);
//! * [`rdma`] — reads go one-sided through the NIC, and device (GPU) memory can be registered
//!   too ([`DeviceMemory`], [`Transport::register_device`]): only the RDMA path reaches it;
//! * `tcp/` — reaches every peer, so it is tried last: the server serves only registered
//!   regions with the right access, the client keeps a per-peer pool of connections, streams
//!   payloads with vectored I/O straight between registered memory and the socket (no
//!   intermediate buffer, no per-page allocation) and bounds every wait with `op_timeout`;
//!   after a timeout the peer is marked suspect for a short time so callers fail fast.
//!
//! Every path and server checks ops with the same functions (`validate`: region known, access,
//! overflow-safe bounds, lengths), so a check cannot differ between paths.

mod batch;
mod config;
mod device;
mod error;
mod handle;
mod local;
pub mod metrics;
mod path;
pub mod rdma;
mod region;
mod stats;
mod tcp;
mod transport;
mod validate;

pub use batch::{Batch, OpDesc, RemoteRange, Segment};
pub use config::TransportConfig;
pub use device::{DeviceMemory, peermem_loaded};
pub use error::{OpError, TransportError};
pub use handle::RegionHandle;
pub use region::{Access, RegionKey, RegionOptions, Residency, WriteGuard};
pub use stats::{PeerStats, TransportStats};
pub use transport::Transport;

/// Per-op outcome of a batch, in op order.
pub type OpResults = Vec<Result<(), OpError>>;

/// Runs the data server's request decoding and per-op validation on arbitrary bytes, against
/// a fixed table of three regions (one of each access level), and the host-local decoders
/// (invitation, region table) on the same bytes. For the fuzz target: it must never panic,
/// whatever the bytes.
#[doc(hidden)]
pub fn fuzz_request(data: &[u8]) -> usize {
    use std::collections::HashMap;
    use tcp::proto;
    let local = local::fuzz_decode(data);
    if data.len() < proto::HDR_LEN {
        return local;
    }
    let h = proto::Header::decode(data[..proto::HDR_LEN].try_into().expect("16 bytes"));
    let mut regions = HashMap::new();
    for (i, access) in [
        Access::LocalOnly,
        Access::RemoteRead,
        Access::RemoteReadWrite,
    ]
    .into_iter()
    .enumerate()
    {
        regions.insert(
            RegionKey(i as u64 + 1),
            region::Region {
                base: 0x1000_0000 * (i as u64 + 1),
                len: 1 << 20,
                access,
                guard: None,
                device: false,
                shared: None,
            },
        );
    }
    let ops = &data[proto::HDR_LEN..];
    let n = (h.count as usize).min(ops.len() / proto::OP_LEN);
    let way = if h.code == proto::OP_WRITE {
        validate::Way::Write {
            peer: None,
            done_by: std::time::Instant::now(),
        }
    } else {
        validate::Way::Read
    };
    (0..n)
        .filter(|i| {
            let op = proto::WireOp::decode(&ops[i * proto::OP_LEN..(i + 1) * proto::OP_LEN]);
            validate::remote_op(&regions, op.region, op.addr, op.len, way, 64 << 20).is_ok()
        })
        .count()
        + local
}

/// The README's examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;

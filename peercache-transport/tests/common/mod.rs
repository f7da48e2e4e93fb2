//! Helpers the transport's integration tests share.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use peercache_transport::rdma::path::{PathOptions, RdmaPath, RdmaPlane};
use peercache_transport::rdma::soft::{Fabric, SoftBootstrap, SoftVerbs};
use peercache_transport::{Access, RegionHandle, RemoteRange, Segment, Transport, TransportConfig};
use peercache_wire::auth::Auth;

/// The cluster secret of the RDMA tests.
pub(crate) const SECRET: &[u8] = b"a-cluster-secret-of-enough-bytes";

/// Authentication with [`SECRET`].
pub(crate) fn auth() -> Auth {
    Auth::from_secret(SECRET).unwrap()
}

/// A TCP transport config with a 2 s deadline, authenticated with [`SECRET`].
pub(crate) fn cfg() -> TransportConfig {
    TransportConfig {
        op_timeout: Duration::from_secs(2),
        auth: auth(),
        ..TransportConfig::default()
    }
}

/// A transport with a default soft RDMA path over `fabric`.
pub(crate) fn rdma_transport(fabric: &Arc<Fabric>) -> Transport {
    soft_transport(fabric, Soft::default())
}

/// `len` pseudo-random bytes determined by `seed`.
#[allow(unused_imports)] // each test file uses a different subset
pub(crate) use peercache_wire::testkit::pattern;

/// Options of [`soft_transport`].
#[derive(Clone, Copy, Default)]
pub(crate) struct Soft {
    /// `TransportConfig::rdma_writes`.
    pub(crate) rdma_writes: bool,
    /// Emulated implicit on-demand paging.
    pub(crate) odp: bool,
    /// `PathOptions::register_chunk` (0: the default).
    pub(crate) chunk: u64,
}

/// A transport whose RDMA path runs on the software `fabric` (two rails; queue pairs
/// bootstrapped over the peer's real data port, authenticated with [`SECRET`]).
pub(crate) fn soft_transport(fabric: &Arc<Fabric>, opts: Soft) -> Transport {
    soft_transport_and_path(fabric, opts).0
}

/// [`soft_transport`], and its RDMA path (its registrations).
pub(crate) fn soft_transport_and_path(
    fabric: &Arc<Fabric>,
    opts: Soft,
) -> (Transport, Arc<RdmaPath<SoftVerbs>>) {
    let mut verbs = SoftVerbs::new(fabric.clone(), 2, 4, 16);
    if opts.odp {
        verbs = verbs.with_implicit_odp();
    }
    verbs.bootstrap = Some(SoftBootstrap {
        node: None,
        auth: auth(),
        timeout: Duration::from_secs(2),
    });
    let mut options = PathOptions::default();
    if opts.chunk > 0 {
        options.register_chunk = opts.chunk;
    }
    let path = RdmaPath::with_options(verbs, None, auth(), Duration::from_secs(2), options);
    let cfg = TransportConfig {
        rdma_writes: opts.rdma_writes,
        ..cfg()
    };
    let plane: Arc<dyn RdmaPlane> = path.clone();
    (
        Transport::start_with_rdma(cfg, None, Some(plane)).unwrap(),
        path,
    )
}

/// A registered test buffer: its handle and the bytes behind it (filled with [`pattern`]).
pub(crate) struct Region {
    pub(crate) h: RegionHandle,
    pub(crate) mem: Vec<u8>,
}

/// Registers `len` pattern bytes for `seed` on `t` with `access`.
pub(crate) fn region(t: &Transport, len: usize, access: Access, seed: u64) -> Region {
    let mut mem = pattern(seed, len);
    // SAFETY: `mem` moves into the returned `Region` with the handle, and the heap buffer it
    // owns does not move; callers drop the handle no later than the buffer.
    let h = unsafe { t.register(mem.as_mut_ptr(), mem.len(), access) }.unwrap();
    Region { h, mem }
}

/// `len` bytes at `off` of the peer's region `h`, as a batch's remote range.
pub(crate) fn remote(h: &RegionHandle, off: u64, len: u32) -> RemoteRange {
    RemoteRange {
        region: h.key(),
        addr: h.addr(off),
        len,
    }
}

/// `len` bytes at `off` of the local region `h`, as a batch's local segment.
pub(crate) fn seg(h: &RegionHandle, off: u64, len: u32) -> Segment {
    Segment {
        region: h.key(),
        addr: h.addr(off),
        len,
    }
}

/// Polls `done` every few milliseconds until it holds; fails the test after `limit`.
pub(crate) fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

//! Helpers the transport's integration tests share.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use peercache_transport::rdma::path::{RdmaPath, RdmaPlane};
use peercache_transport::rdma::soft::{Fabric, SoftBootstrap, SoftVerbs};
use peercache_transport::{Transport, TransportConfig};
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
}

/// A transport whose RDMA path runs on the software `fabric` (two rails; queue pairs
/// bootstrapped over the peer's real data port, authenticated with [`SECRET`]).
pub(crate) fn soft_transport(fabric: &Arc<Fabric>, opts: Soft) -> Transport {
    let mut verbs = SoftVerbs::new(fabric.clone(), 2, 4, 16);
    if opts.odp {
        verbs = verbs.with_implicit_odp();
    }
    verbs.bootstrap = Some(SoftBootstrap {
        node: None,
        auth: auth(),
        timeout: Duration::from_secs(2),
    });
    let path: Arc<dyn RdmaPlane> = RdmaPath::new(verbs, None, auth(), Duration::from_secs(2));
    let cfg = TransportConfig {
        rdma_writes: opts.rdma_writes,
        ..cfg()
    };
    Transport::start_with_rdma(cfg, None, Some(path)).unwrap()
}

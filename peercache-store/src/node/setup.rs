//! The pieces a node's start assembles, each decided from the config alone: the address
//! peers reach it at, listener ports and binds, the RDMA plane and the disk tier.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::Arc;

use peercache_wire::NodeId;

use crate::StoreError;
use crate::config::PeerCacheConfig;

/// The address peers should use to reach this node.
pub(super) fn resolve_local_host(cfg: &PeerCacheConfig, seeds: &[SocketAddr]) -> IpAddr {
    if !cfg.local_hostname.is_empty() {
        if let Ok(ip) = cfg.local_hostname.parse() {
            return ip;
        }
        if let Some(a) = (cfg.local_hostname.as_str(), 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut i| i.next())
        {
            return a.ip();
        }
    }
    // The local address that routes to the first seed (no packet is sent).
    let Some(&seed) = seeds.first() else {
        return IpAddr::from([127, 0, 0, 1]);
    };
    if seed.ip().is_loopback() {
        return seed.ip();
    }
    UdpSocket::bind(("0.0.0.0", 0))
        .and_then(|s| s.connect(seed).map(|_| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// Opens this node's disk tier (`<disk_path>/<node_id>`); a tier that cannot open is
/// disabled with a warning and the node runs without it.
pub(super) fn open_disk(
    cfg: &PeerCacheConfig,
    me: &NodeId,
) -> Option<Arc<peercache_pool::disk::DiskTier>> {
    let root = if cfg.disk_path.is_empty() {
        match peercache_pool::disk::default_root() {
            Some(r) => r,
            None => {
                tracing::warn!(
                    "disk tier off: neither XDG_DATA_HOME nor HOME is set; set disk_path to a folder of this user's"
                );
                return None;
            }
        }
    } else {
        std::path::PathBuf::from(&cfg.disk_path)
    };
    let dir = root.join(me.as_str());
    let disk_cfg = cfg.disk(dir.clone());
    match peercache_pool::disk::DiskTier::open(disk_cfg) {
        Ok(t) => {
            tracing::info!(dir = %dir.display(), capacity = cfg.disk_size, recovering = t.is_recovering(), "disk tier open");
            Some(Arc::new(t))
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "disk tier unavailable; running without it");
            None
        }
    }
}

/// The pool's warming as the transport sees it: a registration chunk of the pool goes to the
/// NIC only once the pool's own threads (pinned per NUMA node) faulted it in.
pub(super) struct PoolResidency(pub(super) std::sync::Weak<peercache_pool::Pool>);

impl peercache_transport::Residency for PoolResidency {
    fn wait_resident(&self, offset: u64, len: u64, timeout: std::time::Duration) -> bool {
        self.0
            .upgrade()
            .is_some_and(|p| p.wait_resident(offset, len, timeout))
    }
}

/// The RDMA registration chunk for a pool of `slab`-byte slabs: `want` rounded up to whole
/// slabs and 4 KiB pages, so no page spans two registrations (0: one registration).
pub(super) fn register_chunk(want: u64, slab: u64) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    if want == 0 || slab == 0 {
        return 0;
    }
    let unit = slab / gcd(slab, 4096) * 4096;
    want.div_ceil(unit)
        .checked_mul(unit)
        .unwrap_or(want / unit * unit)
}

/// The RDMA path for `cfg`'s backend, or None (logged) when it cannot open. Remote-readable
/// regions longer than the registration chunk (rounded to whole `slab`s) are registered in
/// chunks.
pub(super) fn rdma_plane(
    cfg: &PeerCacheConfig,
    me: &NodeId,
    auth: &peercache_wire::auth::Auth,
    slab: u64,
) -> Option<Arc<dyn peercache_transport::rdma::path::RdmaPlane>> {
    use peercache_transport::rdma::path::{PathOptions, RdmaPath};
    let timeout = cfg.op_timeout();
    let options = PathOptions {
        max_channels: cfg.max_channels_per_peer,
        register_chunk: register_chunk(cfg.rdma_register_chunk, slab),
    };
    match cfg.rdma_backend {
        crate::RdmaBackend::Soft => {
            use peercache_transport::rdma::soft::{Fabric, SoftBootstrap, SoftVerbs};
            static FABRIC: std::sync::OnceLock<Arc<Fabric>> = std::sync::OnceLock::new();
            let fabric = FABRIC.get_or_init(Fabric::new).clone();
            let rails = cfg.rdma_devices().len().max(1);
            let mut verbs = SoftVerbs::new(fabric, rails, 16, 64);
            verbs.bootstrap = Some(SoftBootstrap {
                node: Some(me.clone()),
                auth: auth.clone(),
                timeout,
            });
            Some(RdmaPath::with_options(
                verbs,
                Some(me.clone()),
                auth.clone(),
                timeout,
                options,
            ))
        }
        crate::RdmaBackend::Verbs => verbs_plane(cfg, me, auth, options),
    }
}

#[cfg(feature = "rdma")]
pub(super) fn verbs_plane(
    cfg: &PeerCacheConfig,
    me: &NodeId,
    auth: &peercache_wire::auth::Auth,
    options: peercache_transport::rdma::path::PathOptions,
) -> Option<Arc<dyn peercache_transport::rdma::path::RdmaPlane>> {
    use peercache_transport::rdma::verbs::{SidewayVerbs, VerbsConfig};
    let vc = VerbsConfig {
        devices: cfg.rdma_devices(),
        ib_port: cfg.ib_port,
        gid_index: cfg.gid_index,
        sq_depth: 128,
        max_sge: 16,
        node: Some(me.clone()),
        auth: auth.clone(),
        bootstrap_timeout: cfg.op_timeout(),
    };
    match SidewayVerbs::open(vc) {
        Ok(v) => Some(peercache_transport::rdma::path::RdmaPath::with_options(
            v,
            Some(me.clone()),
            auth.clone(),
            cfg.op_timeout(),
            options,
        )),
        Err(why) => {
            tracing::warn!("protocol=rdma requested but {why}; using the TCP transport");
            None
        }
    }
}

#[cfg(not(feature = "rdma"))]
pub(super) fn verbs_plane(
    _cfg: &PeerCacheConfig,
    _me: &NodeId,
    _auth: &peercache_wire::auth::Auth,
    _options: peercache_transport::rdma::path::PathOptions,
) -> Option<Arc<dyn peercache_transport::rdma::path::RdmaPlane>> {
    None
}

/// A configured base port for this rank: 0 stays 0 (any free port), else the base plus the
/// local rank, so the ranks of one server that share an extra config never collide.
pub(super) fn rank_port(base: u16, cfg: &PeerCacheConfig) -> u16 {
    if base == 0 {
        0
    } else {
        base.saturating_add(cfg.local_rank() as u16)
    }
}

pub(super) fn bind_addr(host: &str, port: u16) -> Result<SocketAddr, StoreError> {
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| StoreError::BadRequest(format!("cannot resolve bind host {host:?}")))
}

/// The address peers use for a listener bound at `bound`: `host` when `local_hostname` was set
/// explicitly (NAT, proxies) or the listener is bound to the wildcard, else the bound address.
pub(super) fn advertise(bound: SocketAddr, host: IpAddr, explicit: bool) -> SocketAddr {
    if explicit || bound.ip().is_unspecified() {
        SocketAddr::new(host, bound.port())
    } else {
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::register_chunk;

    #[test]
    fn the_registration_chunk_is_whole_slabs_and_whole_pages() {
        assert_eq!(register_chunk(0, 64 << 20), 0, "0: one registration");
        assert_eq!(register_chunk(1 << 30, 64 << 20), 1 << 30);
        assert_eq!(
            register_chunk(100 << 20, 64 << 20),
            128 << 20,
            "up to whole slabs"
        );
        // A slab that is not a multiple of 4 KiB: whole slabs that are also whole pages.
        let c = register_chunk(1 << 20, 6144);
        assert_eq!((c % 6144, c % 4096), (0, 0));
        assert!(c >= 1 << 20);
        assert_eq!(
            register_chunk(u64::MAX, 64 << 20) % (64 << 20),
            0,
            "no overflow"
        );
    }
}

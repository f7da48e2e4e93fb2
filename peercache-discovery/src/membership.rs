//! One handle over either membership source: the built-in masters ([`DiscoveryClient`]) or an
//! etcd cluster (`EtcdClient`, feature `etcd`). Everything above membership — the ring, the
//! directory, the modes — sees only this.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use crate::client::{DiscoveryClient, DiscoveryConfig};
use crate::client_core::Event;
use crate::error::DiscoveryError;
use crate::etcd_config::EtcdConfig;
use crate::info::NodeInfo;

/// Where the membership comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// The built-in multi-master discovery (the default).
    Masters(DiscoveryConfig),
    /// Leases and a watch in an etcd cluster.
    Etcd(EtcdConfig),
}

/// A running membership client of either source. All methods take `&self`.
#[derive(Debug)]
pub enum Membership {
    /// Built-in masters.
    Masters(DiscoveryClient),
    /// etcd.
    #[cfg(feature = "etcd")]
    Etcd(crate::etcd::EtcdClient),
}

macro_rules! each {
    ($self:ident, $c:ident => $e:expr) => {
        match $self {
            Membership::Masters($c) => $e,
            #[cfg(feature = "etcd")]
            Membership::Etcd($c) => $e,
        }
    };
}

impl Membership {
    /// Starts announcing `me` through `source`. A build without the `etcd` feature refuses
    /// [`Source::Etcd`] with [`DiscoveryError::EtcdNotBuilt`].
    pub fn start(me: NodeInfo, source: Source) -> Result<Self, DiscoveryError> {
        match source {
            Source::Masters(cfg) => Ok(Membership::Masters(DiscoveryClient::start(me, cfg)?)),
            #[cfg(feature = "etcd")]
            Source::Etcd(cfg) => Ok(Membership::Etcd(crate::etcd::EtcdClient::start(me, cfg)?)),
            #[cfg(not(feature = "etcd"))]
            Source::Etcd(_) => Err(DiscoveryError::EtcdNotBuilt),
        }
    }

    /// `masters` or `etcd`.
    pub fn kind(&self) -> &'static str {
        match self {
            Membership::Masters(_) => "masters",
            #[cfg(feature = "etcd")]
            Membership::Etcd(_) => "etcd",
        }
    }

    /// Waits until this member is registered (`None`: wait forever).
    pub fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), DiscoveryError> {
        each!(self, c => c.wait_ready(timeout))
    }

    /// True once registered.
    pub fn is_ready(&self) -> bool {
        each!(self, c => c.is_ready())
    }

    /// True while the membership is the last one seen because its source is unreachable
    /// (etcd only: the masters' soft state has no such notion).
    pub fn is_stale(&self) -> bool {
        match self {
            Membership::Masters(_) => false,
            #[cfg(feature = "etcd")]
            Membership::Etcd(c) => c.is_stale(),
        }
    }

    /// Waits until `cond(members)` holds or `timeout` passes; returns whether it held.
    pub fn wait_for(&self, timeout: Duration, cond: impl Fn(&[NodeInfo]) -> bool) -> bool {
        each!(self, c => c.wait_for(timeout, cond))
    }

    /// Current members.
    pub fn members(&self) -> Vec<NodeInfo> {
        each!(self, c => c.members())
    }

    /// Current discovery masters (none with etcd).
    pub fn masters(&self) -> Vec<SocketAddr> {
        match self {
            Membership::Masters(c) => c.masters(),
            #[cfg(feature = "etcd")]
            Membership::Etcd(_) => Vec::new(),
        }
    }

    /// Where the membership is kept, for `/cluster`: masters' addresses or etcd's URLs.
    pub fn sources(&self) -> Vec<String> {
        match self {
            Membership::Masters(c) => c.masters().iter().map(|m| m.to_string()).collect(),
            #[cfg(feature = "etcd")]
            Membership::Etcd(c) => c.endpoints().to_vec(),
        }
    }

    /// Rounds completed.
    pub fn rounds(&self) -> u64 {
        each!(self, c => c.rounds())
    }

    /// A channel of membership events from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<Event> {
        each!(self, c => c.subscribe())
    }

    /// Leaves at once and stops. Idempotent.
    pub fn shutdown(&self) {
        each!(self, c => c.shutdown())
    }

    /// Stops without leaving (what a crash looks like; for tests).
    pub fn abandon(&self) {
        each!(self, c => c.abandon())
    }
}

#[cfg(all(test, not(feature = "etcd")))]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_etcd_says_how_to_get_it() {
        let info = NodeInfo {
            node: peercache_wire::NodeId::new("a").unwrap(),
            incarnation: peercache_wire::Incarnation(1),
            host: [127, 0, 0, 1].into(),
            meta: None,
            control: "127.0.0.1:1".parse().unwrap(),
            data: vec![],
            role: "inference".into(),
            attrs: vec![],
        };
        let err = Membership::start(info, Source::Etcd(EtcdConfig::default())).unwrap_err();
        assert!(matches!(err, DiscoveryError::EtcdNotBuilt));
        assert!(err.to_string().contains("--features etcd"), "{err}");
    }
}

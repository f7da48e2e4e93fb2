//! Settings of the etcd membership backend (compiled in every build, so a configuration can be
//! checked and a node built without the `etcd` feature can say so clearly).

use std::path::PathBuf;
use std::time::Duration;

/// Where and how to reach the etcd cluster that keeps the membership. `Debug` never prints
/// the password.
#[derive(Clone)]
pub struct EtcdConfig {
    /// Client URLs, e.g. `http://10.0.0.1:2379` (`https://` with [`EtcdConfig::tls`]).
    pub endpoints: Vec<String>,
    /// Key prefix of this cluster: members live under `<prefix>/members/<node id>`.
    pub prefix: String,
    /// Lease time to live: a member whose process dies leaves when its lease expires.
    pub lease_ttl: Duration,
    /// How often the lease is refreshed (a third of the TTL or less).
    pub heartbeat: Duration,
    /// Deadline of one etcd call (connect, grant, put, get, keep-alive, revoke).
    pub rpc_timeout: Duration,
    /// User name and password (etcd's own authentication), if the cluster has it enabled.
    pub user: Option<(String, String)>,
    /// TLS towards etcd, if its client URLs are `https://`.
    pub tls: Option<EtcdTls>,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("lease_ttl", &self.lease_ttl)
            .field("heartbeat", &self.heartbeat)
            .field("rpc_timeout", &self.rpc_timeout)
            .field("user", &self.user.as_ref().map(|(u, _)| (u, "<redacted>")))
            .field("tls", &self.tls)
            .finish()
    }
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: Vec::new(),
            prefix: "/peercache".into(),
            lease_ttl: Duration::from_secs(3),
            heartbeat: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(2),
            user: None,
            tls: None,
        }
    }
}

impl EtcdConfig {
    /// The lease TTL in whole seconds as etcd grants it (rounded up, at least 2 s: etcd raises
    /// shorter leases to its own minimum anyway).
    pub fn lease_ttl_secs(&self) -> i64 {
        (self.lease_ttl.as_secs_f64().ceil() as i64).max(2)
    }

    /// The prefix without trailing slashes (`/` alone stays empty: keys start at `/members/`).
    pub fn clean_prefix(&self) -> &str {
        self.prefix.trim_end_matches('/')
    }
}

/// TLS files for etcd connections (PEM).
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// CA bundle that signed etcd's server certificate (empty: the system roots are not used;
    /// one is required).
    pub ca_file: PathBuf,
    /// Client certificate, for etcd's `--client-cert-auth` (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// Client private key.
    pub key_file: Option<PathBuf>,
    /// Server name to verify (empty: the endpoint's host).
    pub domain: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ttl_rounds_up_to_whole_seconds_and_never_below_two() {
        let c = |s: f64| EtcdConfig {
            lease_ttl: Duration::from_secs_f64(s),
            ..EtcdConfig::default()
        };
        assert_eq!(c(0.5).lease_ttl_secs(), 2);
        assert_eq!(c(3.0).lease_ttl_secs(), 3);
        assert_eq!(c(3.2).lease_ttl_secs(), 4);
    }

    #[test]
    fn debug_never_prints_the_password() {
        let c = EtcdConfig {
            user: Some(("pc".into(), "s3cret-pw".into())),
            ..EtcdConfig::default()
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("\"pc\"") && !shown.contains("s3cret-pw"),
            "{shown}"
        );
    }

    #[test]
    fn the_prefix_loses_trailing_slashes() {
        let c = |p: &str| EtcdConfig {
            prefix: p.into(),
            ..EtcdConfig::default()
        };
        assert_eq!(c("/pc/").clean_prefix(), "/pc");
        assert_eq!(c("/").clean_prefix(), "");
        assert_eq!(c("/a/b").clean_prefix(), "/a/b");
    }
}

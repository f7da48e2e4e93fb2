//! The authentication rules at start: which secret a node proves, where it is reachable, and
//! whether it may start without a secret.

use std::net::ToSocketAddrs;
use std::path::PathBuf;

use super::{ConfigError, PeerCacheConfig};

impl PeerCacheConfig {
    /// The handshake authentication this config asks for: `cluster_secret`, else the contents
    /// of `cluster_secret_file` (surrounding whitespace trimmed), else none.
    pub fn cluster_auth(&self) -> Result<peercache_wire::Auth, ConfigError> {
        let from_file;
        let secret = if !self.cluster_secret.is_empty() {
            self.cluster_secret.expose()
        } else if !self.cluster_secret_file.is_empty() {
            let path = PathBuf::from(&self.cluster_secret_file);
            from_file = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
                path: path.clone(),
                reason: format!("reading cluster_secret_file: {e}"),
            })?;
            from_file.trim()
        } else {
            return Ok(peercache_wire::Auth::none());
        };
        let also: Vec<&[u8]> = [self.cluster_secret_accept.expose().as_bytes()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        peercache_wire::Auth::rotating(secret.as_bytes(), &also).map_err(|e| ConfigError::Invalid {
            key: if self.cluster_secret.is_empty() {
                "cluster_secret_file"
            } else {
                "cluster_secret"
            },
            value: "<redacted>".into(),
            reason: e.to_string(),
        })
    }

    /// The addresses this node would listen on, advertise or contact that are not loopback
    /// (a wildcard bind counts: it listens on every interface).
    pub fn reachable_beyond_loopback(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut host = |key: &str, h: &str| {
            if h.is_empty() {
                return;
            }
            let loopback = (h, 0u16)
                .to_socket_addrs()
                .map(|mut a| a.all(|a| a.ip().is_loopback()))
                .unwrap_or(false);
            if !loopback {
                out.push(format!("{key} = {h}"));
            }
        };
        host("local_hostname", &self.local_hostname);
        host("rdma_bind_host", &self.rdma_bind_host);
        host("control_bind_host", &self.control_bind_host);
        host("meta_bind_host", &self.meta_bind_host);
        for seed in self.discovery_addr.split(',').map(str::trim) {
            if let Some((h, _)) = seed.rsplit_once(':') {
                host(
                    "discovery_addr",
                    h.trim_start_matches('[').trim_end_matches(']'),
                );
            }
        }
        out
    }

    /// The authentication rule at start: with a secret, nothing to say; without one, a node
    /// reachable only on loopback starts with a warning (returned), one reachable beyond it
    /// refuses to start unless `insecure = true`; `cluster_secret_accept` alone is an error
    /// (it would silently leave the node open).
    pub fn check_authentication(
        &self,
        auth: &peercache_wire::Auth,
    ) -> Result<Option<String>, ConfigError> {
        if auth.is_enabled() {
            return Ok(None);
        }
        if !self.cluster_secret_accept.is_empty() {
            return Err(ConfigError::Invalid {
                key: "cluster_secret_accept",
                value: "<redacted>".into(),
                reason: "an accepted secret needs cluster_secret (or cluster_secret_file) too; \
                         alone it would leave the node unauthenticated"
                    .into(),
            });
        }
        let beyond = self.reachable_beyond_loopback();
        if self.insecure {
            return Ok(Some(format!(
                "insecure = true: running without a cluster secret although reachable at {}; \
                 any process that reaches these ports can join, read pages and query the directory",
                if beyond.is_empty() {
                    "loopback only".to_string()
                } else {
                    beyond.join(", ")
                }
            )));
        }
        if beyond.is_empty() {
            return Ok(Some(
                "no cluster_secret set: this node is reachable on loopback only, where any local \
                 process can join it (set cluster_secret or PEERCACHE_CLUSTER_SECRET; see \
                 docs/operations.md)"
                    .into(),
            ));
        }
        Err(ConfigError::Unauthenticated { reachable: beyond })
    }
}

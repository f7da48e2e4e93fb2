//! The etcd settings: their relations, and the discovery crate's [`EtcdConfig`] they lower to.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use peercache_discovery::{EtcdConfig, EtcdTls};

use super::{ConfigError, PeerCacheConfig};

impl PeerCacheConfig {
    /// The etcd endpoints as written (empty entries dropped).
    pub fn etcd_endpoint_list(&self) -> Vec<String> {
        self.etcd_endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Checks the etcd keys' relations (`discovery = "etcd"`).
    pub(super) fn validate_etcd(&self) -> Result<(), ConfigError> {
        let invalid = |key, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                reason: reason.into(),
            })
        };
        let endpoints = self.etcd_endpoint_list();
        if endpoints.is_empty() {
            return Err(ConfigError::Missing("etcd_endpoints"));
        }
        for e in &endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            if rest
                .rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
            {
                return invalid(
                    "etcd_endpoints",
                    e.clone(),
                    "expected http://host:port or https://host:port",
                );
            }
            if e.starts_with("https://") && self.etcd_ca_file.is_empty() {
                return invalid(
                    "etcd_endpoints",
                    e.clone(),
                    "an https:// endpoint needs etcd_ca_file (the CA that signed etcd's certificate)",
                );
            }
        }
        if !self.etcd_ca_file.is_empty() && endpoints.iter().any(|e| e.starts_with("http://")) {
            return invalid(
                "etcd_endpoints",
                self.etcd_endpoints.clone(),
                "etcd_ca_file is set: every endpoint must be https://",
            );
        }
        if self.etcd_cert_file.is_empty() != self.etcd_key_file.is_empty() {
            return invalid(
                "etcd_cert_file",
                self.etcd_cert_file.clone(),
                "etcd_cert_file and etcd_key_file go together: set both or neither",
            );
        }
        let has_password = !self.etcd_password.is_empty() || !self.etcd_password_file.is_empty();
        let has_user = !self.etcd_user.is_empty();
        if has_password != has_user {
            return invalid(
                "etcd_user",
                self.etcd_user.clone(),
                "etcd_user and etcd_password (or etcd_password_file) go together",
            );
        }
        if !self.etcd_prefix.starts_with('/') {
            return invalid("etcd_prefix", self.etcd_prefix.clone(), "must start with /");
        }
        Ok(())
    }

    /// The etcd client's settings: the lease lives `member_ttl`, is refreshed every
    /// `heartbeat_interval`, every call has `op_timeout`.
    pub fn etcd(&self) -> Result<EtcdConfig, ConfigError> {
        let password = if !self.etcd_password.is_empty() {
            Some(self.etcd_password.expose().to_string())
        } else if !self.etcd_password_file.is_empty() {
            let path = PathBuf::from(&self.etcd_password_file);
            let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
                path: path.clone(),
                reason: format!("reading etcd_password_file: {e}"),
            })?;
            Some(text.trim().to_string())
        } else {
            None
        };
        let opt = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
        Ok(EtcdConfig {
            endpoints: self.etcd_endpoint_list(),
            prefix: self.etcd_prefix.clone(),
            lease_ttl: Duration::from_secs_f64(self.member_ttl),
            heartbeat: Duration::from_secs_f64(self.heartbeat_interval),
            rpc_timeout: self.op_timeout(),
            user: password.map(|p| (self.etcd_user.clone(), p)),
            tls: opt(&self.etcd_ca_file).map(|ca_file| EtcdTls {
                ca_file,
                cert_file: opt(&self.etcd_cert_file),
                key_file: opt(&self.etcd_key_file),
                domain: None,
            }),
        })
    }

    /// etcd's addresses, resolved where they resolve (to pick the local address that routes
    /// to them when `local_hostname` is empty).
    pub fn etcd_addrs(&self) -> Vec<SocketAddr> {
        self.etcd_endpoint_list()
            .iter()
            .filter_map(|e| {
                let rest = e
                    .strip_prefix("http://")
                    .or_else(|| e.strip_prefix("https://"))
                    .unwrap_or(e);
                rest.to_socket_addrs().ok()?.next()
            })
            .collect()
    }
}

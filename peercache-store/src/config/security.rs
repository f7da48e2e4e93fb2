//! The authentication rules at start: which secret a node proves, where it is reachable, and
//! whether it may start without a secret.

use std::net::ToSocketAddrs;
use std::path::PathBuf;

use super::{ConfigError, PeerCacheConfig};

impl PeerCacheConfig {
    /// The handshake authentication this config asks for: `cluster_secret`, else the contents
    /// of `cluster_secret_file` (surrounding whitespace trimmed), else none.
    /// Its connections are sealed as `encrypt_in_transit` says ([`Self::sealing`]); `true`
    /// without a secret is an error (nothing to key the encryption from).
    pub fn cluster_auth(&self) -> Result<peercache_wire::Auth, ConfigError> {
        let Some(secret) = self.secret()? else {
            if self.require_node_certificates || !self.node_key_file.is_empty() {
                return Err(ConfigError::Invalid {
                    key: "require_node_certificates",
                    value: self.require_node_certificates.to_string(),
                    reason: "node certificates are proven in the authenticated handshake: set \
                             cluster_secret (or cluster_secret_file) too"
                        .into(),
                });
            }
            if self.encrypt_in_transit == super::Transit::On {
                return Err(ConfigError::Invalid {
                    key: "encrypt_in_transit",
                    value: "true".into(),
                    reason: "encryption in transit is keyed from the cluster secret: set \
                             cluster_secret (or cluster_secret_file) too"
                        .into(),
                });
            }
            return Ok(peercache_wire::Auth::none());
        };
        let also: Vec<&[u8]> = [self.cluster_secret_accept.expose().as_bytes()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let auth = peercache_wire::Auth::rotating(secret.as_bytes(), &also)
            .map_err(|e| self.invalid(e))?
            .with_sealing(self.sealing());
        Ok(match self.node_identity()? {
            Some(id) => auth.with_identity(id),
            None => auth,
        })
    }

    /// What `encrypt_in_transit` asks of this node's connections: `true` requires sealing,
    /// `false` offers it, `auto` prefers it when the node is reachable beyond loopback and
    /// offers it on loopback.
    pub fn sealing(&self) -> peercache_wire::seal::Sealing {
        use peercache_wire::seal::Sealing;
        match self.encrypt_in_transit {
            super::Transit::On => Sealing::Require,
            super::Transit::Off => Sealing::Offer,
            super::Transit::Auto if self.reachable_beyond_loopback().is_empty() => Sealing::Offer,
            super::Transit::Auto => Sealing::Prefer,
        }
    }

    /// The per-node credentials this config names: this node's key and certificate, the
    /// cluster's public key, whether certificates are required. None when no key is set.
    fn node_identity(&self) -> Result<Option<peercache_wire::identity::Identity>, ConfigError> {
        use peercache_wire::identity::{Identity, NodeCert, SigningKey, public_key_from_text};
        let (key, cert, ca) = (
            &self.node_key_file,
            &self.node_cert_file,
            &self.cluster_ca_file,
        );
        if key.is_empty() && cert.is_empty() && ca.is_empty() && !self.require_node_certificates {
            return Ok(None);
        }
        let refuse = |key: &'static str, reason: &str| ConfigError::Invalid {
            key,
            value: "<file>".into(),
            reason: reason.into(),
        };
        if key.is_empty() != cert.is_empty() {
            return Err(refuse(
                if key.is_empty() {
                    "node_key_file"
                } else {
                    "node_cert_file"
                },
                "node_key_file and node_cert_file go together (peercache-node cert issue writes both)",
            ));
        }
        if ca.is_empty() {
            return Err(refuse(
                "cluster_ca_file",
                "node certificates are checked against the cluster's public key: set \
                 cluster_ca_file (peercache-node cert init writes it)",
            ));
        }
        let read = |key: &'static str, path: &str| {
            std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: PathBuf::from(path),
                reason: format!("reading {key}: {e}"),
            })
        };
        let parsed = |key: &'static str, e: peercache_wire::WireError| ConfigError::Invalid {
            key,
            value: "<file>".into(),
            reason: e.to_string(),
        };
        let cluster = public_key_from_text(&read("cluster_ca_file", ca)?)
            .map_err(|e| parsed("cluster_ca_file", e))?;
        let own = if key.is_empty() {
            None
        } else {
            let k = SigningKey::from_text(&read("node_key_file", key)?)
                .map_err(|e| parsed("node_key_file", e))?;
            let c = NodeCert::from_text(&read("node_cert_file", cert)?)
                .map_err(|e| parsed("node_cert_file", e))?;
            Some((k, c))
        };
        Identity::new(own, cluster, self.require_node_certificates)
            .map(Some)
            .map_err(|e| parsed("node_cert_file", e))
    }

    /// The client API port's authentication: [`Self::cluster_auth`], also accepting the
    /// secret's read-only client token ([`peercache_wire::auth::read_only_token`]), whose
    /// holders may read and look up but not write.
    pub fn client_auth(&self) -> Result<peercache_wire::Auth, ConfigError> {
        let auth = self.cluster_auth()?;
        match self.secret()? {
            Some(secret) => auth
                .accepting_read_only(secret.as_bytes())
                .map_err(|e| self.invalid(e)),
            None => Ok(auth),
        }
    }

    /// The read-only client token of this config's secret (None without a secret).
    pub fn read_only_token(&self) -> Result<Option<String>, ConfigError> {
        self.secret()?
            .map(|s| {
                peercache_wire::auth::read_only_token(s.as_bytes()).map_err(|e| self.invalid(e))
            })
            .transpose()
    }

    /// `cluster_secret`, else the contents of `cluster_secret_file` (trimmed), else None.
    fn secret(&self) -> Result<Option<String>, ConfigError> {
        if !self.cluster_secret.is_empty() {
            return Ok(Some(self.cluster_secret.expose().to_string()));
        }
        if self.cluster_secret_file.is_empty() {
            return Ok(None);
        }
        let path = PathBuf::from(&self.cluster_secret_file);
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
            path: path.clone(),
            reason: format!("reading cluster_secret_file: {e}"),
        })?;
        Ok(Some(text.trim().to_string()))
    }

    fn invalid(&self, e: peercache_wire::WireError) -> ConfigError {
        ConfigError::Invalid {
            key: if self.cluster_secret.is_empty() {
                "cluster_secret_file"
            } else {
                "cluster_secret"
            },
            value: "<redacted>".into(),
            reason: e.to_string(),
        }
    }

    /// A warning when the secret comes from `cluster_secret_file` and that file can be read by
    /// its group or by other users (any of mode `0o077`): the secret is only as private as the
    /// file. None when the file is private, not used or cannot be read (reading it reports that).
    pub fn secret_file_warning(&self) -> Option<String> {
        if !self.cluster_secret.is_empty() || self.cluster_secret_file.is_empty() {
            return None;
        }
        secret_file_mode_warning(std::path::Path::new(&self.cluster_secret_file))
    }

    /// The bearer token `/cluster` requires: the contents of `http_token_file` (surrounding
    /// whitespace trimmed), or `None` when the key is empty. Shorter than 16 bytes, or a token
    /// a header cannot carry, is a config error.
    pub fn http_token(&self) -> Result<Option<String>, ConfigError> {
        if self.http_token_file.is_empty() {
            return Ok(None);
        }
        let path = PathBuf::from(&self.http_token_file);
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::File {
            path: path.clone(),
            reason: format!("reading http_token_file: {e}"),
        })?;
        let token = text.trim();
        let printable = token.bytes().all(|b| b.is_ascii_graphic());
        if token.len() < peercache_wire::auth::MIN_SECRET_LEN || !printable {
            return Err(ConfigError::Invalid {
                key: "http_token_file",
                value: "<redacted>".into(),
                reason: format!(
                    "the token must be at least {} printable ASCII bytes without spaces \
                     (e.g. `openssl rand -hex 32`)",
                    peercache_wire::auth::MIN_SECRET_LEN
                ),
            });
        }
        Ok(Some(token.to_string()))
    }

    /// A warning when `http_token_file` can be read by its group or by other users.
    pub fn http_token_file_warning(&self) -> Option<String> {
        if self.http_token_file.is_empty() {
            return None;
        }
        secret_file_mode_warning(std::path::Path::new(&self.http_token_file))
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

/// A warning when the secret file at `path` is readable or writable by its group or by other
/// users; None when it is private (or cannot be inspected).
///
/// ```
/// let dir = std::env::temp_dir().join(format!("pc-secret-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let f = dir.join("secret");
/// std::fs::write(&f, "0123456789abcdef0123").unwrap();
/// use std::os::unix::fs::PermissionsExt;
/// std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
/// assert!(peercache_store::config::secret_file_mode_warning(&f).unwrap().contains("0644"));
/// std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
/// assert!(peercache_store::config::secret_file_mode_warning(&f).is_none());
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn secret_file_mode_warning(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "the cluster secret file {} has mode {mode:04o}: other users can read the secret \
             (chmod 600 it)",
            path.display()
        )
    })
}

/// The config keys that carry a secret: given on a command line (`--set`), they show in `ps`
/// to every local user.
pub const SECRET_KEYS: [&str; 2] = ["cluster_secret", "cluster_secret_accept"];

/// A warning naming each secret key in `overrides` (settings from the command line), with the
/// private ways to pass it; None when there is none.
///
/// ```
/// let set = peercache_store::config::parse_overrides(&["cluster_secret=x".into()]).unwrap();
/// assert!(peercache_store::config::argv_secret_warning(&set).unwrap().contains("ps"));
/// ```
pub fn argv_secret_warning(
    overrides: &serde_json::Map<String, serde_json::Value>,
) -> Option<String> {
    let named: Vec<&str> = SECRET_KEYS
        .into_iter()
        .filter(|k| overrides.contains_key(*k))
        .collect();
    (!named.is_empty()).then(|| {
        format!(
            "{} given on the command line: every local user sees it in ps; pass it in \
             PEERCACHE_CLUSTER_SECRET or a private cluster_secret_file instead",
            named.join(" and ")
        )
    })
}

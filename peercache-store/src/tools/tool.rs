//! Helpers shared by the `peercache-node` tool subcommands (`status`, `drive`, `locate`) and
//! the meta server binary, kept apart so the subcommands and the CLI that dispatches to them
//! do not use each other.

use crate::config::{ConfigError, PeerCacheConfig, Secret};

/// The cluster secret of a tool process: `file` if given, else `PEERCACHE_CLUSTER_SECRET`
/// (neither: no authentication).
///
/// ```
/// let auth = peercache_store::tools::tool::tool_auth(None).unwrap();
/// # let _ = auth;
/// ```
pub fn tool_auth(file: Option<&std::path::Path>) -> Result<peercache_wire::Auth, ConfigError> {
    let mut cfg = PeerCacheConfig::default();
    match file {
        Some(f) => cfg.cluster_secret_file = f.display().to_string(),
        None => {
            cfg.cluster_secret =
                Secret::new(std::env::var("PEERCACHE_CLUSTER_SECRET").unwrap_or_default())
        }
    }
    cfg.cluster_auth()
}

/// The bearer token a tool sends to the nodes' `/cluster` (`--http-token-file`, for nodes
/// started with `http_token_file`): the file's contents, trimmed, checked as a node checks it.
pub fn tool_http_token(file: Option<&std::path::Path>) -> Result<Option<String>, ConfigError> {
    let mut cfg = PeerCacheConfig::default();
    if let Some(f) = file {
        cfg.http_token_file = f.display().to_string();
    }
    cfg.http_token()
}

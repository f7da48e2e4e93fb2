//! `peercache-node read-only-token`: prints the read-only client token of the cluster secret,
//! for routers and tools that only read (they use it as their secret on the client API).

use anyhow::{Context, Result};

use crate::config::PeerCacheConfig;
use crate::config::Secret;

/// Options of `read-only-token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    /// File holding the cluster secret (else `PEERCACHE_CLUSTER_SECRET`).
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
}

/// Prints the token.
pub fn run(args: TokenArgs) -> Result<()> {
    let mut cfg = PeerCacheConfig::default();
    match &args.cluster_secret_file {
        Some(f) => cfg.cluster_secret_file = f.display().to_string(),
        None => {
            cfg.cluster_secret =
                Secret::new(std::env::var("PEERCACHE_CLUSTER_SECRET").unwrap_or_default())
        }
    }
    let token = cfg
        .read_only_token()?
        .context("no cluster secret: pass --cluster-secret-file or set PEERCACHE_CLUSTER_SECRET")?;
    println!("{token}");
    Ok(())
}

//! `peercache-storage-server`: `peercache-node` with storage-role defaults.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    peercache_store::cli::run_node(
        peercache_store::cli::NodeArgs::parse(),
        peercache_store::Role::Storage,
    )
}

//! `peercache-node`: one PeerCache node from a config file or flags.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    peercache_store::cli::run_node(
        peercache_store::cli::NodeArgs::parse(),
        peercache_store::Role::Inference,
    )
}

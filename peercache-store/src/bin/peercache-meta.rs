//! `peercache-meta`: a standalone discovery server.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    peercache_store::cli::run_meta(peercache_store::cli::MetaArgs::parse())
}

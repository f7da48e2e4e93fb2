//! `peercache-storage-server`: `peercache-node` with storage-role defaults.

use clap::Parser;

fn main() -> std::process::ExitCode {
    peercache_store::cli::report(peercache_store::cli::run_node(
        peercache_store::cli::NodeArgs::parse(),
        peercache_store::Role::Storage,
    ))
}

//! `peercache-storage-server`: `peercache-node` with storage-role defaults.

use clap::Parser;

fn main() -> std::process::ExitCode {
    peercache_store::tools::cli::report(peercache_store::tools::cli::run_node(
        peercache_store::tools::cli::NodeArgs::parse(),
        peercache_store::Role::Storage,
    ))
}

//! `peercache-node`: one PeerCache node from a config file or flags.

use clap::Parser;

fn main() -> std::process::ExitCode {
    peercache_store::cli::report(peercache_store::cli::run_node(
        peercache_store::cli::NodeArgs::parse(),
        peercache_store::Role::Inference,
    ))
}

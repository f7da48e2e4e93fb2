//! `peercache-meta`: a standalone discovery server.

use clap::Parser;

fn main() -> std::process::ExitCode {
    peercache_store::cli::report(peercache_store::cli::run_meta(
        peercache_store::cli::MetaArgs::parse(),
    ))
}

//! `peercache-meta`: a standalone discovery server.

use clap::Parser;

fn main() -> std::process::ExitCode {
    peercache_store::tools::cli::report(peercache_store::tools::cli::run_meta(
        peercache_store::tools::cli::MetaArgs::parse(),
    ))
}

//! The flags every measuring subcommand shares, declared once and flattened into each
//! subcommand's arguments. A subcommand that needs another default says so with
//! `#[command(mut_arg("rounds", |a| a.default_value("2")))]`, so `--help` shows its own.

use std::path::PathBuf;

/// How long and how often a row is measured, and where the results go.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Measured rounds per row; the report gives their median.
    #[arg(long, default_value_t = 3)]
    pub rounds: u64,
    /// Seconds per round.
    #[arg(long, visible_alias = "duration", default_value_t = 0.5, value_parser = peercache_store::tools::secs::positive_seconds)]
    pub secs: f64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The load of a row: pages per call and caller threads.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Pages per call.
    #[arg(long, visible_alias = "batch-size", default_value_t = 32)]
    pub batch: u64,
    /// Caller threads, one row each.
    #[command(flatten)]
    pub threads: Threads,
}

/// Caller threads, one row (or step) each: alone in subcommands whose calls have a shape of
/// their own (`drive`, whose request size its reader processes must agree on).
#[derive(clap::Args, Debug, Clone)]
pub struct Threads {
    /// Caller threads, one row each.
    #[arg(
        long,
        visible_alias = "concurrencies",
        value_delimiter = ',',
        default_value = "1,2,4"
    )]
    pub concurrency: Vec<u64>,
}

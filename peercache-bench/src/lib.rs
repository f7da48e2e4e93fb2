//! `peercache-bench`: the benchmark users run.
//!
//! Every subcommand ([`cmd`], one module each) prints a table and accepts `--json FILE` with the
//! result contract of [`report`]. [`load`] holds what they share: the row runner, the
//! workloads and the `raw-tcp` baseline ([`load::rawtcp`]), the one function every TCP row is
//! compared with.

pub mod cmd;
pub mod load;
pub mod report;

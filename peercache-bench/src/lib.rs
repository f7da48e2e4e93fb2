//! `peercache-bench`: the benchmark users run.
//!
//! Every subcommand prints a table and accepts `--json FILE` with the result contract of
//! [`report`]. The `raw-tcp` baseline ([`rawtcp`]) is the one function every TCP row is
//! compared with.

pub mod alloc;
pub mod breakdown;
pub mod charts;
pub mod child;
pub mod compare;
pub mod cuda;
pub mod devpool;
pub mod dirbench;
pub mod diskbench;
pub mod drive;
pub mod hist;
pub mod join;
pub mod latency;
pub mod mainjob;
pub mod micro;
pub mod modesbench;
pub mod mooncake;
pub mod poolbench;
pub mod progress;
pub mod rawtcp;
pub mod recovery;
pub mod replicabench;
pub mod report;
pub mod republish;
pub mod rows;
pub mod runner;
pub mod saturation;
pub mod scale;
pub mod secret;
pub mod serve;
pub mod sglwork;
pub mod startup;
pub mod suite;
pub mod throughput;
pub mod verbs_transport;
pub mod workload;

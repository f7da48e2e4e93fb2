//! What the subcommands share to put load on a cluster: the row runner and its flags, the
//! workloads (store loops and the SGLang-shaped one), the raw-TCP baseline, child processes,
//! the run's secret, the counting allocator, progress output and thread placement.

pub mod alloc;
pub mod child;
pub mod node;
pub mod placement;
pub mod progress;
pub mod rawtcp;
pub mod rows;
pub mod runner;
pub mod secret;
pub mod sglang;
pub mod sweep;
pub mod verbs_transport;
pub mod workload;

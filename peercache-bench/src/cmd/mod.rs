//! One module per subcommand, named as `peercache-bench --help` names it; the main job (no
//! subcommand) is [`main_job`].

pub mod compare;
pub mod directory;
pub mod disk;
pub mod drive;
pub mod latency;
pub mod main_job;
pub mod micro;
pub mod modes;
pub mod mooncake;
pub mod pool;
pub mod prefix;
pub mod replicas;
pub mod saturation;
pub mod scale;
pub mod serve;
pub mod startup;
pub mod suite;
pub mod throughput;

//! `peercache-bench`: the benchmark users run (see the library docs for the result contract).

use peercache_bench::cmd::{
    compare, directory as dirbench, disk as diskbench, drive, latency, main_job as mainjob, micro,
    modes as modesbench, mooncake, pool as poolbench, prefix as prefixbench,
    replicas as replicabench, saturation, scale, serve, startup, suite, throughput,
};
use peercache_bench::{load::alloc, report};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

#[derive(Parser, Debug)]
#[command(name = "peercache-bench", version, about = "PeerCache benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Log level: debug, info, warning (or warn), error (`RUST_LOG`, if set, wins).
    #[arg(long, global = true, default_value = "warning", value_parser = ["debug", "info", "warning", "warn", "error"])]
    log_level: String,
    /// Append the log to this file instead of standard error.
    #[arg(long, global = true)]
    log_file: Option<std::path::PathBuf>,
    /// The main job's options (used when no subcommand is given).
    #[command(flatten)]
    main: mainjob::MainArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Transport (raw-tcp, tcp-read, tcp-write) and, with `--path store|both`, store-get and
    /// store-set, between two processes.
    Micro(micro::MicroArgs),
    /// A router's prefix query of 64 keys on three nodes (store API and HTTP) beside raw TCP.
    Prefix(prefixbench::PrefixArgs),
    /// Pool publish against memcpy, and metadata-only allocate/evict/lookup rates.
    Pool(poolbench::PoolArgs),
    /// Directory: in-process shard lookups, loopback lookup/exists/insert, hand-off.
    Directory(dirbench::DirArgs),
    /// One directory shard at 1 M and 10 M keys: bytes per (key, owner), lookup and exists rates.
    Scale(scale::ScaleArgs),
    /// A node with a large pool: time to its first served read and to a warm pool, beside a
    /// parallel memset of the same size.
    Startup(startup::StartupArgs),
    /// Disk tier: write-through and promote against plain sequential file I/O.
    Disk(diskbench::DiskArgs),
    /// PeerCache get beside raw TCP and Mooncake Store (when available), interleaved.
    Compare(compare::CompareArgs),
    /// Mooncake Store alone beside raw TCP (the Mooncake half of `compare`; needs its venv).
    Mooncake(mooncake::MooncakeArgs),
    /// replicate_on_read on a hot-key workload; reads of pages only on another node's disk.
    Replicas(replicabench::ReplicaArgs),
    /// Every benchmark, each in its own process; one combined report.
    Suite(suite::SuiteArgs),
    /// Per-call latency of exists, get and set at several batch sizes, one caller (also of a
    /// node asking about and reading its own pages).
    Latency(latency::LatencyArgs),
    /// get throughput and p99 as caller threads grow; marks the peak; draws the curves.
    Saturation(saturation::SaturationArgs),
    /// set and get in each deployment mode (p2p, centralized, hybrid) side by side.
    Modes(modesbench::ModesArgs),
    /// SGLang-shaped prefetch (exists → get into host slots) and backup throughput: tokens/s.
    Throughput(throughput::ThroughputArgs),
    /// The prefetch workload from `--processes N` reader processes (or another host), merged.
    Drive(drive::DriveArgs),
    /// Internal: a reader process of `drive`.
    #[command(hide = true)]
    DriveReader(drive::ReaderArgs),
    /// One node that publishes `--preload` known pages, then serves until stopped.
    Serve(serve::ServeArgs),
    /// Internal: the serving child of `micro`.
    #[command(hide = true)]
    MicroServer {
        #[arg(long, default_value_t = 256)]
        region_mib: u64,
        /// Serve over RDMA on this verbs device too (`micro --protocol rdma`).
        #[arg(long)]
        rdma_device: Option<String>,
        #[arg(long, default_value_t = 3)]
        gid_index: i32,
        #[arg(long, default_value_t = 1)]
        ib_port: u8,
    },
}

fn main() -> std::process::ExitCode {
    // One line with the cause chain on failure, never a backtrace.
    peercache_store::tools::cli::report(run())
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log_level, cli.log_file.as_deref())?;
    if report::BUILD_PROFILE == "debug" {
        eprintln!(
            "warning: peercache-bench was built without optimizations (a debug build): its \
             figures are not comparable; run `cargo run --release -p peercache-bench`"
        );
    }
    match cli.cmd {
        Some(Cmd::MicroServer {
            region_mib,
            rdma_device,
            gid_index,
            ib_port,
        }) => {
            let device =
                rdma_device.map(
                    |device| peercache_bench::load::verbs_transport::VerbsDevice {
                        device,
                        gid_index,
                        ib_port,
                    },
                );
            micro::serve(region_mib, device.as_ref())
        }
        Some(Cmd::Serve(args)) => serve::run(&args),
        Some(Cmd::Compare(args)) => finish(compare::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Mooncake(args)) => finish(mooncake::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Replicas(args)) => finish(replicabench::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Suite(args)) => finish(suite::run(&args)?, args.json.as_deref()),
        Some(Cmd::Latency(args)) => finish(latency::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Saturation(args)) => finish(saturation::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Drive(args)) => match drive::run(&args)? {
            Some(r) => finish(r, args.run.json.as_deref()),
            None => Ok(()),
        },
        Some(Cmd::DriveReader(args)) => drive::reader(&args),
        Some(Cmd::Throughput(args)) => finish(throughput::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Modes(args)) => finish(modesbench::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Micro(args)) => finish(micro::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Directory(args)) => finish(dirbench::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Scale(args)) => finish(scale::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Startup(args)) => finish(startup::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Disk(args)) => finish(diskbench::run(&args)?, args.json.as_deref()),
        Some(Cmd::Pool(args)) => finish(poolbench::run(&args)?, args.run.json.as_deref()),
        Some(Cmd::Prefix(args)) => finish(prefixbench::run(&args)?, args.run.json.as_deref()),
        None => {
            eprintln!(
                "peercache-bench main job: embedded two-node cluster on loopback, {}",
                cli.main.describe()
            );
            finish(mainjob::run(&cli.main)?, cli.main.run.json.as_deref())
        }
    }
}

/// Logs to standard error, or appended to `file`, at `level` unless `RUST_LOG` says otherwise.
fn init_logging(level: &str, file: Option<&std::path::Path>) -> Result<()> {
    let level = if level == "warning" { "warn" } else { level };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("--log-file {}", path.display()))?;
            builder
                .with_writer(std::sync::Mutex::new(f))
                .with_ansi(false)
                .init();
        }
        None => builder
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    Ok(())
}

fn finish(report: report::Report, json: Option<&std::path::Path>) -> Result<()> {
    report.print_table();
    println!(
        "summary: {}",
        serde_json::to_string_pretty(&report.summary)?
    );
    if let Some(p) = json {
        report.write_json(p)?;
        eprintln!("wrote {}", p.display());
    }
    // Every run also leaves its results beside the caller, as JSON and Markdown.
    let (j, m) = report.write_results(std::path::Path::new("peercache-bench-results"))?;
    eprintln!("results in {} and {}", j.display(), m.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_subcommand_declares_each_flag_once() {
        // Duplicate ids (a flattened flag also declared by the subcommand) fail here.
        super::Cli::command().debug_assert();
    }
}

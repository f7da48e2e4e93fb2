//! Each subcommand's CLI keeps its own defaults while sharing the run and load flags
//! (`peercache_bench::load::rows`), and the shared flags' aliases parse.
use clap::Parser;

#[derive(Parser)]
struct Wrap<T: clap::Args> {
    #[command(flatten)]
    args: T,
}

fn defaults<T: clap::Args>() -> T {
    Wrap::<T>::try_parse_from(["bench"]).unwrap().args
}

#[test]
fn each_subcommand_keeps_its_own_defaults() {
    let m: peercache_bench::cmd::main_job::MainArgs = defaults();
    assert_eq!((m.run.rounds, m.run.secs), (3, 0.5));
    assert_eq!(
        (m.load.batch, m.load.threads.concurrency),
        (32, vec![1, 2, 4])
    );
    let s: peercache_bench::cmd::saturation::SaturationArgs = defaults();
    assert_eq!(s.run.rounds, 2);
    assert_eq!(s.load.threads.concurrency, [1, 2, 4, 8, 16]);
    let modes: peercache_bench::cmd::modes::ModesArgs = defaults();
    assert_eq!(
        (modes.run.rounds, modes.load.threads.concurrency),
        (2, vec![1, 2])
    );
    let c: peercache_bench::cmd::compare::CompareArgs = defaults();
    assert_eq!((c.run.rounds, c.load.threads.concurrency), (3, vec![1, 2]));
    let p: peercache_bench::cmd::pool::PoolArgs = defaults();
    assert_eq!(p.run.secs, 1.0);
    let l: peercache_bench::cmd::latency::LatencyArgs = defaults();
    assert_eq!(l.run.rounds, 2);
    let t: peercache_bench::cmd::throughput::ThroughputArgs = defaults();
    assert_eq!((t.run.rounds, t.run.secs), (2, 1.0));
    assert_eq!(
        (t.batch_size(), t.load.threads.concurrency),
        (32, vec![1, 2, 4])
    );
    let d: peercache_bench::cmd::drive::DriveArgs = defaults();
    assert_eq!((d.run.rounds, d.run.secs), (2, 1.0));
    assert_eq!(d.threads.concurrency, [1, 2]);
}

#[test]
fn drive_and_throughput_take_the_shared_flags_and_their_old_names() {
    // The soft-RoCE stage's command line (scripts/rdma-verbs-guest.sh) and 0.8.4's names.
    let d = Wrap::<peercache_bench::cmd::drive::DriveArgs>::try_parse_from([
        "bench",
        "--concurrencies",
        "1",
        "--rounds",
        "1",
        "--duration",
        "0.5",
        "--json",
        "/tmp/d.json",
    ])
    .unwrap()
    .args;
    assert_eq!(
        (d.threads.concurrency, d.run.rounds, d.run.secs),
        (vec![1], 1, 0.5)
    );
    assert_eq!(
        d.run.json.as_deref(),
        Some(std::path::Path::new("/tmp/d.json"))
    );
    let t = Wrap::<peercache_bench::cmd::throughput::ThroughputArgs>::try_parse_from([
        "bench",
        "--batch-size",
        "8",
        "--concurrency",
        "2,4",
        "--secs",
        "0.3",
    ])
    .unwrap()
    .args;
    assert_eq!(
        (t.batch_size(), t.load.threads.concurrency),
        (8, vec![2, 4])
    );
    assert_eq!(t.run.secs, 0.3);
}

#[test]
fn the_shared_flags_and_their_aliases_parse() {
    let m = Wrap::<peercache_bench::cmd::main_job::MainArgs>::try_parse_from([
        "bench",
        "--batch-size",
        "8",
        "--concurrencies",
        "1,8",
        "--duration",
        "0.1",
        "--rounds",
        "5",
        "--json",
        "/tmp/x.json",
    ])
    .unwrap()
    .args;
    assert_eq!((m.load.batch, m.load.threads.concurrency), (8, vec![1, 8]));
    assert_eq!((m.run.secs, m.run.rounds), (0.1, 5));
    assert_eq!(
        m.run.json.as_deref(),
        Some(std::path::Path::new("/tmp/x.json"))
    );
    assert!(
        Wrap::<peercache_bench::cmd::main_job::MainArgs>::try_parse_from([
            "bench", "--rounds", "many"
        ])
        .is_err()
    );
}

#[test]
fn seconds_that_are_negative_nan_or_zero_are_refused_before_anything_runs() {
    use peercache_bench::cmd::{drive::DriveArgs, main_job::MainArgs, throughput::ThroughputArgs};
    for bad in ["-1", "nan", "inf", "0", "1e300", "soon"] {
        let flag = format!("--secs={bad}");
        assert!(
            Wrap::<MainArgs>::try_parse_from(["bench", flag.as_str()]).is_err(),
            "{flag}"
        );
    }
    for bad in ["-1", "nan", "1e300"] {
        let flag = format!("--warmup={bad}");
        assert!(Wrap::<DriveArgs>::try_parse_from(["bench", flag.as_str()]).is_err());
        assert!(Wrap::<ThroughputArgs>::try_parse_from(["bench", flag.as_str()]).is_err());
    }
    // A warm-up may be skipped; a measuring window may not.
    let d = Wrap::<DriveArgs>::try_parse_from(["bench", "--warmup", "0"]).unwrap();
    assert_eq!(d.args.warmup, 0.0);
}

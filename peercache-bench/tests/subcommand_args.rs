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
    assert_eq!((m.load.batch, m.load.concurrency), (32, vec![1, 2, 4]));
    let s: peercache_bench::cmd::saturation::SaturationArgs = defaults();
    assert_eq!(s.run.rounds, 2);
    assert_eq!(s.load.concurrency, [1, 2, 4, 8, 16]);
    let modes: peercache_bench::cmd::modes::ModesArgs = defaults();
    assert_eq!((modes.run.rounds, modes.load.concurrency), (2, vec![1, 2]));
    let c: peercache_bench::cmd::compare::CompareArgs = defaults();
    assert_eq!((c.run.rounds, c.load.concurrency), (3, vec![1, 2]));
    let p: peercache_bench::cmd::pool::PoolArgs = defaults();
    assert_eq!(p.run.secs, 1.0);
    let l: peercache_bench::cmd::latency::LatencyArgs = defaults();
    assert_eq!(l.run.rounds, 2);
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
    assert_eq!((m.load.batch, m.load.concurrency), (8, vec![1, 8]));
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

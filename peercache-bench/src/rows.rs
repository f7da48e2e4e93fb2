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
    #[arg(long, visible_alias = "duration", default_value_t = 0.5)]
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
    #[arg(
        long,
        visible_alias = "concurrencies",
        value_delimiter = ',',
        default_value = "1,2,4"
    )]
    pub concurrency: Vec<u64>,
}

#[cfg(test)]
mod tests {
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
        let m: crate::mainjob::MainArgs = defaults();
        assert_eq!((m.run.rounds, m.run.secs), (3, 0.5));
        assert_eq!((m.load.batch, m.load.concurrency), (32, vec![1, 2, 4]));
        let s: crate::saturation::SaturationArgs = defaults();
        assert_eq!(s.run.rounds, 2);
        assert_eq!(s.load.concurrency, [1, 2, 4, 8, 16]);
        let modes: crate::modesbench::ModesArgs = defaults();
        assert_eq!((modes.run.rounds, modes.load.concurrency), (2, vec![1, 2]));
        let c: crate::compare::CompareArgs = defaults();
        assert_eq!((c.run.rounds, c.load.concurrency), (3, vec![1, 2]));
        let p: crate::poolbench::PoolArgs = defaults();
        assert_eq!(p.run.secs, 1.0);
        let l: crate::latency::LatencyArgs = defaults();
        assert_eq!(l.run.rounds, 2);
    }

    #[test]
    fn the_shared_flags_and_their_aliases_parse() {
        let m = Wrap::<crate::mainjob::MainArgs>::try_parse_from([
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
            Wrap::<crate::mainjob::MainArgs>::try_parse_from(["bench", "--rounds", "many"])
                .is_err()
        );
    }
}

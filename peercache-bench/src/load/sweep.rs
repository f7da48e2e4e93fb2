//! The grid every measuring subcommand walks: rounds × caller threads, one [`Cell`] per pair
//! (rounds outermost, so a row's rounds interleave with the other rows), each cell measuring
//! its rows with the shared timing, and one progress line per cell.

use anyhow::{Context, Result};

use crate::load::progress::Progress;
use crate::load::rows::{LoadArgs, RunArgs};
use crate::load::runner::{CallOutcome, Timing, run_row};
use crate::report::{self, Row};

/// One subcommand's rounds × caller-threads grid, its row shape and its timing.
pub struct Sweep {
    label: String,
    rounds: u64,
    threads: Vec<u64>,
    page_bytes: u64,
    batch: u64,
    /// Warm-up and measured time of each row (100 ms, then `--secs`).
    pub timing: Timing,
}

impl Sweep {
    /// `run.rounds` × `load.threads.concurrency` cells of rows of `page_bytes`-byte pages,
    /// `load.batch` per call; an empty thread list is an error.
    pub fn new(label: &str, run: &RunArgs, load: &LoadArgs, page_bytes: u64) -> Result<Sweep> {
        Sweep::of(
            label,
            run.rounds,
            &load.threads.concurrency,
            page_bytes,
            load.batch,
            run.secs,
        )
    }

    /// A sweep of `rounds` × `threads` cells from explicit values (subcommands with flags of
    /// their own).
    pub fn of(
        label: &str,
        rounds: u64,
        threads: &[u64],
        page_bytes: u64,
        batch: u64,
        secs: f64,
    ) -> Result<Sweep> {
        threads
            .iter()
            .max()
            .context("no caller thread count given (--concurrency)")?;
        Ok(Sweep {
            label: label.to_string(),
            rounds,
            threads: threads.to_vec(),
            page_bytes,
            batch,
            timing: Timing {
                warmup: std::time::Duration::from_millis(100),
                measure: std::time::Duration::from_secs_f64(secs),
            },
        })
    }

    /// The most caller threads of any cell (buffers sized for every thread).
    pub fn max_threads(&self) -> usize {
        self.threads.iter().copied().max().unwrap_or(1) as usize
    }

    /// Runs `cell` once per (round, threads) — rounds outermost — keeping the rows it measures
    /// in `rows`, with a progress line after each cell. Stops at the first error.
    pub fn run(
        &self,
        rows: &mut Vec<Row>,
        mut cell: impl FnMut(&mut Cell<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut progress = Progress::new(&self.label, self.rounds as usize * self.threads.len());
        for round in 0..self.rounds {
            for &threads in &self.threads {
                cell(&mut Cell {
                    round,
                    threads,
                    sweep: self,
                    rows,
                })?;
                progress.step(&format!(
                    "round {round}, {threads} thread(s) (load {:.2})",
                    report::load_1m()
                ));
            }
        }
        Ok(())
    }
}

/// Rounds of rows a subcommand measures itself (each row names its own page size, batch and
/// timing): one [`Kept`] per round, which keeps rows and measures none.
pub struct Rounds {
    label: String,
    rounds: u64,
}

impl Rounds {
    /// `rounds` rounds, reported under `label`.
    pub fn new(label: &str, rounds: u64) -> Rounds {
        Rounds {
            label: label.to_string(),
            rounds,
        }
    }

    /// Runs `round` once per round, keeping the rows it pushes in `rows`, with a progress line
    /// after each. Stops at the first error.
    pub fn run(
        &self,
        rows: &mut Vec<Row>,
        mut round: impl FnMut(&mut Kept<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut progress = Progress::new(&self.label, self.rounds as usize);
        for r in 0..self.rounds {
            round(&mut Kept { round: r, rows })?;
            progress.step(&format!("round {r} (load {:.2})", report::load_1m()));
        }
        Ok(())
    }
}

/// One round of [`Rounds`]: keeps the rows measured in it.
pub struct Kept<'a> {
    /// The round (0-based).
    pub round: u64,
    rows: &'a mut Vec<Row>,
}

impl Kept<'_> {
    /// Keeps a row; the kept row.
    pub fn push(&mut self, row: Row) -> &mut Row {
        self.rows.push(row);
        self.rows.last_mut().expect("just pushed")
    }
}

/// One (round, threads) pair of a [`Sweep`]: measures rows and keeps them.
pub struct Cell<'a> {
    /// The round (0-based).
    pub round: u64,
    /// Caller threads of this cell's rows.
    pub threads: u64,
    sweep: &'a Sweep,
    rows: &'a mut Vec<Row>,
}

impl Cell<'_> {
    /// `c<threads>/r<round>`: the cell's name in a report's extra figures.
    pub fn tag(&self) -> String {
        format!("c{}/r{}", self.threads, self.round)
    }

    /// The sweep's timing.
    pub fn timing(&self) -> &Timing {
        &self.sweep.timing
    }

    /// Measures a row named `name` (`make(thread)` builds each thread's caller) with `timing`,
    /// without keeping it.
    pub fn measure<F, W>(&self, name: &str, timing: &Timing, make: F) -> Row
    where
        F: Fn(usize) -> W,
        W: FnMut() -> CallOutcome + Send + 'static,
    {
        run_row(
            name,
            self.sweep.page_bytes,
            self.sweep.batch,
            self.threads,
            self.round,
            timing,
            make,
        )
    }

    /// Measures a row named `name` with the sweep's timing and keeps it; the kept row, for
    /// figures the caller adds.
    pub fn row<F, W>(&mut self, name: &str, make: F) -> &mut Row
    where
        F: Fn(usize) -> W,
        W: FnMut() -> CallOutcome + Send + 'static,
    {
        let row = self.measure(name, &self.sweep.timing, make);
        self.push(row)
    }

    /// Keeps a row measured otherwise; the kept row.
    pub fn push(&mut self, row: Row) -> &mut Row {
        self.rows.push(row);
        self.rows.last_mut().expect("just pushed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_walk_rounds_outermost_and_keep_their_rows() {
        let sweep = Sweep::of("t", 2, &[1, 2], 64, 4, 0.01).unwrap();
        assert_eq!(sweep.max_threads(), 2);
        let mut rows = Vec::new();
        let mut seen = Vec::new();
        sweep
            .run(&mut rows, |cell| {
                seen.push(cell.tag());
                let r = cell.row("x", |_| || CallOutcome::done(4, 0, false));
                assert_eq!((r.page_bytes, r.batch), (64, 4));
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, ["c1/r0", "c2/r0", "c1/r1", "c2/r1"]);
        assert_eq!(rows.len(), 4);
        assert!(rows.iter().all(|r| r.pages_per_s > 0.0));
        assert_eq!((rows[3].concurrency, rows[3].round), (2, 1));
    }

    #[test]
    fn rounds_keep_what_each_round_pushes() {
        let mut rows = Vec::new();
        let mut seen = Vec::new();
        Rounds::new("t", 3)
            .run(&mut rows, |r| {
                seen.push(r.round);
                let round = r.round;
                r.push(Row::empty("x")).round = round;
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, [0, 1, 2]);
        assert_eq!(rows.iter().map(|r| r.round).collect::<Vec<_>>(), [0, 1, 2]);
    }

    #[test]
    fn no_thread_count_is_an_error() {
        assert!(Sweep::of("t", 1, &[], 64, 4, 0.01).is_err());
    }
}

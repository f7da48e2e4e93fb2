//! The bench result contract shared by every subcommand.
//!
//! `{"bench", "host": {cpus, model, kernel, load_1m, profile}, "config": {...}, "results": [ROW]}`.
//! Units: a page is all components of one key; latency is per batch call in microseconds;
//! concurrency is caller threads, each with one batch in flight; GB = 10^9 bytes.

pub mod charts;
pub mod hist;

use serde::Serialize;

/// Facts about the machine and the build a run happened on.
#[derive(Clone, Debug, Serialize)]
pub struct Host {
    /// The build profile of the bench binary: `release`, or `debug` (figures of a debug build
    /// are not comparable with anything).
    pub profile: &'static str,
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU model name.
    pub model: String,
    /// Kernel release.
    pub kernel: String,
    /// 1-minute load average at report time.
    pub load_1m: f64,
}

impl Host {
    /// Reads the host facts from `/proc`.
    pub fn detect() -> Host {
        let model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Host {
            profile: BUILD_PROFILE,
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            model,
            kernel,
            load_1m: load_1m(),
        }
    }
}

/// The build profile of this binary: `debug` when compiled with debug assertions (the
/// default of `cargo run` without `--release`), else `release`.
pub const BUILD_PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The current 1-minute load average.
pub fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(0.0)
}

/// One measured row.
#[derive(Clone, Debug, Serialize, serde::Deserialize, Default)]
pub struct Row {
    /// Row name (`raw-tcp`, `tcp-read`, …).
    pub name: String,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Pages per batch call.
    pub batch: u64,
    /// Caller threads.
    pub concurrency: u64,
    /// Pages per second.
    pub pages_per_s: f64,
    /// 10^9 bytes per second.
    pub gb_per_s: f64,
    /// Batch latency percentiles, µs.
    pub p50_us: f64,
    /// 95th percentile, µs.
    pub p95_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Tokens per second (pages × tokens per page), 0 where not meaningful.
    pub tokens_per_s: f64,
    /// Pages found, percent (100 for rows that do not look anything up).
    pub hit_pct: f64,
    /// Failed calls.
    pub errors: u64,
    /// Interleaving round this row belongs to.
    pub round: u64,
}

impl Row {
    /// A row of `name` with every figure zero (and nothing missed), for rows filled in by hand.
    pub fn empty(name: &str) -> Row {
        Row {
            name: name.into(),
            page_bytes: 0,
            batch: 0,
            concurrency: 1,
            pages_per_s: 0.0,
            gb_per_s: 0.0,
            p50_us: 0.0,
            p95_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            max_us: 0.0,
            tokens_per_s: 0.0,
            hit_pct: 100.0,
            errors: 0,
            round: 0,
        }
    }

    /// A single-caller row of `name`: `pages` pages of `page_bytes` bytes (`batch` per call)
    /// moved in `secs`, its latency figures from `h` (µs); nothing missed, no error.
    pub fn measured(
        name: &str,
        page_bytes: u64,
        batch: u64,
        pages: u64,
        secs: f64,
        h: &hdrhistogram::Histogram<u64>,
    ) -> Row {
        let secs = secs.max(1e-9);
        let (p50_us, p95_us, p99_us, p999_us, max_us) = hist::percentiles(h);
        Row {
            page_bytes,
            batch,
            pages_per_s: pages as f64 / secs,
            gb_per_s: pages as f64 * page_bytes as f64 / secs / 1e9,
            p50_us,
            p95_us,
            p99_us,
            p999_us,
            max_us,
            ..Row::empty(name)
        }
    }
}

/// A whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Subcommand name.
    pub bench: String,
    /// Host facts.
    pub host: Host,
    /// The run's configuration.
    pub config: serde_json::Value,
    /// Rows in measurement order.
    pub results: Vec<Row>,
    /// Derived figures (ratios of medians and the like).
    pub summary: serde_json::Value,
}

/// The columns the Markdown and terminal tables show of each row.
const SHOWN: [&str; 11] = [
    "row", "page", "batch", "conc", "round", "pages/s", "GB/s", "p50 µs", "p99 µs", "max µs",
    "errors",
];
/// The terminal table's column widths after the first (the row name, 14 wide).
const SHOWN_WIDTHS: [usize; 10] = [9, 5, 4, 5, 12, 8, 9, 9, 9, 6];

impl Row {
    /// The [`SHOWN`] columns of this row, formatted (pages/s whole, GB/s to 1 MB/s, latencies
    /// to 0.1 µs).
    fn shown(&self) -> [String; 11] {
        [
            self.name.clone(),
            self.page_bytes.to_string(),
            self.batch.to_string(),
            self.concurrency.to_string(),
            self.round.to_string(),
            format!("{:.0}", self.pages_per_s),
            format!("{:.3}", self.gb_per_s),
            format!("{:.1}", self.p50_us),
            format!("{:.1}", self.p99_us),
            format!("{:.1}", self.max_us),
            self.errors.to_string(),
        ]
    }
}

impl Report {
    /// Writes the report as pretty JSON.
    pub fn write_json(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")?;
        Ok(())
    }

    /// The report as Markdown: configuration, the rows as a table, the summary.
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "# peercache-bench {}\n\nHost: {} CPUs, load {:.2} at the start; {} build.\n\n\
             Configuration: `{}`\n\n| {} |\n|---{}|\n",
            self.bench,
            self.host.cpus,
            self.host.load_1m,
            self.host.profile,
            self.config,
            SHOWN.join(" | "),
            "|---:".repeat(SHOWN.len() - 1)
        );
        for r in &self.results {
            s += &format!("| {} |\n", r.shown().join(" | "));
        }
        s += "\n## Summary\n\n```json\n";
        s += &serde_json::to_string_pretty(&self.summary).unwrap_or_default();
        s += "\n```\n";
        s
    }

    /// Writes `<bench>.json` and `<bench>.md` into `dir` (created if needed); returns the paths.
    pub fn write_results(
        &self,
        dir: &std::path::Path,
    ) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf)> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join(format!("{}.json", self.bench));
        let md = dir.join(format!("{}.md", self.bench));
        self.write_json(&json)?;
        std::fs::write(&md, self.to_markdown())?;
        Ok((json, md))
    }

    /// Prints the rows as a table.
    pub fn print_table(&self) {
        let line = |cells: &[&str]| {
            let mut out = format!("{:<14}", cells[0]);
            for (c, w) in cells[1..].iter().zip(SHOWN_WIDTHS) {
                out += &format!(" {c:>w$}");
            }
            println!("{out}");
        };
        line(&SHOWN);
        for r in &self.results {
            let cells = r.shown();
            line(&cells.each_ref().map(String::as_str));
        }
    }
}

/// Median of `f` over the rows named `name` (NaN when there are none).
pub fn median_of(rows: &[Row], name: &str, f: impl Fn(&Row) -> f64) -> f64 {
    median(rows.iter().filter(|r| r.name == name).map(f).collect())
}

/// Median of a list (NaN for an empty list).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median over rounds and concurrencies of `row ÷ baseline` at the same
/// (page size, concurrency, round), by GB/s.
pub fn ratio_of_medians(rows: &[Row], name: &str, baseline: &str, page_bytes: u64) -> f64 {
    let ratios = rows
        .iter()
        .filter(|r| r.name == name && r.page_bytes == page_bytes)
        .filter_map(|r| {
            rows.iter()
                .find(|b| {
                    b.name == baseline
                        && b.page_bytes == page_bytes
                        && b.concurrency == r.concurrency
                        && b.round == r.round
                })
                .filter(|b| b.gb_per_s > 0.0)
                .map(|b| r.gb_per_s / b.gb_per_s)
        })
        .collect();
    median(ratios)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_ratio() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let row = |name: &str, c, round, gb| Row {
            name: name.into(),
            page_bytes: 4096,
            concurrency: c,
            round,
            gb_per_s: gb,
            ..Row::default()
        };
        let rows = vec![
            row("raw-tcp", 1, 0, 2.0),
            row("tcp-read", 1, 0, 1.0),
            row("raw-tcp", 2, 0, 4.0),
            row("tcp-read", 2, 0, 4.0),
            row("raw-tcp", 1, 1, 1.0),
            row("tcp-read", 1, 1, 0.9),
        ];
        assert!((ratio_of_medians(&rows, "tcp-read", "raw-tcp", 4096) - 0.9).abs() < 1e-9);
    }

    #[test]
    fn report_serializes_to_the_contract() {
        let r = Report {
            bench: "micro".into(),
            host: Host::detect(),
            config: serde_json::json!({"k": 1}),
            results: vec![Row::default()],
            summary: serde_json::json!({}),
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        for k in ["bench", "host", "config", "results"] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        for k in ["cpus", "model", "kernel", "load_1m"] {
            assert!(v["host"].get(k).is_some(), "missing host.{k}");
        }
        let row = &v["results"][0];
        for k in [
            "name",
            "page_bytes",
            "batch",
            "concurrency",
            "pages_per_s",
            "gb_per_s",
            "p50_us",
            "p95_us",
            "p99_us",
            "p999_us",
            "max_us",
            "tokens_per_s",
            "hit_pct",
            "errors",
            "round",
        ] {
            assert!(row.get(k).is_some(), "missing row.{k}");
        }
    }
}

//! Progress of a run on stderr: a bar redrawn in place on a terminal, one plain line per step
//! otherwise (CI logs, pipes).

use std::io::{IsTerminal, Write};
use std::time::Instant;

/// A run of `total` steps.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: usize,
    done: usize,
    tty: bool,
    started: Instant,
}

impl Progress {
    /// Starts a run of `total` steps labelled `label`.
    pub fn new(label: &str, total: usize) -> Progress {
        Progress {
            label: label.to_string(),
            total: total.max(1),
            done: 0,
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    /// Marks one step done, described by `what`.
    pub fn step(&mut self, what: &str) {
        self.done = (self.done + 1).min(self.total);
        let line = self.render(what);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{line}");
            if self.done == self.total {
                let _ = writeln!(err);
            }
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    /// The progress line after the current step.
    pub fn render(&self, what: &str) -> String {
        const WIDTH: usize = 24;
        let filled = WIDTH * self.done / self.total;
        format!(
            "{} [{}{}] {}/{} {:.0}s {}",
            self.label,
            "=".repeat(filled),
            " ".repeat(WIDTH - filled),
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64(),
            what
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_steps() {
        let mut p = Progress::new("main", 4);
        p.tty = false;
        p.done = 2;
        let line = p.render("round 1");
        assert!(
            line.starts_with("main [============            ] 2/4"),
            "{line}"
        );
        assert!(line.ends_with("round 1"));
    }
}

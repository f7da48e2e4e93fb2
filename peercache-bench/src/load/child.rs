//! A child process of this bench (a reader, an owner, a serving node) driven over its standard
//! input and output, one line at a time.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};

/// One child process with a line reader on its stdout.
pub struct ChildProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// What log lines and errors call it.
    pub name: String,
}

impl ChildProc {
    /// Starts this executable with `args` (and the run's cluster secret in its environment).
    pub fn spawn(name: String, args: &[String]) -> Result<ChildProc> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .env(crate::load::secret::ENV, crate::load::secret::generated())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        let out = child.stdout.take().context("child stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Ok(ChildProc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            name,
        })
    }

    /// The next stdout line, waiting at most `t`.
    pub fn line(&self, t: Duration) -> Result<String> {
        self.lines
            .recv_timeout(t)
            .with_context(|| format!("{} did not answer within {t:?}", self.name))
    }

    /// Writes one line to the child's standard input.
    pub fn send(&mut self, s: &str) -> Result<()> {
        let w = self.stdin.as_mut().context("child stdin closed")?;
        writeln!(w, "{s}")?;
        w.flush()?;
        Ok(())
    }
}

/// Closes the child's input (it stops at end of input), then waits up to 10 s before killing it.
impl Drop for ChildProc {
    fn drop(&mut self) {
        drop(self.stdin.take()); // the child stops at end of input
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

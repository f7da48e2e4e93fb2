//! Where the cluster secret can leak, as an operator meets it with the real binaries: a secret
//! given with `--set` (visible in `ps`) and a secret file other users can read are each warned
//! about, without the secret itself ever being printed; `peercache-meta` without a secret
//! follows the node's rule (loopback only, unless `--insecure`).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

fn bin(name: &str) -> Command {
    let path = match name {
        "node" => env!("CARGO_BIN_EXE_peercache-node"),
        _ => env!("CARGO_BIN_EXE_peercache-meta"),
    };
    let mut c = Command::new(path);
    c.env("RUST_BACKTRACE", "0")
        .env("RUST_LOG", "info")
        .env_remove("PEERCACHE_CLUSTER_SECRET")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

/// A running process whose stderr lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads stderr until a line contains `what`, at most `limit`; every line read is kept.
    fn wait_for(&mut self, what: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(what);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
        false
    }

    /// Waits for the process to exit, at most `limit` (killed and failed past it).
    fn exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // The rest of stderr, now that the writer is gone.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(2)) {
                    self.seen.push(line);
                }
                return st;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the process did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn text(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn secret_file(dir: &std::path::Path, mode: u32) -> std::path::PathBuf {
    let f = dir.join(format!("secret-{mode:o}"));
    std::fs::write(&f, common::secret()).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    f
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pc-secrets-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_secret_on_the_command_line_is_warned_about_and_never_printed() {
    let mut cmd = bin("node");
    cmd.args(["--host", "127.0.0.31", "--discovery-addr", "127.0.0.31:1"])
        .args(["--set", &format!("cluster_secret={}", common::secret())])
        // A bad value ends the start right after the settings are read.
        .args(["--set", "global_segment_size=lots"]);
    let mut p = Running::spawn(cmd);
    let st = p.exit(Duration::from_secs(20));
    let text = p.text();
    assert!(!st.success(), "{text}");
    assert!(
        text.contains("warning: cluster_secret given on the command line")
            && text.contains("PEERCACHE_CLUSTER_SECRET"),
        "{text}"
    );
    assert!(
        !text.contains(common::secret()),
        "the secret leaked: {text}"
    );
}

#[test]
fn a_secret_file_other_users_can_read_is_warned_about_by_the_node_and_the_meta_server() {
    let dir = temp_dir("mode");
    let shared = secret_file(&dir, 0o644);
    let private = secret_file(&dir, 0o600);
    // The meta server with a shared file warns, then serves.
    let port = common::free_port();
    let mut cmd = bin("meta");
    cmd.args(["--bind", &format!("127.0.0.32:{port}")])
        .arg("--cluster-secret-file")
        .arg(&shared);
    let mut meta = Running::spawn(cmd);
    assert!(
        meta.wait_for("peercache-meta serving", Duration::from_secs(20)),
        "{}",
        meta.text()
    );
    assert!(meta.text().contains("mode 0644"), "{}", meta.text());
    assert!(!meta.text().contains(common::secret()), "{}", meta.text());
    // A node with the shared file warns; with the private one it does not.
    for (file, warned) in [(&shared, true), (&private, false)] {
        let port = common::free_port();
        let mut cmd = bin("node");
        cmd.args(["--host", "127.0.0.32"])
            .args(["--discovery-addr", &format!("127.0.0.32:{port}")])
            .args(["--set", "global_segment_size=16mb"])
            .args(["--set", &format!("cluster_secret_file={}", file.display())]);
        let mut node = Running::spawn(cmd);
        assert!(
            node.wait_for("node ready", Duration::from_secs(30)),
            "{}",
            node.text()
        );
        let text = node.text();
        assert_eq!(
            text.contains("has mode 0644"),
            warned,
            "{}: {text}",
            file.display()
        );
        assert!(
            !text.contains(common::secret()),
            "the secret leaked: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_meta_server_without_a_secret_serves_on_loopback_only_unless_insecure() {
    // Beyond loopback without a secret: refused with one line naming the ways out.
    let port = common::free_port();
    let mut cmd = bin("meta");
    cmd.args(["--bind", &format!("0.0.0.0:{port}")]);
    let mut open = Running::spawn(cmd);
    let st = open.exit(Duration::from_secs(20));
    let text = open.text();
    assert!(!st.success(), "{text}");
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(
        errors[0].contains("--insecure") && errors[0].contains("PEERCACHE_CLUSTER_SECRET"),
        "{text}"
    );
    // On loopback it serves, with a warning; beyond it with --insecure too.
    for (bind, extra) in [
        (format!("127.0.0.33:{}", common::free_port()), None),
        (
            format!("0.0.0.0:{}", common::free_port()),
            Some("--insecure"),
        ),
    ] {
        let mut cmd = bin("meta");
        cmd.args(["--bind", &bind]).args(extra);
        let mut meta = Running::spawn(cmd);
        assert!(
            meta.wait_for("peercache-meta serving", Duration::from_secs(20)),
            "{bind}: {}",
            meta.text()
        );
        assert!(meta.text().contains("no cluster secret"), "{}", meta.text());
    }
}

//! `peercache-node cert`: the per-node credentials (`docs/security.md`). `init` makes the
//! cluster's signing key (keep it offline) and its public key (every node's
//! `cluster_ca_file`); `issue` makes a node's key and a certificate for its node id, or for an
//! id prefix ending in `*`.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use peercache_wire::identity::{SigningKey, public_key_to_text};

/// `peercache-node cert` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum CertCommand {
    /// Make the cluster's signing key (`cluster.key`, 0600: keep it offline) and its public key
    /// (`cluster.pub`: give it to every node as `cluster_ca_file`).
    Init {
        /// Folder to write them into (created 0700; existing files are never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Make a node's key (`<name>.key`, 0600) and its certificate (`<name>.cert`), signed by
    /// the cluster's key: give them to the node as `node_key_file` and `node_cert_file`.
    Issue {
        /// The cluster's signing key (from `cert init`).
        #[arg(long)]
        cluster_key: PathBuf,
        /// The node id the certificate covers, or an id prefix ending in `*` (all ranks of a
        /// host: node ids derived from host and port end in the rank).
        #[arg(long)]
        subject: String,
        /// Days until it expires (re-issue before; expiry is how certificates are revoked).
        #[arg(long, default_value_t = 30)]
        days: u64,
        /// Folder to write them into.
        #[arg(long)]
        out: PathBuf,
        /// File name stem (`node` → `node.key`, `node.cert`).
        #[arg(long, default_value = "node")]
        name: String,
    },
}

/// Writes `text` to a new file `path` with `mode`; never overwrites.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing file is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn folder(out: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(out)
        .with_context(|| format!("creating {}", out.display()))
}

/// Runs one `cert` subcommand; prints what it wrote.
pub fn run(cmd: CertCommand) -> Result<()> {
    match cmd {
        CertCommand::Init { out } => {
            folder(&out)?;
            let key = SigningKey::generate()?;
            write_new(&out.join("cluster.key"), &key.to_text(), 0o600)?;
            write_new(
                &out.join("cluster.pub"),
                &public_key_to_text(&key.public_key()),
                0o644,
            )?;
            println!(
                "wrote {0}/cluster.key (keep offline) and {0}/cluster.pub",
                out.display()
            );
        }
        CertCommand::Issue {
            cluster_key,
            subject,
            days,
            out,
            name,
        } => {
            if name.is_empty() || name.contains('/') || name.starts_with('.') {
                bail!("--name {name:?}: a plain file name stem");
            }
            let text = std::fs::read_to_string(&cluster_key)
                .with_context(|| format!("reading {}", cluster_key.display()))?;
            let cluster = SigningKey::from_text(&text)
                .with_context(|| format!("{} is not a cluster key", cluster_key.display()))?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let not_after = now.saturating_add(days.saturating_mul(86_400));
            let node = SigningKey::generate()?;
            let cert = cluster.issue(&subject, node.public_key(), not_after)?;
            folder(&out)?;
            write_new(&out.join(format!("{name}.key")), &node.to_text(), 0o600)?;
            write_new(&out.join(format!("{name}.cert")), &cert.to_text(), 0o644)?;
            println!(
                "wrote {0}/{name}.key and {0}/{name}.cert for {subject:?}, valid {days} days",
                out.display()
            );
        }
    }
    Ok(())
}

//! The node binaries as library functions, so the Python wheel can run them too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::{Map, Value};

use crate::Store;
use crate::config::{self, PeerCacheConfig, Role};

/// `peercache-node`: one PeerCache node.
#[derive(Debug, Parser)]
#[command(name = "peercache-node", version, about = "Run one PeerCache node")]
pub struct NodeArgs {
    /// `status`, `drive`, `locate` or `read-only-token`: a tool instead of running a node.
    #[command(subcommand)]
    pub command: Option<NodeCommand>,
    /// TOML config file (keys as in docs/configuration.md).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Seed list host:port[,host:port…] (same as the `discovery_addr` key).
    #[arg(long)]
    pub discovery_addr: Option<String>,
    /// Bind and advertise this host for every listener (data, control, meta).
    #[arg(long)]
    pub host: Option<String>,
    /// Any config key: `--set key=value` (repeatable; overrides the file).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Subcommands of `peercache-node`.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Print the cluster view (members, masters, pool and shard use) and exit.
    Status(crate::tools::status::StatusArgs),
    /// Write pages on one node and read them back through the others (needs nodes started
    /// with `client_enabled = true`); fails if any page is missing or wrong.
    Drive(crate::tools::drive::DriveArgs),
    /// Print where the directory says keys live (owners, resident or disk-only, class,
    /// generation), asking one node through its client API.
    Locate(crate::tools::locate::LocateArgs),
    /// Print the read-only client token of the cluster secret: routers and tools that only
    /// read use it as their secret on the client API, which refuses their writes.
    ReadOnlyToken(crate::tools::token::TokenArgs),
    /// Per-node credentials: the cluster's signing key and node certificates
    /// (`require_node_certificates`; docs/security.md).
    #[command(subcommand)]
    Cert(crate::tools::cert::CertCommand),
}

/// `peercache-meta`: a standalone discovery server.
#[derive(Debug, Parser)]
#[command(
    name = "peercache-meta",
    version,
    about = "Run a standalone PeerCache discovery server"
)]
pub struct MetaArgs {
    /// Address to serve on (the cluster-wide meta port).
    #[arg(long, default_value = "0.0.0.0:31998")]
    pub bind: std::net::SocketAddr,
    /// Seconds a silent member is kept.
    #[arg(long, default_value_t = 3.0, value_parser = crate::tools::secs::positive_seconds)]
    pub member_ttl: f64,
    /// File holding the cluster secret (else `PEERCACHE_CLUSTER_SECRET`). Without either the
    /// server only starts on a loopback address, as a node does, unless `--insecure`.
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// Serve without a cluster secret on a non-loopback address (anyone who reaches the port
    /// can join and read the member table).
    #[arg(long)]
    pub insecure: bool,
    /// Accept registrations that announce addresses of another host than the one they come
    /// from (members behind a NAT, or announcing another interface than they connect from).
    #[arg(long)]
    pub no_source_check: bool,
    /// Most connections one source address may hold (0: only the server's cap of 4096).
    #[arg(long, default_value_t = 0)]
    pub max_connections_per_source: usize,
    /// Require every member's connection sealed (encryption in transit; needs the secret).
    /// Without it, connections are sealed whenever the member can when `--bind` is beyond
    /// loopback, and when the member asks on loopback.
    #[arg(long)]
    pub encrypt_in_transit: bool,
}

pub use crate::tools::tool::tool_auth;

/// Installs the log subscriber: `RUST_LOG` if set, else `level`.
pub fn init_logging(level: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| level.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Builds the node config from the arguments, the file and the environment.
pub fn node_config(args: &NodeArgs, role: Role) -> Result<PeerCacheConfig> {
    let mut json = Map::new();
    if let Some(d) = &args.discovery_addr {
        json.insert("discovery_addr".into(), Value::String(d.clone()));
    }
    if let Some(h) = &args.host {
        for k in [
            "local_hostname",
            "rdma_bind_host",
            "control_bind_host",
            "meta_bind_host",
            "metrics_bind_host",
        ] {
            json.insert(k.into(), Value::String(h.clone()));
        }
    }
    let env: BTreeMap<String, String> = config::process_env();
    let overrides = config::parse_overrides(&args.set)?;
    if let Some(w) = config::argv_secret_warning(&overrides) {
        eprintln!("warning: {w}");
    }
    // --set beats the environment, which beats the file, which beats the flags above.
    let (mut cfg, warnings) =
        PeerCacheConfig::from_sources(Some(&json), args.config.as_deref(), &env, &overrides)?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    if cfg.role == Role::Auto {
        cfg.role = role;
    }
    Ok(cfg)
}

/// Blocks SIGINT and SIGTERM in this thread (and every thread it starts later), so that
/// [`wait_for_signal`] receives them.
pub fn block_signals() {
    // SAFETY: plain libc signal-mask calls on a zeroed, then initialised, sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits for SIGINT or SIGTERM (after [`block_signals`]).
pub fn wait_for_signal() -> i32 {
    // SAFETY: as in `block_signals`; `sigwait` writes the signal number into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let mut sig: libc::c_int = 0;
        libc::sigwait(&set, &mut sig);
        sig
    }
}

/// Runs a node until SIGINT/SIGTERM; `role` is the binary's default role.
pub fn run_node(args: NodeArgs, role: Role) -> Result<()> {
    match args.command {
        Some(NodeCommand::Status(s)) => return crate::tools::status::run(s),
        Some(NodeCommand::Drive(d)) => return crate::tools::drive::run(d),
        Some(NodeCommand::Locate(l)) => return crate::tools::locate::run(l),
        Some(NodeCommand::ReadOnlyToken(t)) => return crate::tools::token::run(t),
        Some(NodeCommand::Cert(c)) => return crate::tools::cert::run(c),
        None => {}
    }
    block_signals();
    let cfg = node_config(&args, role)?;
    init_logging(&cfg.log_level);
    let startup = cfg.startup_timeout;
    let store = Store::start(cfg).context("starting the node")?;
    let timeout = (startup > 0.0).then(|| Duration::from_secs_f64(startup));
    store.wait_ready(timeout).context("joining the cluster")?;
    tracing::info!(node = %store.node_id(), members = store.members().len(), "node ready");
    let sig = wait_for_signal();
    tracing::info!(signal = sig, "shutting down");
    store.shutdown();
    Ok(())
}

/// Runs a standalone discovery server until SIGINT/SIGTERM.
pub fn run_meta(args: MetaArgs) -> Result<()> {
    init_logging("info");
    block_signals();
    let auth = tool_auth(args.cluster_secret_file.as_deref())?;
    if args.encrypt_in_transit && !auth.is_enabled() {
        anyhow::bail!(
            "--encrypt-in-transit is keyed from the cluster secret: set PEERCACHE_CLUSTER_SECRET \
             or --cluster-secret-file"
        );
    }
    let auth = auth.with_sealing(if args.encrypt_in_transit {
        peercache_wire::seal::Sealing::Require
    } else if args.bind.ip().is_loopback() {
        peercache_wire::seal::Sealing::Offer
    } else {
        peercache_wire::seal::Sealing::Prefer
    });
    if let Some(w) = args
        .cluster_secret_file
        .as_deref()
        .and_then(config::secret_file_mode_warning)
    {
        tracing::warn!("{w}");
    }
    if !auth.is_enabled() {
        // The node's rule: open only where strangers cannot reach, or when told to.
        if !args.bind.ip().is_loopback() && !args.insecure {
            anyhow::bail!(
                "no cluster secret and --bind {} is reachable beyond loopback: set \
                 PEERCACHE_CLUSTER_SECRET or --cluster-secret-file, bind a loopback address, \
                 or pass --insecure",
                args.bind
            );
        }
        tracing::warn!("no cluster secret: any process that reaches this port can join");
    }
    let mut shares = peercache_discovery::DiscoveryServer::default_shares();
    if args.max_connections_per_source > 0 {
        shares.per_source = Some(peercache_wire::shares::SourceShare::new(
            args.max_connections_per_source,
        ));
    }
    let mut server = peercache_discovery::DiscoveryServer::start_with(
        args.bind,
        Duration::from_secs_f64(args.member_ttl),
        None,
        auth,
        shares,
    )
    .with_context(|| format!("binding the discovery server on {}", args.bind))?;
    server.check_sources(!args.no_source_check);
    tracing::info!(addr = %server.local_addr(), ttl = args.member_ttl, "peercache-meta serving");
    wait_for_signal();
    server.shutdown();
    Ok(())
}

/// Ends a binary: on error, one line with the cause chain (`error: outer: inner: …`) on stderr
/// and exit status 1 — never a backtrace, whatever `RUST_BACKTRACE` says.
pub fn report(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `outer: inner: …`, each cause once: a wrapper whose
/// message already ends with its source's (`discovery: {0}`) does not repeat it.
///
/// ```
/// let e = anyhow::Error::new(peercache_store::StoreError::Discovery(
///     peercache_discovery::DiscoveryError::EtcdNotBuilt,
/// ))
/// .context("starting the node");
/// let line = peercache_store::tools::cli::error_line(&e);
/// assert_eq!(line.matches("needs a build with etcd support").count(), 1, "{line}");
/// assert!(line.starts_with("starting the node: discovery: "), "{line}");
/// ```
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line == text || line.ends_with(&format!(": {text}")) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

//! `startup`: how soon a node with a large pool serves. Per round, a node with a pool of
//! `--pool-gib` GiB starts beside a small reader node (both in this process, on loopback); the
//! rows are the time from the start call to the first page it published being served to the
//! reader, the time until its whole pool is faulted in, and — same run, same cores — a
//! parallel memset of a fresh mapping of the same size and kind, the floor for faulting it
//! (first in odd rounds, after the node in even ones).
//!
//! With `--set protocol=rdma` (and the RDMA settings: `rdma_backend`, `device_names`,
//! `gid_index`, `rdma_register_chunk`) two more rows: the time until the reader's read of that
//! page is served one-sided (its chunk registered with the NIC), and the time until the node's
//! whole pool is registered (`/cluster` → `rdma.registering_bytes` at 0). On a host with an
//! RDMA NIC give `--hosts` two addresses on it; loopback only reaches the software fabric.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::cmd::main_job::{start_node_cold, start_node_with};
use crate::load::sweep::Rounds;
use crate::report::{Host, Report, Row};

/// Options of the `startup` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct StartupArgs {
    /// Pool of the node under test, GiB.
    #[arg(long, default_value_t = 16)]
    pub pool_gib: u64,
    /// The pool in a sealed memory file readers on the host can map (`host_local`, the node's
    /// default) or in private memory.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub host_local: bool,
    /// Faulting threads, for the node and the memset alike (0: one per core, at most 16).
    #[arg(long, default_value_t = 0)]
    pub fault_threads: usize,
    /// The reader's and the node's addresses (an RDMA NIC's addresses to measure verbs).
    #[arg(long, value_delimiter = ',', num_args = 2, default_values_t = ["127.0.0.1".to_string(), "127.0.0.2".to_string()])]
    pub hosts: Vec<String>,
    /// Any node setting for both nodes: `--set key=value`, repeatable (e.g. `protocol=rdma`,
    /// `rdma_backend=soft`, `rdma_register_chunk=256mb`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Rounds (the seconds option is unused).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

/// One round's figures, seconds.
struct Round {
    first_read: f64,
    ready: f64,
    memset: f64,
    /// With RDMA: the first read served one-sided, and the whole pool registered.
    rdma: Option<(f64, f64)>,
}

impl Round {
    /// The round's rows for a pool of `gib` GiB: first read (seconds as `max_us`), pool
    /// ready and the memset beside it (seconds, and GB/s).
    fn rows(&self, gib: u64, round: u64) -> Vec<Row> {
        let row = |what: &str, secs: f64, rate: bool| Row {
            max_us: secs * 1e6,
            gb_per_s: if rate {
                gib as f64 * 1.073_741_824 / secs
            } else {
                0.0
            },
            round,
            ..Row::empty(&format!("startup/{what}/{gib}g"))
        };
        let mut rows = vec![
            row("first-read", self.first_read, false),
            row("pool-ready", self.ready, true),
            row("memset", self.memset, true),
        ];
        if let Some((one_sided, registered)) = self.rdma {
            rows.push(row("first-rdma-read", one_sided, false));
            rows.push(row("rdma-registered", registered, true));
        }
        rows
    }
}

/// Runs the `startup` subcommand.
pub fn run(args: &StartupArgs) -> Result<Report> {
    ensure!(args.pool_gib >= 1, "--pool-gib must be at least 1");
    let threads = match args.fault_threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().min(16)),
        n => n,
    };
    let bytes = (args.pool_gib as usize) << 30;
    let (reader_host, node_host) = (args.hosts[0].as_str(), args.hosts[1].as_str());
    let port = std::net::TcpListener::bind((reader_host, 0))?
        .local_addr()?
        .port();
    let seed = format!("{reader_host}:{port}");
    let reader =
        start_node_with(reader_host, &seed, "64mb", &args.set).context("the reader node")?;
    let mut sets = vec![
        format!("host_local={}", args.host_local),
        format!("pool_fault_threads={threads}"),
    ];
    sets.extend(args.set.iter().cloned());
    let page = vec![0x5au8; 64 << 10];
    // Unmeasured: the host's page cache is reclaimed once here, not by the first measured run.
    memset_seconds(bytes, threads, args.host_local)?;
    let mut rounds = Vec::new();
    let mut rows = Vec::new();
    Rounds::new("startup", args.run.rounds).run(&mut rows, |cell| {
        let round = cell.round;
        // Alternate which goes first, so neither always pays for reclaiming the page cache.
        let memset_first = round % 2 == 1;
        let early = if memset_first {
            Some(memset_seconds(bytes, threads, args.host_local)?)
        } else {
            None
        };
        let key = format!("startup/probe/{round}");
        let t0 = Instant::now();
        let node = start_node_cold(node_host, &seed, &format!("{}gb", args.pool_gib), &sets)
            .context("the node under test")?;
        if !node.batch_set(&[&key], &[&page[..]])?.iter().all(|&ok| ok) {
            bail!("the node under test refused its first page");
        }
        // The first read the node serves: the reader's lookup finds it once the directory
        // entry landed and the ring has both members.
        let mut got = vec![0u8; page.len()];
        let deadline = t0 + Duration::from_secs(30);
        loop {
            reader.sync_membership();
            if reader.batch_get(&[&key], &mut [&mut got[..]])?[0] {
                break;
            }
            if Instant::now() > deadline {
                bail!("the reader never got the first page within 30 s");
            }
            std::thread::yield_now();
        }
        ensure!(
            got == page,
            "the first page served differs from the one written"
        );
        let first_read = t0.elapsed().as_secs_f64();
        let rdma = if node.cluster_view()["rdma"].is_object() {
            Some(rdma_seconds(&reader, &node, &key, &page, t0)?)
        } else {
            None
        };
        let ready = node.wait_pool_ready(Duration::from_secs(1800));
        ensure!(ready.is_ready(), "the pool was not warm within 30 minutes");
        let ready = t0.elapsed().as_secs_f64();
        node.shutdown();
        drop(node);
        let memset = match early {
            Some(m) => m,
            None => memset_seconds(bytes, threads, args.host_local)?,
        };
        eprintln!(
            "startup: {} GiB: first read served {first_read:.3} s, pool warm {ready:.2} s, \
             memset {memset:.2} s{}",
            args.pool_gib,
            rdma.map_or(String::new(), |(o, r)| format!(
                ", first one-sided read {o:.3} s, pool registered {r:.2} s"
            ))
        );
        let r = Round {
            first_read,
            ready,
            memset,
            rdma,
        };
        for row in r.rows(args.pool_gib, round) {
            cell.push(row);
        }
        rounds.push(r);
        Ok(())
    })?;
    reader.shutdown();
    let median = |f: &dyn Fn(&Round) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let first_read = median(&|r| r.first_read);
    let ratio = median(&|r| r.ready / r.memset);
    let rdma = rounds.iter().all(|r| r.rdma.is_some()).then(|| {
        let one_sided = median(&|r| r.rdma.map_or(0.0, |x| x.0));
        let registered = median(&|r| r.rdma.map_or(0.0, |x| x.1));
        serde_json::json!({
            "first_one_sided_read_s": (one_sided * 1000.0).round() / 1000.0,
            "pool_registered_s": (registered * 100.0).round() / 100.0,
        })
    });
    Ok(Report {
        bench: "startup".into(),
        host: Host::detect(),
        config: serde_json::json!({"pool_gib": args.pool_gib, "host_local": args.host_local,
            "fault_threads": threads, "rounds": args.run.rounds, "hosts": args.hosts,
            "set": args.set}),
        summary: serde_json::json!({
            "first_read_s": (first_read * 1000.0).round() / 1000.0,
            "pool_ready_s": (median(&|r| r.ready) * 100.0).round() / 100.0,
            "memset_s": (median(&|r| r.memset) * 100.0).round() / 100.0,
            // The whole pool warm against a parallel memset of the same size, same run.
            "ready_over_memset": (ratio * 100.0).round() / 100.0,
            "meets_target": first_read <= 1.0 && ratio <= 1.2,
            // With protocol=rdma: the first read served one-sided, the pool registered whole.
            "rdma": rdma,
        }),
        results: rows,
    })
}

/// With RDMA, seconds from `t0` until the reader's read of `key` is served one-sided (its
/// chunk registered; the page byte-exact) and until the node's whole pool is registered.
fn rdma_seconds(
    reader: &peercache_store::Store,
    node: &peercache_store::Store,
    key: &str,
    page: &[u8],
    t0: Instant,
) -> Result<(f64, f64)> {
    let deadline = t0 + Duration::from_secs(1800);
    let mut got = vec![0u8; page.len()];
    let one_sided = loop {
        let before = reader.stats().rdma_read_bytes;
        got.fill(0);
        let hit = reader.batch_get(&[key], &mut [&mut got[..]])?[0];
        ensure!(
            hit && got == page,
            "a read of the first page came back wrong or missing"
        );
        if reader.stats().rdma_read_bytes > before {
            break t0.elapsed().as_secs_f64();
        }
        ensure!(
            Instant::now() < deadline,
            "no read was served one-sided within 30 minutes"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let registering = || node.cluster_view()["rdma"]["registering_bytes"].as_u64();
    while registering() != Some(0) {
        ensure!(
            Instant::now() < deadline,
            "the pool was not registered within 30 minutes"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok((one_sided, t0.elapsed().as_secs_f64()))
}

/// Seconds to map `bytes` fresh (a memory file when `shared`, as the node's host-local pool;
/// private memory with huge pages advised otherwise) and write every byte of it on `threads`
/// threads.
fn memset_seconds(bytes: usize, threads: usize, shared: bool) -> Result<f64> {
    let t0 = Instant::now();
    let fd = if shared {
        // SAFETY: a NUL-terminated name and plain flags; the result is checked.
        let fd =
            unsafe { libc::memfd_create(c"peercache-bench-memset".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: sizing the descriptor made just above.
        if fd < 0 || unsafe { libc::ftruncate(fd, bytes as libc::off_t) } != 0 {
            bail!("memfd: {}", std::io::Error::last_os_error());
        }
        fd
    } else {
        -1
    };
    let (flags, prot) = if shared {
        (libc::MAP_SHARED, libc::PROT_READ | libc::PROT_WRITE)
    } else {
        (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    // SAFETY: a fresh mapping with no address hint; checked below, unmapped at the end.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), bytes, prot, flags, fd, 0) };
    if fd >= 0 {
        // SAFETY: the mapping keeps the file; the descriptor is ours to close.
        unsafe { libc::close(fd) };
    }
    if p == libc::MAP_FAILED {
        bail!("mmap of {bytes} bytes: {}", std::io::Error::last_os_error());
    }
    if !shared {
        // SAFETY: advice on the mapping made above.
        unsafe { libc::madvise(p, bytes, libc::MADV_HUGEPAGE) };
    }
    let base = p as usize;
    let per = bytes.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 0..threads {
            let lo = (t * per).min(bytes);
            let hi = ((t + 1) * per).min(bytes);
            s.spawn(move || {
                // SAFETY: `[lo, hi)` lies inside the mapping and is written by this thread
                // alone; the mapping lives until the scope ends.
                unsafe { std::ptr::write_bytes((base + lo) as *mut u8, 0, hi - lo) };
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: unmapping the mapping made above, once.
    unsafe { libc::munmap(p, bytes) };
    Ok(secs)
}

//! `peercache-bench prefix`: a router's prefix query on three loopback nodes holding 100 k keys
//! between them, beside the same run's raw-TCP request/response.
//!
//! Rows, interleaved per round: `raw-tcp-rr` (one 16-byte request, one `--reply-bytes` reply
//! over plain std sockets: the floor of any request/response), `prefix-64` (the store API's
//! `prefix_locations` of 64 keys: one holders fan-out to the three directory shards),
//! `prefix-64-client` (the same query from a process that runs no node: the client API's
//! `Prefix` request with the read-only client token) and `prefix-64-http` (the same query as
//! `POST /prefix` on the node's HTTP port, keep-alive, with the bearer token). Every answer is
//! checked against a scan of what each node published; a wrong one is counted in the row's
//! `errors`.
//!
//! `--placement split` (the default) runs the three nodes and the raw echo server on every CPU
//! but the first and the calling thread on the first, so every row's round trips cross CPUs as
//! a router's request to another host does; `--placement os` leaves placement to the scheduler,
//! where a round trip is two context switches on one CPU or two wake-ups across two, from one
//! round to the next ([`crate::load::placement`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use peercache_store::Store;
use serde_json::json;

use crate::load::placement::{Placement, Split};
use crate::load::rawtcp;
use crate::load::runner::time_calls;
use crate::load::sweep::Rounds;
use crate::report::{self, Host, Report, Row};

/// Options of `prefix`.
#[derive(Debug, Clone, clap::Args)]
pub struct PrefixArgs {
    /// Keys published across the three nodes.
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// Keys per query.
    #[arg(long, default_value_t = 64)]
    pub query: usize,
    /// Bytes of the raw-TCP baseline's reply (4 KiB, set when shards answered with full
    /// locations; the holders-only answer is a few hundred bytes, and a 256-byte reply makes the
    /// baseline about 1 µs faster on loopback).
    #[arg(long, default_value_t = 4096)]
    pub reply_bytes: usize,
    /// Where the threads run: `split` (servers apart from the caller) or `os`.
    #[arg(long, value_enum, default_value_t = Placement::Split)]
    pub placement: Placement,
    /// Rounds, seconds per round and the JSON output (shared by every subcommand).
    #[command(flatten)]
    pub run: crate::load::rows::RunArgs,
}

/// Which keys node `n` publishes: the first all, the second runs of 700 in every 1000, the
/// third the first half except every seventh — so answers mix full, partial and empty runs.
fn holds(n: usize, i: usize, keys: usize) -> bool {
    match n {
        0 => true,
        1 => i % 1000 < 700,
        _ => i < keys / 2 && i % 7 != 3,
    }
}

/// Node `n`'s leading run of `len` keys from `start`: the definition, key by key.
fn scan(n: usize, start: usize, len: usize, keys: usize) -> usize {
    (start..start + len)
        .take_while(|&i| holds(n, i, keys))
        .count()
}

const TOKEN: &str = "peercache-bench-prefix-router-token";

/// The three nodes on 127.0.41.x (the first seeds), each with the HTTP port and `token_file`.
fn cluster(token_file: &str) -> Result<Vec<Store>> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let ip = |i: usize| format!("127.0.41.{}", i + 1);
    let seed = format!("{}:{port}", ip(0));
    let extra = json!({"metrics_enabled": true, "metrics_port": 0, "http_token_file": token_file,
                       "member_ttl": 30.0, "client_enabled": true});
    let nodes = (0..3)
        .map(|i| crate::cmd::modes::start(&ip(i), &seed, 64, extra.clone()))
        .collect::<Result<Vec<_>>>()?;
    for s in &nodes {
        if !s.wait_members(3, Duration::from_secs(20)) {
            bail!("prefix: the nodes did not see each other");
        }
        s.sync_membership();
    }
    Ok(nodes)
}

/// The body of `POST /prefix`.
#[derive(serde::Serialize)]
struct HttpQuery<'a> {
    keys: &'a [String],
}

/// Its answer, as far as the check reads it.
#[derive(serde::Deserialize)]
struct HttpAnswer {
    nodes: Vec<HttpRun>,
}

/// One node's run in the answer.
#[derive(serde::Deserialize)]
struct HttpRun {
    node: String,
    leading: u64,
    resident: u64,
}

/// One keep-alive HTTP/1.1 connection that posts prefix queries.
struct HttpConn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    req: Vec<u8>,
    body: Vec<u8>,
    line: String,
}

impl HttpConn {
    fn connect(addr: SocketAddr) -> Result<HttpConn> {
        let w = TcpStream::connect(addr)?;
        w.set_nodelay(true)?;
        w.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(HttpConn {
            r: BufReader::new(w.try_clone()?),
            w,
            req: Vec::with_capacity(8192),
            body: Vec::with_capacity(8192),
            line: String::new(),
        })
    }

    /// Posts `json` to `/prefix`; the answer's body, or why there is none.
    fn post(&mut self, json: &[u8]) -> Result<&[u8]> {
        self.req.clear();
        write!(
            self.req,
            "POST /prefix HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            json.len()
        )?;
        self.req.extend_from_slice(json);
        self.w.write_all(&self.req)?;
        let (mut status, mut len) = (0u16, 0usize);
        loop {
            self.line.clear();
            if self.r.read_line(&mut self.line)? == 0 {
                bail!("the HTTP port closed the connection");
            }
            let l = self.line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(code) = l.strip_prefix("HTTP/1.1 ") {
                status = code.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
            } else if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse()?;
            }
        }
        self.body.resize(len, 0);
        self.r.read_exact(&mut self.body)?;
        if status != 200 {
            bail!("HTTP {status}: {}", String::from_utf8_lossy(&self.body));
        }
        Ok(&self.body)
    }
}

/// Runs `prefix`.
pub fn run(args: &PrefixArgs) -> Result<Report> {
    let (n, q) = (args.keys, args.query);
    if q == 0 || q > n || q > 4096 {
        bail!("--query must be 1..=min(--keys, 4096), got {q}");
    }
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN)?;
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let split = match args.placement {
        Placement::Split => Some(Split::of_allowed()?),
        Placement::Os => None,
    };
    // The servers: three nodes and the raw echo server, started (on the server CPUs when split).
    let start = || -> Result<(Vec<Store>, SocketAddr)> {
        let nodes = cluster(&token_file.display().to_string())?;
        let listener =
            TcpListener::bind("127.0.41.4:0").or_else(|_| TcpListener::bind("127.0.0.1:0"))?;
        let raw_addr = listener.local_addr()?;
        let buf = Arc::new(rawtcp::prefaulted(args.reply_bytes, 9));
        std::thread::spawn(move || rawtcp::serve(listener, buf));
        Ok((nodes, raw_addr))
    };
    let (nodes, raw_addr) = match &split {
        Some(s) => s.start_servers(start)??,
        None => start()?,
    };
    let keys: Vec<String> = (0..n).map(|i| format!("bench-prefix/{i}")).collect();
    let page = [5u8; 64];
    for (k, node) in nodes.iter().enumerate() {
        let mine: Vec<&String> = (0..n)
            .filter(|&i| holds(k, i, n))
            .map(|i| &keys[i])
            .collect();
        for chunk in mine.chunks(4096) {
            let pages = vec![&page[..]; chunk.len()];
            if !node.batch_set(chunk, &pages)?.iter().all(|s| *s) {
                bail!("node {k} did not store its share");
            }
        }
    }
    let ids: Vec<String> = nodes.iter().map(|s| s.node_id().to_string()).collect();
    // Right when every node's (leading, resident) equals the scan.
    let right = |got: &mut dyn Iterator<Item = (String, u64, u64)>, start: usize| -> bool {
        let mut seen = [0u64; 3];
        for (node, leading, resident) in got {
            let Some(k) = ids.iter().position(|i| *i == node) else {
                return false;
            };
            seen[k] = leading;
            if leading != resident {
                return false;
            }
        }
        (0..3).all(|k| seen[k] == scan(k, start, q, n) as u64)
    };

    let mut raw = rawtcp::RawClient::connect(raw_addr)?;
    let mut dst = rawtcp::prefaulted(args.reply_bytes, 1);
    let http_addr = nodes[0]
        .metrics_endpoint()
        .context("the node serves no HTTP port")?;

    // A router that runs no node: the client API with the read-only client token.
    let token = peercache_wire::auth::read_only_token(crate::load::secret::generated().as_bytes())?;
    let client = peercache_store::client::Client::new(
        nodes[0]
            .client_endpoint()
            .context("the node serves no client API")?,
        peercache_wire::Auth::from_secret(token.as_bytes())?,
        Duration::from_secs(10),
    );

    let dur = Duration::from_secs_f64(args.run.secs);
    let mut rows = Vec::new();
    // xorshift over the query starts: every row sees the same spread of offsets.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next_start = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x as usize) % (n - q + 1)
    };
    let mut body = Vec::with_capacity(q * 24);
    Rounds::new("prefix", args.run.rounds).run(&mut rows, |cell| {
        let round = cell.round;
        let row = |name: &str, f: &mut dyn FnMut() -> bool| {
            let (h, calls, errors, secs) = time_calls(dur, || u64::from(!f()));
            Row {
                errors,
                round,
                ..Row::measured(name, 0, q as u64, calls * q as u64, secs, &h)
            }
        };
        cell.push(row("raw-tcp-rr", &mut || {
            raw.batch(&[0], args.reply_bytes, &mut dst).is_ok()
        }));
        // The store API and the client API give the same typed answer.
        let runs_right = |runs: Vec<peercache_store::PrefixRun>, start: usize| {
            right(
                &mut runs
                    .iter()
                    .map(|r| (r.node.to_string(), r.leading as u64, r.resident as u64)),
                start,
            )
        };
        cell.push(row("prefix-64", &mut || {
            let start = next_start();
            nodes[0]
                .prefix_locations(&keys[start..start + q])
                .is_ok_and(|runs| runs_right(runs, start))
        }));
        cell.push(row("prefix-64-client", &mut || {
            let start = next_start();
            client
                .prefix_locations(&keys[start..start + q])
                .is_ok_and(|runs| runs_right(runs, start))
        }));
        // A fresh keep-alive connection per round: one idle through the other rows (longer
        // than the HTTP port's idle timeout with long rounds) would be closed under it.
        let mut http = HttpConn::connect(http_addr)?;
        cell.push(row("prefix-64-http", &mut || {
            let start = next_start();
            // Typed both ways, as a router would: no JSON tree built or walked per query.
            body.clear();
            let query = HttpQuery {
                keys: &keys[start..start + q],
            };
            if serde_json::to_writer(&mut body, &query).is_err() {
                return false;
            }
            let Ok(answer) = http.post(&body) else {
                return false;
            };
            let Ok(v) = serde_json::from_slice::<HttpAnswer>(answer) else {
                return false;
            };
            right(
                &mut v.nodes.into_iter().map(|r| (r.node, r.leading, r.resident)),
                start,
            )
        }));
        Ok(())
    })?;
    for s in &nodes {
        s.shutdown();
    }
    let med = |name: &str| report::median_of(&rows, name, |r| r.p50_us);
    let (raw_p50, store_p50, client_p50, http_p50) = (
        med("raw-tcp-rr"),
        med("prefix-64"),
        med("prefix-64-client"),
        med("prefix-64-http"),
    );
    let errors: u64 = rows.iter().map(|r| r.errors).sum();
    Ok(Report {
        bench: "prefix".into(),
        host: Host::detect(),
        config: json!({"keys": n, "query": q, "nodes": 3, "reply_bytes": args.reply_bytes,
                       "rounds": args.run.rounds, "secs": args.run.secs, "transport": "loopback tcp",
                       "placement": split.as_ref().map_or_else(|| "os".to_string(), Split::describe)}),
        summary: json!({
            "raw_tcp_rr_p50_us": raw_p50,
            "prefix_p50_us": store_p50,
            "prefix_client_p50_us": client_p50,
            "prefix_client_over_raw_p50": client_p50 / raw_p50.max(1e-9),
            "prefix_http_p50_us": http_p50,
            "prefix_over_raw_p50": store_p50 / raw_p50.max(1e-9),
            "prefix_http_over_raw_p50": http_p50 / raw_p50.max(1e-9),
            "wrong_answers": errors,
        }),
        results: rows,
    })
}

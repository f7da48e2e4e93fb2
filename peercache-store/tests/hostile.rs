//! Strangers without the secret against a real `peercache-node` process on loopback: they
//! cannot hold its ports open by trickling a handshake, and a connection flood under a low
//! descriptor limit neither spins the node's CPU nor floods its log. Then secret holders: the
//! frames they leave half-sent are bounded by the process's frame budget, and one source
//! address holds at most its share of each port's connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// Kills the child process when dropped (a failing assertion leaves no stray node behind).
struct Node {
    child: Child,
    ports: Ports,
}

#[derive(Clone, Copy)]
struct Ports {
    meta: SocketAddr,
    data: SocketAddr,
    control: SocketAddr,
    client: SocketAddr,
    /// The metrics HTTP port, on the node's own address (the default bind).
    metrics: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node on `127.0.0.<host>` with every port fixed, `op_timeout` 1 s (the handshake deadline
/// of the data, control and client ports), started under `ulimit -n <nofile>` (hard and soft).
fn start(host: u8, nofile: u32, stderr: Stdio) -> Node {
    start_with(host, nofile, stderr, "")
}

/// [`start`] with `extra` command-line settings (`--set key=value …`).
fn start_with(host: u8, nofile: u32, stderr: Stdio, extra: &str) -> Node {
    let ip = format!("127.0.0.{host}");
    let p = |_: ()| common::free_port();
    let ports = Ports {
        meta: format!("{ip}:{}", p(())).parse().unwrap(),
        data: format!("{ip}:{}", p(())).parse().unwrap(),
        control: format!("{ip}:{}", p(())).parse().unwrap(),
        client: format!("{ip}:{}", p(())).parse().unwrap(),
        metrics: format!("{ip}:{}", p(())).parse().unwrap(),
    };
    let exe = env!("CARGO_BIN_EXE_peercache-node");
    let cmd = format!(
        "ulimit -n {nofile} && exec {exe} --discovery-addr {meta} --host {ip} \
         --set node_id=hostile-{host} --set protocol=tcp --set global_segment_size=16mb \
         --set rdma_port={data} --set control_port={control} \
         --set client_enabled=true --set client_port={client} \
         --set op_timeout=1.0 --set heartbeat_interval=0.2 --set member_ttl=0.6 \
         --set metrics_port={metrics} --set log_level=warn {extra}",
        meta = ports.meta,
        data = ports.data.port(),
        control = ports.control.port(),
        client = ports.client.port(),
        metrics = ports.metrics.port(),
    );
    let child = Command::new("bash")
        .args(["-c", &cmd])
        .env("PEERCACHE_CLUSTER_SECRET", common::secret())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let node = Node { child, ports };
    // Ready when every port accepts.
    let until = Instant::now() + Duration::from_secs(20);
    for a in [
        ports.meta,
        ports.data,
        ports.control,
        ports.client,
        ports.metrics,
    ] {
        while TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < until, "node never listened on {a}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    node
}

/// Connects to `addr` and trickles a plausible first frame one byte per 100 ms, as a stranger
/// would; returns how long the server kept the connection open (None: still open after 10 s).
fn trickle(addr: SocketAddr) -> Option<Duration> {
    let mut bytes = 1000u32.to_be_bytes().to_vec();
    bytes.extend_from_slice(&[0x42; 1000]);
    trickle_bytes(
        addr,
        &bytes,
        Duration::from_millis(100),
        Duration::from_secs(10),
    )
}

/// Writes `bytes` to a new connection to `addr` one at a time, waiting up to `every` for the
/// server between bytes; how long the server kept the connection open (None: still open
/// after `give_up`, or every byte was sent).
fn trickle_bytes(
    addr: SocketAddr,
    bytes: &[u8],
    every: Duration,
    give_up: Duration,
) -> Option<Duration> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(every)).unwrap();
    let t0 = Instant::now();
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return Some(t0.elapsed());
        }
        let mut r = [0u8; 64];
        if closed_by(s.read(&mut r)) {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > give_up {
            return None;
        }
    }
    None
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn a_stranger_trickling_a_handshake_is_closed_within_twice_the_deadline_on_every_port() {
    let node = start(61, 4096, Stdio::null());
    let p = node.ports;
    // Handshake deadlines: op_timeout (1 s) on data, control and client ports; 2 s on meta.
    // The data port also carries the RDMA bootstrap and same-host attach planes.
    let ports = [
        ("data", p.data, 1.0),
        ("control", p.control, 1.0),
        ("client", p.client, 1.0),
        ("meta", p.meta, 2.0),
    ];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ports
            .iter()
            .map(|(name, addr, deadline)| s.spawn(move || (*name, trickle(*addr), *deadline)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (name, open_for, deadline) in results {
        let open_for = open_for.unwrap_or_else(|| panic!("{name} port held a trickler open"));
        eprintln!("{name} port closed a trickler after {open_for:?} (deadline {deadline} s)");
        assert!(
            open_for < Duration::from_secs_f64(2.0 * deadline),
            "{name} port kept a trickler for {open_for:?} (deadline {deadline} s)"
        );
    }
    // The slots are free again: an authenticated client is served.
    let c = common::client(p.client);
    let page = common::page(7, 4096);
    assert!(c.put(&["hostile/a"], &[&page[..]]).unwrap()[0]);
}

/// CPU seconds a process has used (user + system), from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// The pid of the node: `bash -c 'ulimit …; exec node'` keeps the pid across the exec.
fn pid(node: &Node) -> u32 {
    node.child.id()
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn a_connection_flood_under_a_low_descriptor_limit_neither_spins_nor_floods_the_log() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let node = start(62, 256, Stdio::from(log.reopen().unwrap()));
    let p = node.ports;
    let pid = pid(&node);
    // The flood: more connections than the node may have descriptors (its limit is 256), all
    // held open, spread over every port. Beyond its caps the node must refuse them, and with
    // its descriptors gone it must wait for them to free up — not retry accepting in a loop.
    let mut held: Vec<TcpStream> = Vec::new();
    for round in 0..150 {
        for a in [p.data, p.control, p.client, p.meta] {
            if let Ok(s) = TcpStream::connect_timeout(&a, Duration::from_millis(200)) {
                held.push(s);
            }
        }
        if round % 10 == 9 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let opened = held.len();
    // The node under the flood's weight: three seconds with every connection still open.
    let cpu0 = cpu_seconds(pid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_seconds(pid) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    eprintln!("flood of {opened} connections: node used {cpu:.2} CPU s in {wall:.1} s");
    assert!(
        opened >= 300,
        "the flood reached the node ({opened} connections)"
    );
    assert!(
        cpu < 0.25 * wall,
        "the node used {cpu:.2} CPU s in {wall:.1} s holding the flood"
    );
    drop(held);
    // It serves a member again once the strangers are gone.
    let c = common::client(p.client);
    let page = common::page(8, 4096);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match c.put(&["hostile/b"], &[&page[..]]) {
            Ok(v) if v[0] => break,
            other => assert!(
                Instant::now() < until,
                "not served after the flood: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = std::fs::read_to_string(log.path()).unwrap().lines().count();
    assert!(
        lines < 60,
        "{lines} log lines for {opened} refused connections"
    );
}

/// How long the server kept `s` open, reading until it closes (None: still open after `max`).
fn open_for(mut s: TcpStream, t0: Instant, max: Duration) -> Option<Duration> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < max {
        if closed_by(s.read(&mut buf)) {
            return Some(t0.elapsed());
        }
    }
    None
}

/// Connects to the metrics port and trickles a request head one byte per 500 ms.
fn trickle_http(addr: SocketAddr) -> Option<Duration> {
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Trickle: {}",
        "a".repeat(64)
    );
    trickle_bytes(
        addr,
        head.as_bytes(),
        Duration::from_millis(500),
        Duration::from_secs(40),
    )
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn the_metrics_port_cuts_tricklers_silent_and_idle_connections() {
    let node = start(63, 4096, Stdio::null());
    let m = node.ports.metrics;
    // The default bind is the node's own address, not every interface.
    let wildcard_twin: SocketAddr = format!("127.0.0.1:{}", m.port()).parse().unwrap();
    assert!(
        TcpStream::connect_timeout(&wildcard_twin, Duration::from_millis(500)).is_err(),
        "the metrics port answered on 127.0.0.1 although the node is 127.0.0.63"
    );
    let (trickled, silent, idle) = std::thread::scope(|sc| {
        let trickled = sc.spawn(|| trickle_http(m));
        let silent = sc.spawn(|| {
            let s = TcpStream::connect(m).unwrap();
            open_for(s, Instant::now(), Duration::from_secs(70))
        });
        let idle = sc.spawn(|| {
            // A keep-alive client that asks once, then says nothing.
            let mut s = TcpStream::connect(m).unwrap();
            s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {m}\r\n\r\n").as_bytes())
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).contains("200"));
            open_for(s, Instant::now(), Duration::from_secs(70))
        });
        (
            trickled.join().unwrap(),
            silent.join().unwrap(),
            idle.join().unwrap(),
        )
    });
    eprintln!(
        "metrics port: trickler cut after {trickled:?}, silent after {silent:?}, idle keep-alive after {idle:?}"
    );
    // The head timeout (5 s) runs from the connection's start or its last response, so it
    // cuts all three; no byte moving for 30 s is the backstop.
    for (what, open) in [
        ("trickled head", trickled),
        ("silent", silent),
        ("idle keep-alive", idle),
    ] {
        let open = open.unwrap_or_else(|| panic!("a {what} connection held the metrics port"));
        assert!(
            open < Duration::from_secs(10),
            "a {what} connection: {open:?}"
        );
    }
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn a_metrics_port_flood_under_a_low_descriptor_limit_leaves_the_authenticated_ports_serving() {
    let log = tempfile::NamedTempFile::new().unwrap();
    let node = start(64, 256, Stdio::from(log.reopen().unwrap()));
    let p = node.ports;
    // More idle connections to the unauthenticated port than the node has descriptors.
    let held: Vec<TcpStream> = (0..400)
        .filter_map(|_| TcpStream::connect_timeout(&p.metrics, Duration::from_millis(200)).ok())
        .collect();
    assert!(
        held.len() >= 300,
        "the flood reached the node ({})",
        held.len()
    );
    // With every one of them still open, a member is served on the client port.
    let c = common::client(p.client);
    let page = common::page(9, 4096);
    let t0 = Instant::now();
    let put = c.put(&["hostile/http-flood"], &[&page[..]]);
    assert!(
        matches!(&put, Ok(v) if v[0]),
        "the client port starved by a metrics flood: {put:?} after {:?}",
        t0.elapsed()
    );
    let got = c.get(&["hostile/http-flood"], 4096).unwrap();
    assert_eq!(got[0].as_ref().map(|p| &p.bytes[..]), Some(&page[..]));
    drop(held);
    let lines = std::fs::read_to_string(log.path()).unwrap().lines().count();
    assert!(lines < 20, "{lines} log lines for one flood");
}

/// A member's control-plane connection to `addr` from the loopback address `from`, past the
/// authenticated handshake (`Err`: the node closed it first).
fn member(from: &str, addr: SocketAddr) -> Result<TcpStream, peercache_wire::WireError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut s = rt
        .block_on(async {
            let sock = tokio::net::TcpSocket::new_v4()?;
            sock.bind(format!("{from}:0").parse().unwrap())?;
            sock.connect(addr).await
        })
        .unwrap()
        .into_std()
        .unwrap();
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = peercache_wire::handshake::Hello::new(
        peercache_wire::handshake::Plane::Control,
        None,
        peercache_wire::Incarnation(7),
    );
    let auth = peercache_wire::Auth::from_secret(common::secret().as_bytes()).unwrap();
    peercache_wire::handshake::client_sync(&mut s, &hello, &auth, Duration::from_secs(5))?;
    Ok(s)
}

/// The node closed `s` (end of stream or reset) without answering.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn a_member_announcing_frames_past_the_frame_budget_is_closed_and_counted() {
    // A 96 MiB budget holds one 64 MiB control frame (the largest `max_frame_bytes` allows).
    let node = start_with(65, 4096, Stdio::null(), "--set frame_budget_bytes=96mb");
    let p = node.ports;
    // One member announces a 64 MiB request and sends 1 MiB of it.
    let mut first = member("127.0.0.1", p.control).unwrap();
    first.write_all(&(64u32 << 20).to_be_bytes()).unwrap();
    first.write_all(&vec![0u8; 1 << 20]).unwrap();
    // Another does the same on the control port: 64 MiB is not left, so its connection ends.
    let mut second = member("127.0.0.1", p.control).unwrap();
    second.write_all(&(64u32 << 20).to_be_bytes()).unwrap();
    assert!(closed(&mut second), "a frame past the budget was buffered");
    let text = common::scrape(&p.metrics.to_string());
    assert_eq!(
        sample(
            &text,
            "peercache_rpc_frame_budget_refused_total",
            &["server=\"pc-control\""]
        ),
        1.0,
        "{text}"
    );
    // Members' ordinary requests are served meanwhile.
    let c = common::client(p.client);
    let page = common::page(3, 4096);
    assert!(matches!(c.put(&["hostile/budget"], &[&page[..]]), Ok(v) if v[0]));
    drop(first);
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn a_source_at_its_share_of_connections_is_refused_and_other_sources_are_served() {
    let node = start_with(
        66,
        4096,
        Stdio::null(),
        "--set max_inbound_connections_per_source=3",
    );
    let p = node.ports;
    let held: Vec<TcpStream> = (0..3)
        .map(|_| member("127.0.0.1", p.control).unwrap())
        .collect();
    // A fourth from the same address is closed before its handshake completes.
    assert!(member("127.0.0.1", p.control).is_err());
    // Another address completes its handshake on the same port.
    let other = member("127.0.0.2", p.control).expect("another source is served");
    // The data port keeps the same share: of four connections from one address, the fourth is
    // closed at accept (the three others wait for their handshake).
    let mut raw: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(p.data).unwrap())
        .collect();
    raw[3]
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    assert!(
        closed(&mut raw[3]),
        "the data port took a fourth connection"
    );
    let text = common::scrape(&p.metrics.to_string());
    for server in ["server=\"pc-control\"", "server=\"pc-data\""] {
        let refused = sample(
            &text,
            "peercache_rpc_connections_refused_total",
            &["reason=\"source\"", server],
        );
        assert_eq!(refused, 1.0, "{server}: {text}");
    }
    drop((held, other, raw));
}

/// One HTTP/1.1 GET of `path` at `addr` (the connection closed after it), with an optional
/// `Authorization` header: the status code and the body.
fn http_get(addr: SocketAddr, path: &str, authorization: Option<&str>) -> (u16, String) {
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    common::http(addr, "GET", path, &auth, "")
}

#[test]
#[ignore = "the hostile stage runs it: bash scripts/hostile.sh"]
fn with_a_token_file_cluster_answers_only_requests_that_carry_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("http-token");
    let token = "a-token-only-operators-hold-0001";
    std::fs::write(&path, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let node = start_with(
        67,
        4096,
        Stdio::null(),
        &format!("--set http_token_file={}", path.display()),
    );
    let m = node.ports.metrics;
    // Strangers: no header, another scheme, a wrong token, a prefix of the right one.
    for auth in [
        None,
        Some(format!("Basic {token}")),
        Some("Bearer a-token-only-operators-hold-0002".to_string()),
        Some(format!("Bearer {}", &token[..token.len() - 1])),
    ] {
        let (status, body) = http_get(m, "/cluster", auth.as_deref());
        assert_eq!(status, 401, "{auth:?}: {body}");
        assert!(!body.contains("members"), "{auth:?}: {body}");
    }
    let (status, body) = http_get(m, "/cluster", Some(&format!("Bearer {token}")));
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["node"], "hostile-67", "{body}");
    // Prometheus and probes keep their open paths, and the refusals are counted.
    let (status, metrics) = http_get(m, "/metrics", None);
    assert_eq!(status, 200);
    assert_eq!(
        sample(&metrics, "peercache_http_unauthorized_total", &[]),
        4.0,
        "{metrics}"
    );
    assert_eq!(http_get(m, "/healthz", None).0, 200);
    assert_eq!(
        http_get(m, "/", None).0,
        200,
        "the dashboard page holds no data"
    );
}

/// Whether a read's outcome says the server closed the connection (data or a read timeout:
/// not yet).
fn closed_by(read: std::io::Result<usize>) -> bool {
    match read {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

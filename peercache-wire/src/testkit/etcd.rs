//! A real etcd server for tests: Debian's `etcd` binary (`PEERCACHE_ETCD_BIN`, else `etcd` on
//! `PATH`) on free loopback ports, in its own temporary data folder — never the package's
//! service or default ports. `scripts/etcd.sh` fetches the binary without installing the
//! package.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running single-member etcd cluster.
#[derive(Debug)]
pub struct EtcdServer {
    bin: PathBuf,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
    tls: Option<TlsFiles>,
}

/// PEM files of a TLS etcd ([`EtcdServer::start_tls`]): its CA, and a client certificate that CA
/// signed.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A client certificate (for `--client-cert-auth`).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

/// The etcd binary tests run, or why there is none.
pub fn etcd_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("PEERCACHE_ETCD_BIN") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("PEERCACHE_ETCD_BIN={} is not a file", p.display()))
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no etcd binary: set PEERCACHE_ETCD_BIN (scripts/etcd.sh prints one) or put etcd on PATH"
                .to_string()
        })
}

fn free_port(host: &str) -> std::io::Result<SocketAddr> {
    TcpListener::bind((host, 0))?.local_addr()
}

impl EtcdServer {
    /// Starts etcd on `host` (e.g. `127.0.0.1`) and waits until it answers `/health`.
    ///
    /// # Panics
    /// When there is no etcd binary, or it does not come up within 30 s (it is a test).
    pub fn start(host: &str) -> Self {
        Self::launch(host, false)
    }

    /// Starts etcd serving `https://` only, with client-certificate authentication on; the
    /// certificates are made with the `openssl` command (a CA, a server certificate for
    /// `host`, a client certificate).
    ///
    /// # Panics
    /// As [`EtcdServer::start`], and when `openssl` fails.
    pub fn start_tls(host: &str) -> Self {
        Self::launch(host, true)
    }

    /// The TLS files (after [`EtcdServer::start_tls`]).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    fn launch(host: &str, tls: bool) -> Self {
        let bin = etcd_binary().unwrap_or_else(|e| panic!("{e}"));
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pc-etcd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd data folder");
        let mut s = EtcdServer {
            bin,
            dir,
            client: free_port(host).expect("a free client port"),
            peer: free_port(host).expect("a free peer port"),
            child: None,
            tls: None,
        };
        if tls {
            s.tls = Some(make_certs(&s.dir, host));
        }
        s.spawn();
        s
    }

    /// The client URL (`http://host:port`, `https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.client)
    }

    /// The data folder.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .expect("etcd log file");
        let mut cmd = Command::new(&self.bin);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key)
                .arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
        let child = cmd
            .arg("--name")
            .arg("pc-test")
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen-client-urls")
            .arg(self.url())
            .arg("--advertise-client-urls")
            .arg(self.url())
            .arg("--listen-peer-urls")
            .arg(format!("http://{}", self.peer))
            .arg("--initial-advertise-peer-urls")
            .arg(format!("http://{}", self.peer))
            .arg("--initial-cluster")
            .arg(format!("pc-test=http://{}", self.peer))
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--logger")
            .arg("zap")
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_healthy(Duration::from_secs(30));
    }

    fn wait_healthy(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.healthy() {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "etcd exited with {status}; its log:\n{}",
                    std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "etcd at {} not healthy within {within:?}",
                self.client
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether etcd answers `GET /health` with a healthy status (with TLS: whether it
    /// accepts connections).
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_millis(300)) else {
            return false;
        };
        if self.tls.is_some() {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
        let req = format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.client
        );
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.take(64 << 10).read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// POSTs `body` (JSON) to etcd's v3 HTTP gateway at `path` (e.g. `/v3/kv/put`) with an
    /// optional auth token; returns the response body.
    ///
    /// # Panics
    /// When etcd does not answer 200 within 5 s (it is a test).
    pub fn v3(&self, path: &str, body: &str, token: Option<&str>) -> String {
        let mut s = TcpStream::connect_timeout(&self.client, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("etcd at {}: {e}", self.client));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let auth = token
            .map(|t| format!("Authorization: {t}\r\n"))
            .unwrap_or_default();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n{auth}\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.client,
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut resp = String::new();
        let _ = s.take(1 << 20).read_to_string(&mut resp);
        let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
        assert!(head.starts_with("HTTP/1.1 200"), "{path}: {resp}");
        body.to_string()
    }

    /// Writes `value` under `key` through the gateway (what any etcd client could write).
    pub fn put_raw(&self, key: &[u8], value: &[u8], token: Option<&str>) {
        self.v3(
            "/v3/kv/put",
            &format!(
                "{{\"key\":\"{}\",\"value\":\"{}\"}}",
                base64(key),
                base64(value)
            ),
            token,
        );
    }

    /// Turns etcd's authentication on: a `root` user (password `root_password`) and a user
    /// `user` that may read and write only keys under `prefix`.
    pub fn enable_auth(&self, root_password: &str, user: &str, password: &str, prefix: &str) {
        let post = |path: &str, body: String| self.v3(path, &body, None);
        post(
            "/v3/auth/user/add",
            format!("{{\"name\":\"root\",\"password\":\"{root_password}\"}}"),
        );
        post(
            "/v3/auth/user/grant",
            "{\"user\":\"root\",\"role\":\"root\"}".into(),
        );
        post("/v3/auth/role/add", format!("{{\"name\":\"{user}-role\"}}"));
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        post(
            "/v3/auth/role/grant",
            format!(
                "{{\"name\":\"{user}-role\",\"perm\":{{\"permType\":\"READWRITE\",\
                 \"key\":\"{}\",\"range_end\":\"{}\"}}}}",
                base64(prefix.as_bytes()),
                base64(&end)
            ),
        );
        post(
            "/v3/auth/user/add",
            format!("{{\"name\":\"{user}\",\"password\":\"{password}\"}}"),
        );
        post(
            "/v3/auth/user/grant",
            format!("{{\"user\":\"{user}\",\"role\":\"{user}-role\"}}"),
        );
        post("/v3/auth/enable", "{}".into());
    }

    /// A token for `user` (after [`EtcdServer::enable_auth`]).
    pub fn token(&self, user: &str, password: &str) -> String {
        let body = self.v3(
            "/v3/auth/authenticate",
            &format!("{{\"name\":\"{user}\",\"password\":\"{password}\"}}"),
            None,
        );
        let at = body.find("\"token\":\"").expect("a token") + 9;
        body[at..].split('"').next().unwrap_or_default().to_string()
    }

    /// Kills etcd with SIGKILL (its data stays) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data (after [`EtcdServer::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA, a server certificate for `host` and a client certificate, in `dir` (openssl, P-256).
fn make_certs(dir: &Path, host: &str) -> TlsFiles {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("running openssl (needed for the TLS etcd): {e}"));
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=peercache-test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&ca);
    let san = if host.parse::<std::net::IpAddr>().is_ok() {
        format!("IP:{host}")
    } else {
        format!("DNS:{host}")
    };
    for (name, usage, alt) in [
        ("server", "serverAuth", Some(san.as_str())),
        ("client", "clientAuth", None),
    ] {
        let mut req = vec!["req"];
        req.extend(ec);
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let subj = format!("/CN=peercache-test-{name}");
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        run(&req);
        let ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n{}",
            alt.map(|a| format!("subjectAltName={a}\n"))
                .unwrap_or_default()
        );
        let ext_file = format!("{name}.ext");
        std::fs::write(dir.join(&ext_file), ext).expect("writing an openssl extension file");
        let pem = format!("{name}.pem");
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ]);
    }
    TlsFiles {
        ca: dir.join("ca.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
    }
}

/// Standard base64 (the gateway's encoding of keys and values).
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

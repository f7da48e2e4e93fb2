//! The HTTP listener of a node: serves one router on its own thread and runtime until shut
//! down (the routes are `observe`'s).
//!
//! The port needs no secret, so it must not let a stranger hold the node's descriptors: at
//! most [`HttpLimits::max_connections`] connections at once (the rest are closed at accept,
//! counted and logged at most once per 10 s), a request head must arrive whole within
//! [`HttpLimits::header_timeout`], and a connection that moves no byte for
//! [`HttpLimits::idle_timeout`] is closed.
//!
//! A finished connection is closed so its client reads the last answer: a request refused
//! before its body was read (413 on the length alone) leaves that body on the way, and closing
//! with unread bytes resets the connection, which can destroy the answer in the client's
//! buffers. So the node half-closes (the client sees the answer end) and reads on, discarding,
//! until the client closes, [`HttpLimits::linger_bytes`] arrived or
//! [`HttpLimits::linger_timeout`] passed, whichever comes first.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};

use super::listener::{Accepting, ServerThread, accept_loop};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one stranger may hold of the HTTP port.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HttpLimits {
    /// Most connections open at once.
    pub(crate) max_connections: usize,
    /// Longest time from a connection's first request byte (or its previous response) to a
    /// complete request head.
    pub(crate) header_timeout: Duration,
    /// Longest time a connection may move no byte in either direction.
    pub(crate) idle_timeout: Duration,
    /// Most bytes read and discarded after a connection's last answer.
    pub(crate) linger_bytes: usize,
    /// Longest time a connection is kept after its last answer for its client to close it.
    pub(crate) linger_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            linger_bytes: 8 << 20,
            linger_timeout: Duration::from_secs(2),
        }
    }
}

/// A node's HTTP endpoint.
pub(crate) struct HttpServer {
    pub(crate) addr: SocketAddr,
    thread: ServerThread,
}

impl HttpServer {
    /// Serves `app` on `bind` within `limits`; if that port is taken, on an ephemeral one (and
    /// says so).
    pub(crate) fn start(
        bind: SocketAddr,
        app: axum::Router,
        limits: HttpLimits,
        refused: metrics::Counter,
    ) -> std::io::Result<HttpServer> {
        let listener = match std::net::TcpListener::bind(bind) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                let any = SocketAddr::new(bind.ip(), 0);
                let l = std::net::TcpListener::bind(any)?;
                tracing::warn!(wanted = %bind, got = %l.local_addr()?, "metrics port taken; serving metrics on an ephemeral port");
                l
            }
            Err(e) => return Err(e),
        };
        let addr = listener.local_addr()?;
        let accepting = Accepting {
            max: limits.max_connections,
            what: "metrics HTTP port",
            refused,
        };
        let thread = ServerThread::spawn("pc-metrics-http", move |stop| {
            let service = hyper_util::service::TowerToHyperService::new(app);
            let each = stop.clone();
            accept_loop(listener, accepting, stop, move |sock| {
                serve_conn(sock, service.clone(), limits, each.clone())
            })
        })?;
        Ok(HttpServer { addr, thread })
    }

    pub(crate) fn shutdown(&mut self) {
        self.thread.shutdown();
    }
}

/// Serves one connection until the client closes it, it breaks a limit, or the node stops;
/// then closes it as [`linger`] does.
async fn serve_conn(
    sock: tokio::net::TcpStream,
    service: hyper_util::service::TowerToHyperService<axum::Router>,
    limits: HttpLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let io = TokioIo::new(Watched {
        inner: sock,
        epoch,
        last: last.clone(),
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .serve_connection(io, service)
        .without_shutdown();
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    let done = loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = tokio::time::Instant::from_std(epoch + since + idle);
        tokio::select! {
            done = conn.as_mut() => break done,
            _ = stop.changed() => return,
            _ = tokio::time::sleep_until(deadline) => {
                let moved = Duration::from_millis(last.load(Ordering::Relaxed));
                if moved == since {
                    tracing::debug!(idle_s = idle.as_secs_f64(), "closing an idle HTTP connection");
                    return;
                }
            }
        }
    };
    // An error (a broken head, the header timeout, a reset) ends the connection on the spot.
    if let Ok(parts) = done {
        tokio::select! {
            _ = linger(parts.io.into_inner().inner, limits.linger_bytes) => {}
            _ = tokio::time::sleep(limits.linger_timeout) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Half-closes `sock` after its last answer and reads on, discarding, until the client
/// closes or `cap` bytes arrived (the caller bounds the time): closing with unread bytes would
/// reset the connection and could destroy that answer before the client read it.
async fn linger(mut sock: tokio::net::TcpStream, cap: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if sock.shutdown().await.is_err() {
        return;
    }
    let mut left = cap;
    let mut sink = vec![0u8; (64 << 10).min(cap.max(1))];
    while left > 0 {
        match sock.read(&mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// A socket that records when it last moved a byte (milliseconds since `epoch`).
struct Watched {
    inner: tokio::net::TcpStream,
    epoch: Instant,
    last: Arc<AtomicU64>,
}

impl Watched {
    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn serve(app: axum::Router, limits: HttpLimits) -> HttpServer {
        HttpServer::start(
            "127.0.0.1:0".parse().unwrap(),
            app,
            limits,
            metrics::Counter::noop(),
        )
        .unwrap()
    }

    fn server(limits: HttpLimits) -> HttpServer {
        serve(
            axum::Router::new().route("/", axum::routing::get(|| async { "ok" })),
            limits,
        )
    }

    /// Reads until the server closes the connection or `within` passes; true if it closed.
    fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let until = Instant::now() + within;
        let mut buf = [0u8; 1024];
        while Instant::now() < until {
            match s.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return true,
            }
        }
        false
    }

    fn get(s: &mut TcpStream) -> String {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// A server with a route that takes at most 1 KiB of body.
    fn limited_server(limits: HttpLimits) -> HttpServer {
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() })
                .layer(axum::extract::DefaultBodyLimit::max(1024)),
        );
        serve(app, limits)
    }

    /// A connection to `srv` that has sent a request head announcing `len` bytes of body to
    /// `limited_server`'s route.
    fn announcing(srv: &HttpServer, len: usize) -> TcpStream {
        let mut s = TcpStream::connect(srv.addr).unwrap();
        let head = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s
    }

    /// Writes `chunk` every `pause` until a write fails; the bytes written by then.
    fn write_until_refused(
        s: &mut TcpStream,
        chunk: &[u8],
        pause: Duration,
        within: Duration,
    ) -> usize {
        let until = Instant::now() + within;
        let mut sent = 0;
        while Instant::now() < until {
            match s.write(chunk) {
                Ok(n) => sent += n,
                Err(_) => return sent,
            }
            std::thread::sleep(pause);
        }
        panic!("the server still took bytes after {within:?} ({sent} bytes)");
    }

    #[test]
    fn a_client_that_sends_a_refused_body_whole_reads_the_refusal() {
        let srv = limited_server(HttpLimits::default());
        let body = vec![b'x'; 4 << 20];
        for round in 0..20 {
            let mut s = announcing(&srv, body.len());
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(&body)
                .unwrap_or_else(|e| panic!("round {round}: writing the body: {e}"));
            let mut raw = Vec::new();
            s.read_to_end(&mut raw)
                .unwrap_or_else(|e| panic!("round {round}: reading the answer: {e}"));
            let answer = String::from_utf8_lossy(&raw);
            assert!(
                answer.starts_with("HTTP/1.1 413"),
                "round {round}: {answer}"
            );
        }
    }

    #[test]
    fn after_a_refusal_the_server_reads_on_only_within_its_linger_bounds() {
        // The time bound: a client trickling a body the server refused.
        let srv = limited_server(HttpLimits {
            linger_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        });
        let mut s = announcing(&srv, 1 << 30);
        s.write_all(&[b'x'; 2048]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        assert!(String::from_utf8_lossy(&raw).starts_with("HTTP/1.1 413"));
        let t0 = Instant::now();
        write_until_refused(
            &mut s,
            &[b'x'; 1024],
            Duration::from_millis(20),
            Duration::from_secs(5),
        );
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        // The byte bound: a client pouring a body out as fast as it can.
        let srv = limited_server(HttpLimits {
            linger_bytes: 1 << 20,
            linger_timeout: Duration::from_secs(60),
            ..HttpLimits::default()
        });
        let mut s = announcing(&srv, 1 << 30);
        let sent = write_until_refused(
            &mut s,
            &[b'x'; 64 << 10],
            Duration::ZERO,
            Duration::from_secs(20),
        );
        // What the socket buffers on both sides hold comes on top of the cap.
        assert!(sent < 64 << 20, "{sent} bytes taken");
    }

    #[test]
    fn a_trickled_request_head_is_cut_at_the_header_timeout() {
        let srv = server(HttpLimits {
            header_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        });
        let mut s = TcpStream::connect(srv.addr).unwrap();
        let t0 = Instant::now();
        let mut cut = false;
        for b in b"GET / HTTP/1.1\r\nHost: trickle\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa" {
            if s.write_all(&[*b]).is_err() || closed_within(&mut s, Duration::from_millis(100)) {
                cut = true;
                break;
            }
        }
        assert!(cut, "a head trickled for {:?} was still read", t0.elapsed());
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_silent_or_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
        let srv = server(HttpLimits {
            header_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_millis(300),
            ..HttpLimits::default()
        });
        let mut silent = TcpStream::connect(srv.addr).unwrap();
        let mut kept = TcpStream::connect(srv.addr).unwrap();
        assert!(get(&mut kept).contains("200 OK"));
        let t0 = Instant::now();
        assert!(closed_within(&mut silent, Duration::from_secs(3)));
        assert!(closed_within(&mut kept, Duration::from_secs(3)));
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    }

    #[test]
    fn connections_beyond_the_cap_are_refused_and_the_port_serves_once_they_go() {
        let srv = server(HttpLimits {
            max_connections: 4,
            ..HttpLimits::default()
        });
        let held: Vec<TcpStream> = (0..4)
            .map(|_| TcpStream::connect(srv.addr).unwrap())
            .collect();
        // The server accepts in arrival order: the fifth is closed at accept.
        let mut fifth = TcpStream::connect(srv.addr).unwrap();
        assert!(closed_within(&mut fifth, Duration::from_secs(3)));
        drop(held);
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let mut s = TcpStream::connect(srv.addr).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = vec![0u8; 1024];
            if matches!(s.read(&mut buf), Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("200 OK"))
            {
                break;
            }
            assert!(Instant::now() < until, "not served after the holders left");
        }
    }
}

//! The HTTP listener of a node: serves one router on its own thread and runtime until shut
//! down (the routes are `observe`'s).
//!
//! The port needs no secret, so it must not let a stranger hold the node's descriptors: at
//! most [`HttpLimits::max_connections`] connections at once (the rest are closed at accept,
//! counted and logged at most once per 10 s), a request head must arrive whole within
//! [`HttpLimits::header_timeout`], and a connection that moves no byte for
//! [`HttpLimits::idle_timeout`] is closed.

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
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_connections: 64,
            header_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
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

/// Serves one connection until the client closes it, it breaks a limit, or the node stops.
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
        .serve_connection(io, service);
    tokio::pin!(conn);
    let idle = limits.idle_timeout;
    loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = tokio::time::Instant::from_std(epoch + since + idle);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = stop.changed() => return,
            _ = tokio::time::sleep_until(deadline) => {
                let moved = Duration::from_millis(last.load(Ordering::Relaxed));
                if moved == since {
                    tracing::debug!(idle_s = idle.as_secs_f64(), "closing an idle HTTP connection");
                    return;
                }
            }
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

    fn server(limits: HttpLimits) -> HttpServer {
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        HttpServer::start(
            "127.0.0.1:0".parse().unwrap(),
            app,
            limits,
            metrics::Counter::noop(),
        )
        .unwrap()
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

//! The HTTP listener of a node: serves one router on its own thread and runtime until shut
//! down (the routes are `observe.rs`'s).

use std::net::SocketAddr;

/// A node's HTTP endpoint.
pub(crate) struct HttpServer {
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `app` on `bind`; if that port is taken, on an ephemeral one (and says so).
    pub(crate) fn start(bind: SocketAddr, app: axum::Router) -> std::io::Result<HttpServer> {
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
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("pc-metrics-http".into())
            .spawn(move || {
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async move {
                            let _ = rx.await;
                        })
                        .await;
                });
            })?;
        Ok(HttpServer {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

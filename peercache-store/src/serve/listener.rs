//! What the node's listeners that are not RPC servers share — the HTTP port and the KV-event
//! ports: a thread with its own runtime that ends when told to ([`ServerThread`]), and the
//! accept loop ([`accept_loop`]): at most [`Accepting::max`] connections at once (the rest
//! are closed at accept, counted, and logged at most once per 10 s), accept errors backed
//! off, every connection's task ended when the listener stops.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// A listener's own thread and single-threaded runtime.
pub(crate) struct ServerThread {
    stop: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Runs `run(stop)` on a new thread named `name` until it returns; `stop` changes when
    /// [`ServerThread::shutdown`] is called.
    pub(crate) fn spawn<F, Fut>(name: &str, run: F) -> std::io::Result<ServerThread>
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let (tx, rx) = watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || rt.block_on(run(rx)))?;
        Ok(ServerThread {
            stop: Some(tx),
            thread: Some(thread),
        })
    }

    /// Tells the listener to stop and waits for its thread.
    pub(crate) fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How many connections a listener serves at once, and how it reports the rest.
pub(crate) struct Accepting {
    /// Most connections open at once.
    pub(crate) max: usize,
    /// The port, as the log names it ("metrics HTTP port").
    pub(crate) what: &'static str,
    /// Connections closed at accept because `max` were open.
    pub(crate) refused: metrics::Counter,
}

/// Accepts connections on `listener` and runs `serve(connection)` for each, within
/// `accepting`, until `stop` changes.
pub(crate) async fn accept_loop<F, Fut>(
    listener: std::net::TcpListener,
    accepting: Accepting,
    mut stop: watch::Receiver<bool>,
    mut serve: F,
) where
    F: FnMut(tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, port = accepting.what, "cannot serve");
            return;
        }
    };
    let live = Arc::new(tokio::sync::Semaphore::new(accepting.max.max(1)));
    let mut backoff = peercache_wire::limits::AcceptBackoff::new();
    let at_limit = peercache_wire::limits::Throttle::new();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => break,
        };
        let sock = match accepted {
            Ok((sock, _)) => {
                backoff.accepted();
                sock
            }
            Err(e) => {
                let pause = backoff.failed(&e, accepting.what);
                if !pause.is_zero() {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => break,
                    }
                }
                continue;
            }
        };
        let Ok(permit) = live.clone().try_acquire_owned() else {
            accepting.refused.increment(1);
            if let Some(held) = at_limit.admit() {
                tracing::warn!(
                    port = accepting.what,
                    limit = accepting.max,
                    refused_since_last = held,
                    "at its connection limit; refusing connections"
                );
            }
            continue;
        };
        // Finished connections are reaped as new ones come, so the set stays as small as the
        // live connections.
        while conns.try_join_next().is_some() {}
        let conn = serve(sock);
        conns.spawn(async move {
            let _permit = permit;
            conn.await;
        });
    }
    conns.abort_all();
}

//! [`RpcServer`]: accepts connections, runs the handshake, answers each request frame with
//! the handler's reply frame.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio_util::codec::Framed;

use crate::budgeted::{BudgetedCodec, OverBudget};
use crate::envelope::{self, Envelope};
use crate::frame;
use crate::handshake::{self, Acceptor, Plane};
use crate::seal::TAG_BYTES;
use crate::tally::Tally;
use crate::{Auth, Incarnation, NodeId, WireError};

use super::{
    CONNECTIONS_REFUSED_TOTAL, FRAME_BUDGET_REFUSED_TOTAL, HANDSHAKE_FAILURES_TOTAL, Handler,
    MALFORMED_FRAMES_TOTAL, Peer, Reply, RpcError, SEALED_REFUSED_TOTAL, Shares,
};

/// Settings of an [`RpcServer`].
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Address to bind.
    pub bind: SocketAddr,
    /// Planes accepted in the handshake.
    pub planes: Vec<Plane>,
    /// This node, announced in the handshake.
    pub node: Option<NodeId>,
    /// This process's incarnation.
    pub incarnation: Incarnation,
    /// Largest request frame.
    pub max_frame: usize,
    /// Handshake deadline.
    pub handshake_timeout: Duration,
    /// Most concurrent connections.
    pub max_connections: usize,
    /// Request kinds whose handler may wait on other nodes: they run on a blocking thread,
    /// so the server's workers keep serving every other request meanwhile.
    pub offload: &'static [u16],
    /// Runtime worker threads.
    pub workers: usize,
    /// Thread name prefix.
    pub name: &'static str,
    /// Cluster authentication required of every connection.
    pub auth: Auth,
    /// Optional shares of the connection cap per source and of the process's frame budget.
    pub shares: Shares,
}

/// Counters of a server.
#[derive(Debug)]
pub struct ServerCounters {
    /// Requests answered (`peercache_rpc_requests_total`).
    pub requests: Tally,
    /// Connections closed because a frame was malformed or oversize
    /// ([`MALFORMED_FRAMES_TOTAL`]).
    pub malformed: Tally,
    /// Handshakes refused or failed ([`HANDSHAKE_FAILURES_TOTAL`]).
    pub handshake_failures: Tally,
    /// Connections closed at accept: the server at its cap ([`CONNECTIONS_REFUSED_TOTAL`],
    /// `reason="limit"`).
    pub refused_at_limit: Tally,
    /// Connections closed at accept: their source at its share (`reason="source"`).
    pub refused_source: Tally,
    /// Connections closed for a frame past the frame budget ([`FRAME_BUDGET_REFUSED_TOTAL`]).
    pub over_budget: Tally,
    /// Connections closed for a sealed frame that failed its integrity check
    /// ([`SEALED_REFUSED_TOTAL`], `at` = the server's name).
    pub sealed_refused: Tally,
}

/// A running RPC server. Dropping it stops it.
///
/// # Example
///
/// A typed request/reply service on loopback with cluster authentication: a client holding
/// the secret is answered, one with another secret is refused at the handshake.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use peercache_wire::handshake::{Hello, Plane};
/// use peercache_wire::rpc::{self, Reply, RpcClient, RpcServer, ServerConfig};
/// use peercache_wire::{envelope, Auth, Incarnation, Message};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Ping(u32);
/// impl Message for Ping { const KIND: u16 = 0x03f0; const NAME: &'static str = "Ping"; }
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Pong(u32);
/// impl Message for Pong { const KIND: u16 = 0x03f1; const NAME: &'static str = "Pong"; }
///
/// let secret = Auth::from_secret(b"sixteen-byte-secret!")?;
/// let handler: rpc::Handler = Arc::new(|_peer, env| {
///     let Ping(n) = env.decode().expect("a Ping");
///     Reply::Frame(envelope::encode(&Pong(n + 1), &[]).expect("encodes"))
/// });
/// let server = RpcServer::start(
///     ServerConfig {
///         bind: "127.0.0.1:0".parse().unwrap(),
///         planes: vec![Plane::Control],
///         node: None,
///         incarnation: Incarnation(1),
///         max_frame: 1 << 20,
///         handshake_timeout: Duration::from_secs(2),
///         max_connections: 16,
///         offload: &[],
///         workers: 1,
///         name: "doc",
///         auth: secret.clone(),
///         shares: Default::default(),
///     },
///     handler,
/// )?;
/// let client = |auth: Auth| {
///     RpcClient::new(rpc::ClientConfig {
///         hello: Hello::new(Plane::Control, None, Incarnation(2)),
///         max_idle_per_peer: 2,
///         max_frame: 1 << 20,
///         auth,
///     })
/// };
/// let request = envelope::encode(&Ping(41), &[])?;
/// let deadline = Duration::from_secs(2);
///
/// let reply = client(secret).call(server.local_addr(), &request, deadline)?;
/// assert_eq!(rpc::decode_reply::<Pong>(&reply)?, Pong(42));
///
/// let stranger = client(Auth::from_secret(b"another-secret-value")?);
/// assert!(stranger.call(server.local_addr(), &request, deadline).is_err());
/// # Ok::<(), peercache_wire::WireError>(())
/// ```
pub struct RpcServer {
    addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Arc<tokio::sync::Notify>,
    stopped: Arc<AtomicBool>,
    counters: Arc<ServerCounters>,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl RpcServer {
    /// Binds and starts serving with `handler`.
    pub fn start(cfg: ServerConfig, handler: Handler) -> Result<RpcServer, WireError> {
        // One worker: a current-thread runtime on a dedicated thread (no cross-thread wake-ups
        // on the request path). More: a multi-thread runtime.
        let runtime = if cfg.workers <= 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cfg.workers)
                .thread_name(cfg.name)
                .enable_all()
                .build()?
        };
        let listener = runtime.block_on(tokio::net::TcpListener::bind(cfg.bind))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(ServerCounters {
            requests: Tally::new(
                metrics::counter!(crate::metrics::RPC_REQUESTS_TOTAL, "server" => cfg.name),
            ),
            malformed: Tally::new(metrics::counter!(MALFORMED_FRAMES_TOTAL, "server" => cfg.name)),
            handshake_failures: Tally::new(
                metrics::counter!(HANDSHAKE_FAILURES_TOTAL, "server" => cfg.name),
            ),
            refused_at_limit: Tally::new(metrics::counter!(
                CONNECTIONS_REFUSED_TOTAL, "server" => cfg.name, "reason" => "limit"
            )),
            refused_source: Tally::new(metrics::counter!(
                CONNECTIONS_REFUSED_TOTAL, "server" => cfg.name, "reason" => "source"
            )),
            over_budget: Tally::new(
                metrics::counter!(FRAME_BUDGET_REFUSED_TOTAL, "server" => cfg.name),
            ),
            sealed_refused: Tally::new(metrics::counter!(SEALED_REFUSED_TOTAL, "at" => cfg.name)),
        });
        let live = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections.max(1)));
        let (stop2, stopped2, counters2) = (stop.clone(), stopped.clone(), counters.clone());
        let name = cfg.name;
        let accept_loop = async move {
            let mut backoff = crate::limits::AcceptBackoff::new();
            let at_limit = crate::limits::Throttle::new();
            let at_share = crate::limits::Throttle::new();
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = stop2.notified() => break,
                };
                let (sock, addr) = match accepted {
                    Ok((sock, addr)) => {
                        backoff.accepted();
                        (sock, addr)
                    }
                    Err(e) => {
                        let pause = backoff.failed(&e, cfg.name);
                        if !pause.is_zero() {
                            tokio::select! {
                                _ = tokio::time::sleep(pause) => {}
                                _ = stop2.notified() => break,
                            }
                        }
                        continue;
                    }
                };
                let Ok(permit) = live.clone().try_acquire_owned() else {
                    counters2.refused_at_limit.add(1);
                    if let Some(held) = at_limit.admit() {
                        tracing::warn!(
                            server = cfg.name,
                            limit = cfg.max_connections,
                            refused_since_last = held,
                            "rpc server at its connection limit; refusing connections"
                        );
                    }
                    continue;
                };
                let slot = match &cfg.shares.per_source {
                    None => None,
                    Some(share) => match share.admit(addr.ip()) {
                        Some(slot) => Some(slot),
                        None => {
                            counters2.refused_source.add(1);
                            if let Some(held) = at_share.admit() {
                                tracing::warn!(
                                    server = cfg.name,
                                    source = %addr.ip(),
                                    share = share.max(),
                                    refused_since_last = held,
                                    "a source address holds its share of the connections; \
                                     refusing its connections"
                                );
                            }
                            continue;
                        }
                    },
                };
                let _ = sock.set_nodelay(true);
                let (cfg, handler, counters, stopped) = (
                    cfg.clone(),
                    handler.clone(),
                    counters2.clone(),
                    stopped2.clone(),
                );
                tokio::spawn(async move {
                    let _held = (permit, slot);
                    serve_conn(sock, addr, &cfg, &handler, &counters, &stopped).await;
                });
            }
        };
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(accept_loop);
                runtime.shutdown_timeout(Duration::from_millis(500));
            })?;
        Ok(RpcServer {
            addr,
            thread: Some(thread),
            stop,
            stopped,
            counters,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Counters.
    pub fn counters(&self) -> &ServerCounters {
        &self.counters
    }

    /// Stops accepting and closes every connection. Idempotent.
    pub fn shutdown(&mut self) {
        self.stopped.store(true, Ordering::Release);
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One "over the frame budget" line per period, process-wide.
static OVER_BUDGET_LOG: crate::limits::Throttle = crate::limits::Throttle::new();
/// One "sealed frame refused" line per period, process-wide.
static SEAL_LOG: crate::limits::Throttle = crate::limits::Throttle::new();

async fn serve_conn(
    sock: tokio::net::TcpStream,
    addr: SocketAddr,
    cfg: &ServerConfig,
    handler: &Handler,
    counters: &ServerCounters,
    stopped: &AtomicBool,
) {
    // Until the peer has proven the secret, frames are capped at the handshake's own small
    // limit: a stranger cannot make the server buffer `max_frame` bytes.
    let mut framed = Framed::new(sock, frame::codec(handshake::MAX_HANDSHAKE_FRAME));
    let acceptor = Acceptor {
        planes: cfg.planes.clone(),
        node: cfg.node.clone(),
        incarnation: cfg.incarnation,
        auth: cfg.auth.clone(),
    };
    let established =
        match handshake::server_async(&mut framed, &acceptor, cfg.handshake_timeout).await {
            Ok(h) => h,
            Err(e) => {
                counters.handshake_failures.add(1);
                tracing::debug!(error = %e, "rpc handshake failed");
                return;
            }
        };
    let hello = &established.hello;
    let peer = Peer {
        node: hello.node.clone(),
        incarnation: hello.incarnation,
        addr,
        authenticated: cfg.auth.is_enabled(),
        grant: established.grant,
        verified: established.verified,
    };
    let mut sealed = established.channel.map(|k| k.server());
    let tag = if sealed.is_some() { TAG_BYTES } else { 0 };
    framed.codec_mut().set_max_frame_length(cfg.max_frame + tag);
    let budget = cfg.shares.frame_budget.clone();
    let mut framed = framed.map_codec(|c| BudgetedCodec::new(c, budget));
    while let Some(next) = framed.next().await {
        let frame = match next {
            Ok(mut frame) => match sealed.as_mut() {
                None => frame,
                Some((_, rx)) => match rx.open_in_place(&mut frame) {
                    Ok(n) => {
                        frame.truncate(n);
                        frame
                    }
                    Err(e) => {
                        counters.sealed_refused.add(1);
                        if let Some(held) = SEAL_LOG.admit() {
                            tracing::warn!(
                                server = cfg.name,
                                peer = %peer.label(),
                                error = %e,
                                refused_since_last = held,
                                "a sealed frame failed its integrity check; closing its connection"
                            );
                        }
                        return;
                    }
                },
            },
            Err(e) => {
                match e.get_ref().and_then(|e| e.downcast_ref::<OverBudget>()) {
                    Some(over) => {
                        counters.over_budget.add(1);
                        if let Some(held) = OVER_BUDGET_LOG.admit() {
                            tracing::warn!(
                                server = cfg.name,
                                peer = %peer.label(),
                                frame = over.len,
                                held = over.held,
                                budget = over.cap,
                                refused_since_last = held,
                                "a frame does not fit in the frame budget; closing its connection"
                            );
                        }
                    }
                    // Oversize or broken framing: the stream cannot be trusted.
                    None => counters.malformed.add(1),
                }
                return;
            }
        };
        if stopped.load(Ordering::Acquire) {
            return;
        }
        let (reply, close) = match Envelope::parse(&frame) {
            Err(e) => (error_frame(RpcError::CODE_MALFORMED, e.to_string()), true),
            Ok(env) if cfg.offload.contains(&env.kind) => {
                // May wait on other nodes: off the runtime, so this server keeps answering the
                // requests that never wait (two nodes doing this for each other cannot
                // deadlock).
                let (handler, peer, frame) = (handler.clone(), peer.clone(), frame.freeze());
                match tokio::task::spawn_blocking(move || answer(&handler, &peer, &frame)).await {
                    Ok(r) => r,
                    Err(_) => (
                        error_frame(RpcError::CODE_REFUSED, "request handler failed".into()),
                        true,
                    ),
                }
            }
            Ok(env) => reply_frame(handler(&peer, env)),
        };
        counters.requests.add(1);
        if close {
            counters.malformed.add(1);
        }
        let mut reply = reply;
        if let Some((tx, _)) = sealed.as_mut()
            && tx.seal_in_place(&mut reply, 0).is_err()
        {
            return;
        }
        if framed.send(Bytes::from(reply)).await.is_err() || close {
            return;
        }
    }
}

/// One request's reply frame, and whether to close the connection after it.
fn answer(handler: &Handler, peer: &Peer, frame: &[u8]) -> (Vec<u8>, bool) {
    match Envelope::parse(frame) {
        Err(e) => (error_frame(RpcError::CODE_MALFORMED, e.to_string()), true),
        Ok(env) => reply_frame(handler(peer, env)),
    }
}

/// A handler's reply as a frame, and whether to close the connection after it.
fn reply_frame(reply: Reply) -> (Vec<u8>, bool) {
    match reply {
        Reply::Frame(f) => (f, false),
        Reply::Error { error, close } => (envelope::encode(&error, &[]).unwrap_or_default(), close),
    }
}

fn error_frame(code: u16, message: String) -> Vec<u8> {
    envelope::encode(&RpcError { code, message }, &[]).unwrap_or_default()
}

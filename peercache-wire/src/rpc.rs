//! Request/response RPC on framed, handshaken connections — the shape every control plane
//! (discovery, directory, store control) shares.
//!
//! * [`RpcServer`]: a small tokio runtime that accepts connections, runs the handshake, and
//!   answers each request frame with the handler's reply frame. A frame the handler cannot
//!   decode gets an [`RpcError`] reply and the connection is closed (the stream is not trusted
//!   any more); the server and every other connection keep going.
//! * [`RpcClient`]: a blocking client with a per-peer connection pool and a deadline on every
//!   call; [`RpcClient::call_many`] writes requests to several peers before reading any reply,
//!   so fan-out costs one round trip, not one per peer.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio_util::codec::Framed;

use crate::budgeted::{BudgetedCodec, OverBudget};
use crate::envelope::{self, Envelope, Message};
use crate::frame;
use crate::handshake::{self, Acceptor, Hello, Plane};
use crate::seal::{Opener, Sealer, TAG_BYTES};
use crate::{Auth, Incarnation, NodeId, WireError};

/// A generic error reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcError {
    /// Machine-readable code (see the `CODE_*` constants).
    pub code: u16,
    /// Human-readable detail.
    pub message: String,
}

impl RpcError {
    /// The request did not decode.
    pub const CODE_MALFORMED: u16 = 1;
    /// The request kind is not served here.
    pub const CODE_UNKNOWN_KIND: u16 = 2;
    /// The request was valid but refused (limits, state).
    pub const CODE_REFUSED: u16 = 3;
    /// The server is shutting down.
    pub const CODE_SHUTDOWN: u16 = 4;
    /// The request acts for another member than the one this connection belongs to (see
    /// [`Peer`]): refused, counted in [`IDENTITY_REFUSED_TOTAL`].
    pub const CODE_FORBIDDEN: u16 = 5;
}

impl Message for RpcError {
    const KIND: u16 = 0x0003;
    const NAME: &'static str = "RpcError";
}

/// What a handler returns: a reply frame, or an error reply (and whether to close).
pub enum Reply {
    /// An encoded reply envelope.
    Frame(Vec<u8>),
    /// Answer with an [`RpcError`]; `close` drops the connection afterwards.
    Error {
        /// The error to send.
        error: RpcError,
        /// Close the connection after sending.
        close: bool,
    },
}

/// Who is on the other end of a connection, as its handshake established it.
///
/// With a cluster secret, `authenticated` is true and the peer has proven it is a **member**;
/// `node` is the id that member claimed in its Hello (covered by its proof, so it cannot be
/// changed on the way, but every member could claim any id — the secret proves membership,
/// not identity). Services bind the connection to that claim: a request that acts for
/// another node is refused with [`RpcError::CODE_FORBIDDEN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The node id the peer announced (None: a tool such as `status` or the bench driver).
    pub node: Option<NodeId>,
    /// The peer's incarnation.
    pub incarnation: Incarnation,
    /// Where the connection comes from.
    pub addr: SocketAddr,
    /// Whether the peer proved the cluster secret (false in an open cluster).
    pub authenticated: bool,
    /// What its proof granted: [`Grant::ReadOnly`](crate::auth::Grant::ReadOnly) for a
    /// read-only client token, on a server whose `auth` accepts one.
    pub grant: crate::auth::Grant,
    /// Whether the peer proved `node` with a node certificate ([`crate::identity`]); without
    /// one `node` is the peer's claim.
    pub verified: bool,
}

impl Peer {
    /// Whether this connection belongs to `node`.
    pub fn is(&self, node: &NodeId) -> bool {
        self.node.as_ref() == Some(node)
    }

    /// Whether this connection belongs to `node` in its life `incarnation`.
    pub fn is_life(&self, node: &NodeId, incarnation: Incarnation) -> bool {
        self.is(node) && self.incarnation == incarnation
    }

    /// The peer for display: its node id, or `anonymous@addr`.
    pub fn label(&self) -> String {
        match &self.node {
            Some(n) => n.to_string(),
            None => format!("anonymous@{}", self.addr),
        }
    }
}

/// The reply refusing a request that acts for another node than `peer`.
pub fn forbidden(peer: &Peer, what: &str) -> Reply {
    Reply::Error {
        error: RpcError {
            code: RpcError::CODE_FORBIDDEN,
            message: format!(
                "{what}: this connection belongs to {}, and a member may act only for itself",
                peer.label()
            ),
        },
        close: false,
    }
}

/// The request handler of a server: called with the connection's [`Peer`] and the request.
pub type Handler = Arc<dyn Fn(&Peer, Envelope<'_>) -> Reply + Send + Sync>;

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

pub use crate::metrics::{
    CONNECTIONS_REFUSED_TOTAL, FRAME_BUDGET_REFUSED_TOTAL, HANDSHAKE_FAILURES_TOTAL,
    IDENTITY_REFUSED_TOTAL, MALFORMED_FRAMES_TOTAL, SEALED_REFUSED_TOTAL,
};
pub use crate::shares::Shares;
use crate::tally::Tally;

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

/// Decodes a reply frame as `M`; an [`RpcError`] reply becomes [`WireError::Remote`].
pub fn decode_reply<M: Message>(frame: &[u8]) -> Result<M, WireError> {
    let env = Envelope::parse(frame)?;
    if env.kind == RpcError::KIND {
        let e: RpcError = env.decode()?;
        return Err(WireError::Remote {
            code: e.code,
            message: e.message,
        });
    }
    env.decode()
}

/// How long a reply is still awaited after a fan-out's deadline passed while an earlier peer
/// was being waited for.
const REPLY_GRACE: Duration = Duration::from_millis(2);

/// Settings of an [`RpcClient`].
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The hello sent on every new connection.
    pub hello: Hello,
    /// Idle connections kept per peer.
    pub max_idle_per_peer: usize,
    /// Largest reply frame accepted.
    pub max_frame: usize,
    /// Cluster authentication used on every new connection.
    pub auth: Auth,
}

/// A blocking RPC client with pooled connections.
#[derive(Debug)]
pub struct RpcClient {
    cfg: ClientConfig,
    pools: RwLock<HashMap<SocketAddr, Arc<Mutex<Vec<Conn>>>>>,
    suspect_for: Duration,
    suspects: Mutex<HashMap<SocketAddr, Instant>>,
}

impl RpcClient {
    /// A client with no connections yet.
    pub fn new(cfg: ClientConfig) -> Self {
        RpcClient {
            cfg,
            pools: RwLock::new(HashMap::new()),
            suspect_for: Duration::ZERO,
            suspects: Mutex::new(HashMap::new()),
        }
    }

    /// After a peer times out, fail calls to it fast for `d` instead of waiting again (0: off).
    pub fn with_suspect_for(mut self, d: Duration) -> Self {
        self.suspect_for = d;
        self
    }

    fn suspect_remaining(&self, peer: SocketAddr) -> Option<Duration> {
        if self.suspect_for.is_zero() {
            return None;
        }
        let mut s = self.suspects.lock();
        let until = *s.get(&peer)?;
        let now = Instant::now();
        if until > now {
            Some(until - now)
        } else {
            s.remove(&peer);
            None
        }
    }

    fn mark_suspect(&self, peer: SocketAddr) {
        if !self.suspect_for.is_zero() {
            self.suspects
                .lock()
                .insert(peer, Instant::now() + self.suspect_for);
            tracing::warn!(%peer, suspect_for = ?self.suspect_for, "control peer timed out; marked suspect");
        }
    }

    fn pool(&self, peer: SocketAddr) -> Arc<Mutex<Vec<Conn>>> {
        if let Some(p) = self.pools.read().get(&peer) {
            return p.clone();
        }
        self.pools.write().entry(peer).or_default().clone()
    }

    /// A pooled connection (`true`) or a new one (`false`).
    fn checkout(&self, peer: SocketAddr, deadline: Instant) -> Result<(Conn, bool), WireError> {
        if let Some(s) = self.pool(peer).lock().pop() {
            return Ok((s, true));
        }
        Ok((self.fresh(peer, deadline)?, false))
    }

    fn checkin(&self, peer: SocketAddr, s: Conn) {
        let pool = self.pool(peer);
        let mut idle = pool.lock();
        if idle.len() < self.cfg.max_idle_per_peer {
            idle.push(s);
        }
    }

    /// Drops pooled connections to `peer`.
    pub fn forget(&self, peer: SocketAddr) {
        self.pools.write().remove(&peer);
    }

    /// One request, one reply, within `timeout`.
    pub fn call(
        &self,
        peer: SocketAddr,
        request: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, WireError> {
        self.call_many(&[(peer, request)], timeout)
            .pop()
            .unwrap_or(Err(WireError::Closed))
    }

    /// Sends every request first, then reads every reply: the calls overlap. Each result is
    /// independent; all share one deadline. A pooled connection the peer closed meanwhile is
    /// replaced once (requests of every PeerCache plane are idempotent).
    pub fn call_many(
        &self,
        calls: &[(SocketAddr, &[u8])],
        timeout: Duration,
    ) -> Vec<Result<Vec<u8>, WireError>> {
        self.call_many_then(calls, timeout, || {})
    }

    /// [`Self::call_many`], running `meanwhile` once every request is sent and before the
    /// first reply is read: local work that overlaps the round trips instead of preceding
    /// them (a directory fan-out answers its own shard's keys there). `meanwhile`'s time
    /// counts against the same deadline.
    pub fn call_many_then(
        &self,
        calls: &[(SocketAddr, &[u8])],
        timeout: Duration,
        meanwhile: impl FnOnce(),
    ) -> Vec<Result<Vec<u8>, WireError>> {
        let deadline = Instant::now() + timeout;
        let mut conns: Vec<Result<(Conn, bool), WireError>> = calls
            .iter()
            .map(|(peer, req)| {
                if let Some(remaining) = self.suspect_remaining(*peer) {
                    return Err(WireError::PeerSuspect {
                        peer: *peer,
                        remaining,
                    });
                }
                let (mut s, reused) = self.checkout(*peer, deadline)?;
                match s.send(deadline, req) {
                    Ok(()) => Ok((s, reused)),
                    Err(_) if reused => {
                        let mut s = self.fresh(*peer, deadline)?;
                        s.send(deadline, req)?;
                        Ok((s, false))
                    }
                    Err(e) => Err(e),
                }
            })
            .collect();
        meanwhile();
        let mut out = Vec::with_capacity(calls.len());
        for (i, c) in conns.iter_mut().enumerate() {
            let (peer, req) = calls[i];
            // Replies are read in order: a peer that used up the deadline must not make the
            // ones after it (whose replies are already buffered) look timed out too.
            let read_by = deadline.max(Instant::now() + REPLY_GRACE);
            let mut res = match c {
                Err(e) => Err(std::mem::replace(e, WireError::Closed)),
                Ok((s, _)) => self.read_reply(s, read_by, timeout),
            };
            let reused = matches!(c, Ok((_, true)));
            if reused && matches!(res, Err(WireError::Closed) | Err(WireError::Io(_))) {
                res = self.fresh(peer, deadline).and_then(|mut s| {
                    s.send(deadline, req)?;
                    let r = self.read_reply(&mut s, deadline, timeout);
                    if r.as_ref().is_ok_and(|f| !is_error_reply(f)) {
                        self.checkin(peer, s);
                    }
                    r
                });
            } else if res.as_ref().is_ok_and(|f| !is_error_reply(f))
                && let Ok((s, _)) = std::mem::replace(c, Err(WireError::Closed))
            {
                self.checkin(peer, s);
            }
            if matches!(res, Err(WireError::Timeout(_))) {
                self.mark_suspect(peer);
            }
            out.push(res);
        }
        out
    }

    fn read_reply(
        &self,
        s: &mut Conn,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Vec<u8>, WireError> {
        match s.recv(deadline, self.cfg.max_frame) {
            Err(WireError::Timeout(_)) => Err(WireError::Timeout(timeout)),
            r => r,
        }
    }

    fn fresh(&self, peer: SocketAddr, deadline: Instant) -> Result<Conn, WireError> {
        let left = remaining(deadline)?;
        let mut s = TcpStream::connect_timeout(&peer, left).map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                WireError::Timeout(left)
            }
            _ => WireError::Io(e),
        })?;
        s.set_nodelay(true)?;
        let accepted = handshake::client_sync(
            &mut s,
            &self.cfg.hello,
            &self.cfg.auth,
            remaining(deadline)?,
        )?;
        Ok(Conn {
            stream: s,
            armed: None,
            ahead: frame::ReadAhead::default(),
            sealed: accepted.channel.map(|k| SealedConn::new(k.client())),
        })
    }
}

/// An error reply may come with the server closing the connection: never pool it.
fn is_error_reply(frame: &[u8]) -> bool {
    Envelope::parse(frame).map_or(true, |e| e.kind == RpcError::KIND)
}

fn remaining(deadline: Instant) -> Result<Duration, WireError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(WireError::Timeout(Duration::ZERO))
    } else {
        Ok(left)
    }
}

/// A pooled connection, the socket timeout currently set on it and its read-ahead.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    armed: Option<Duration>,
    /// Reads each reply with one `recv` when it is small.
    ahead: frame::ReadAhead,
    /// Present when the handshake agreed to seal this connection.
    sealed: Option<SealedConn>,
}

/// One sealed connection's two directions and a request buffer reused across calls.
#[derive(Debug)]
struct SealedConn {
    tx: Sealer,
    rx: Opener,
    out: Vec<u8>,
}

impl SealedConn {
    fn new((tx, rx): (Sealer, Opener)) -> Self {
        SealedConn {
            tx,
            rx,
            out: Vec::new(),
        }
    }
}

/// Opens a sealed reply frame in place, counting one that fails its check (`at="rpc-reply"`).
fn open_frame(rx: &mut Opener, frame: &mut [u8]) -> Result<usize, WireError> {
    rx.open_in_place(frame).inspect_err(|_| {
        metrics::counter!(SEALED_REFUSED_TOTAL, "at" => "rpc-reply").increment(1);
    })
}

impl Conn {
    /// The connection bounded by `deadline` in total, every read and write included: a peer
    /// that trickles its reply cannot hold the caller past it. The socket timeouts are touched
    /// (two syscalls) only when they drift from the time left: once per connection in steady
    /// state instead of twice per call.
    fn io(&mut self, deadline: Instant) -> frame::Deadlined<'_> {
        frame::Deadlined::new(&self.stream, deadline, &mut self.armed)
    }

    /// Sends one request frame (sealed when the connection is).
    fn send(&mut self, deadline: Instant, req: &[u8]) -> Result<(), WireError> {
        let Some(mut sealed) = self.sealed.take() else {
            return frame::write_frame(&mut self.io(deadline), req);
        };
        sealed.out.clear();
        sealed.out.extend_from_slice(req);
        let res = sealed
            .tx
            .seal_in_place(&mut sealed.out, 0)
            .and_then(|()| frame::write_frame(&mut self.io(deadline), &sealed.out));
        self.sealed = Some(sealed);
        res
    }

    /// Reads one reply frame of at most `max` bytes (opened when the connection is sealed).
    fn recv(&mut self, deadline: Instant, max: usize) -> Result<Vec<u8>, WireError> {
        let mut buf = Vec::new();
        let limit = max + if self.sealed.is_some() { TAG_BYTES } else { 0 };
        let mut io = frame::Deadlined::new(&self.stream, deadline, &mut self.armed);
        self.ahead.read_frame(&mut io, limit, &mut buf)?;
        if let Some(sealed) = self.sealed.as_mut() {
            let n = open_frame(&mut sealed.rx, &mut buf)?;
            buf.truncate(n);
        }
        Ok(buf)
    }
}

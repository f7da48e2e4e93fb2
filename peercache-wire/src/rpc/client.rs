//! [`RpcClient`]: a blocking client with a per-peer connection pool, a deadline on every call,
//! and fan-out that writes every request before it reads any reply.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::envelope::{Envelope, Message};
use crate::frame;
use crate::handshake::{self, Hello};
use crate::{Auth, WireError};

use super::RpcError;
use super::conn::{Conn, SealedConn};

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

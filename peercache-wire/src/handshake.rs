//! The connection handshake every PeerCache connection starts with.
//!
//! The client sends [`Hello`] (the version range it speaks, which plane it wants, who it is);
//! the server answers [`HelloReply::Accept`] with the chosen version, or
//! [`HelloReply::Reject`] with a reason, before any request is served. With a cluster secret
//! ([`Auth`]) a mutual challenge–response runs between the two (see [`crate::auth`]): the client's
//! nonce travels in a non-critical envelope extension of the Hello, so version-1 messages are
//! unchanged and an open cluster works exactly as before.
//!
//! [`ClientHandshake`] and [`ServerHandshake`] are the sans-IO state machines; the `*_sync` and
//! `*_async` functions drive them over blocking and tokio sockets under one deadline.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::auth::{self, Auth, Side, TAG_LEN};
use crate::envelope::{self, Envelope, Extension, MIN_WIRE_VERSION, Message, WIRE_VERSION};
use crate::frame::Deadlined;
use crate::{Incarnation, NodeId, WireError};

/// Envelope extension of a [`Hello`] carrying the client's 32-byte authentication nonce.
/// Not critical: a server without a secret ignores it (and the client then refuses that
/// server, which cannot prove the secret).
pub const EXT_AUTH_NONCE: u16 = 0x0010;

/// Largest handshake frame.
pub const MAX_HANDSHAKE_FRAME: usize = 4096;

/// Reject reasons that start with this are authentication failures.
const AUTH_REASON_PREFIX: &str = "authentication";

/// Which plane a connection is for. The server refuses a plane it does not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Plane {
    /// Discovery (membership) on the meta port.
    Discovery,
    /// Directory and store control RPCs on the control port.
    Control,
    /// The TCP data plane (one-sided reads and writes).
    Data,
    /// RDMA queue-pair bootstrap.
    RdmaBootstrap,
    /// Host-local (shared-memory) bootstrap: where a peer on the same host attaches to this
    /// node's shared regions.
    HostLocal,
}

/// First message on every connection, client → server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Oldest envelope version the client speaks.
    pub min_version: u8,
    /// Newest envelope version the client speaks.
    pub max_version: u8,
    /// The plane requested.
    pub plane: Plane,
    /// Who is connecting (None for tools such as the bench driver).
    pub node: Option<NodeId>,
    /// The client's incarnation.
    pub incarnation: Incarnation,
    /// Feature bits the client offers (none defined in version 1).
    pub features: u64,
}

impl Message for Hello {
    const KIND: u16 = 0x0001;
    const NAME: &'static str = "Hello";
}

/// Server → client answer to [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Accepted: the version both use from now on.
    Accept {
        /// Negotiated envelope version.
        version: u8,
        /// The server's id (None for a bare tool server).
        node: Option<NodeId>,
        /// The server's incarnation.
        incarnation: Incarnation,
        /// Feature bits both sides support.
        features: u64,
    },
    /// Refused, with a reason for the client's log.
    Reject {
        /// Why.
        reason: String,
    },
}

impl Message for HelloReply {
    const KIND: u16 = 0x0002;
    const NAME: &'static str = "HelloReply";
}

/// Server → client: the server's nonce and its proof of the secret (authenticated clusters).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthChallenge {
    /// The server's fresh nonce.
    pub nonce: [u8; TAG_LEN],
    /// MAC of the transcript by the server.
    pub proof: [u8; TAG_LEN],
}

impl Message for AuthChallenge {
    const KIND: u16 = 0x0004;
    const NAME: &'static str = "AuthChallenge";
}

/// Client → server: the client's proof of the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthProof {
    /// MAC of the transcript by the client.
    pub proof: [u8; TAG_LEN],
}

impl Message for AuthProof {
    const KIND: u16 = 0x0005;
    const NAME: &'static str = "AuthProof";
}

impl Hello {
    /// A hello for `plane` from `node`, speaking every version this build knows.
    pub fn new(plane: Plane, node: Option<NodeId>, incarnation: Incarnation) -> Self {
        Hello {
            min_version: MIN_WIRE_VERSION,
            max_version: WIRE_VERSION,
            plane,
            node,
            incarnation,
            features: 0,
        }
    }
}

/// The server's side of the decision, without I/O: which version to speak, or why not.
pub fn accept(
    hello: &Hello,
    serves: &[Plane],
    node: Option<NodeId>,
    incarnation: Incarnation,
) -> HelloReply {
    if !serves.contains(&hello.plane) {
        return HelloReply::Reject {
            reason: format!("this port does not serve the {:?} plane", hello.plane),
        };
    }
    let version = hello.max_version.min(WIRE_VERSION);
    if version < hello.min_version || version < MIN_WIRE_VERSION {
        return HelloReply::Reject {
            reason: format!(
                "no common version: client speaks {}..={}, server {}..={}",
                hello.min_version, hello.max_version, MIN_WIRE_VERSION, WIRE_VERSION
            ),
        };
    }
    HelloReply::Accept {
        version,
        node,
        incarnation,
        features: 0,
    }
}

/// What the client learns from a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Negotiated version.
    pub version: u8,
    /// Server id.
    pub node: Option<NodeId>,
    /// Server incarnation.
    pub incarnation: Incarnation,
}

/// What a server announces and checks: the planes it serves, who it is, and its secret.
#[derive(Clone, Debug)]
pub struct Acceptor {
    /// Planes served on this port.
    pub planes: Vec<Plane>,
    /// This node (None for a bare tool server).
    pub node: Option<NodeId>,
    /// This process's incarnation.
    pub incarnation: Incarnation,
    /// Cluster authentication.
    pub auth: Auth,
}

/// The next thing a handshake driver must do.
#[derive(Debug)]
pub enum Step<T> {
    /// Send this frame, then read the peer's next frame.
    Send(Vec<u8>),
    /// Send this frame (may be empty: nothing to send) and finish with the result.
    Finish(Vec<u8>, Result<T, WireError>),
}

/// The client's side of the handshake, without I/O.
#[derive(Debug)]
pub struct ClientHandshake {
    auth: Auth,
    hello_frame: Vec<u8>,
    nonce: [u8; TAG_LEN],
    challenged: bool,
}

impl ClientHandshake {
    /// Starts a handshake; returns the state and the first frame to send.
    pub fn new(hello: &Hello, auth: &Auth) -> Result<(Self, Vec<u8>), WireError> {
        let nonce = if auth.is_enabled() {
            auth::nonce()?
        } else {
            [0; TAG_LEN]
        };
        let ext = [Extension {
            tag: EXT_AUTH_NONCE,
            data: nonce.to_vec(),
        }];
        let exts: &[Extension] = if auth.is_enabled() { &ext } else { &[] };
        let hello_frame = envelope::encode(hello, exts)?;
        let hs = ClientHandshake {
            auth: auth.clone(),
            hello_frame: hello_frame.clone(),
            nonce,
            challenged: false,
        };
        Ok((hs, hello_frame))
    }

    /// Feeds the server's next frame.
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<Step<Accepted>, WireError> {
        let env = Envelope::parse(frame)?;
        if env.kind == AuthChallenge::KIND {
            if !self.auth.is_enabled() {
                return Err(WireError::Unauthenticated(
                    "the server requires a cluster_secret and none is configured here".into(),
                ));
            }
            if self.challenged {
                return Err(WireError::Handshake(
                    "second authentication challenge".into(),
                ));
            }
            let ch: AuthChallenge = env.decode()?;
            if !self.auth.verify(
                Side::Server,
                &self.nonce,
                &ch.nonce,
                &self.hello_frame,
                &ch.proof,
            ) {
                return Err(WireError::Unauthenticated(
                    "the server could not prove the cluster secret".into(),
                ));
            }
            self.challenged = true;
            let proof = self
                .auth
                .proof(Side::Client, &self.nonce, &ch.nonce, &self.hello_frame)
                .unwrap_or([0; TAG_LEN]);
            return Ok(Step::Send(envelope::encode(&AuthProof { proof }, &[])?));
        }
        let reply: HelloReply = env.decode()?;
        match reply {
            HelloReply::Accept {
                version,
                node,
                incarnation,
                ..
            } => {
                if self.auth.is_enabled() && !self.challenged {
                    return Err(WireError::Unauthenticated(
                        "the server accepted without proving the cluster secret (it runs with no \
                         cluster_secret)"
                            .into(),
                    ));
                }
                Ok(Step::Finish(
                    Vec::new(),
                    Ok(Accepted {
                        version,
                        node,
                        incarnation,
                    }),
                ))
            }
            HelloReply::Reject { reason } if reason.starts_with(AUTH_REASON_PREFIX) => {
                Err(WireError::Unauthenticated(reason))
            }
            HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
        }
    }
}

/// The server's side of the handshake, without I/O.
#[derive(Debug)]
pub struct ServerHandshake<'a> {
    acceptor: &'a Acceptor,
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    hello: Hello,
    hello_frame: Vec<u8>,
    client_nonce: [u8; TAG_LEN],
    server_nonce: [u8; TAG_LEN],
}

impl<'a> ServerHandshake<'a> {
    /// A server handshake answering as `acceptor`.
    pub fn new(acceptor: &'a Acceptor) -> Self {
        ServerHandshake {
            acceptor,
            pending: None,
        }
    }

    fn finish(&self, hello: Hello) -> Result<Step<Hello>, WireError> {
        let a = self.acceptor;
        let reply = accept(&hello, &a.planes, a.node.clone(), a.incarnation);
        let frame = envelope::encode(&reply, &[])?;
        let result = match reply {
            HelloReply::Accept { .. } => Ok(hello),
            HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
        };
        Ok(Step::Finish(frame, result))
    }

    fn refuse(&self, why: &str) -> Result<Step<Hello>, WireError> {
        self.acceptor.auth.count_rejection(why);
        let reason = format!("{AUTH_REASON_PREFIX} failed: {why}");
        let frame = envelope::encode(
            &HelloReply::Reject {
                reason: reason.clone(),
            },
            &[],
        )?;
        Ok(Step::Finish(frame, Err(WireError::Unauthenticated(reason))))
    }

    /// The connection ended (closed, timed out) before the exchange finished. A client that
    /// was challenged and left without a proof — typically one with a different secret, which
    /// refused our proof — counts as a refused stranger.
    pub fn abandoned(&mut self) {
        if self.pending.take().is_some() {
            self.acceptor
                .auth
                .count_rejection("left after the challenge without a proof");
        }
    }

    /// Feeds the client's next frame.
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<Step<Hello>, WireError> {
        let auth = &self.acceptor.auth;
        if let Some(p) = self.pending.take() {
            let proof = match Envelope::parse(frame).and_then(|e| e.decode::<AuthProof>()) {
                Ok(p) => p,
                Err(_) => return self.refuse("expected an authentication proof"),
            };
            if !auth.verify(
                Side::Client,
                &p.client_nonce,
                &p.server_nonce,
                &p.hello_frame,
                &proof.proof,
            ) {
                return self.refuse("wrong proof (different cluster_secret, or a replay)");
            }
            return self.finish(p.hello);
        }
        let env = Envelope::parse(frame)?;
        let hello: Hello = env.decode()?;
        if !auth.is_enabled() {
            return self.finish(hello);
        }
        let client_nonce = match env.extension(EXT_AUTH_NONCE)? {
            Some(n) if n.len() == TAG_LEN => {
                let mut a = [0; TAG_LEN];
                a.copy_from_slice(n);
                a
            }
            Some(_) => return self.refuse("malformed nonce"),
            None => return self.refuse("this cluster requires a cluster_secret"),
        };
        let server_nonce = auth::nonce()?;
        let proof = auth
            .proof(Side::Server, &client_nonce, &server_nonce, frame)
            .unwrap_or([0; TAG_LEN]);
        self.pending = Some(Pending {
            hello,
            hello_frame: frame.to_vec(),
            client_nonce,
            server_nonce,
        });
        Ok(Step::Send(envelope::encode(
            &AuthChallenge {
                nonce: server_nonce,
                proof,
            },
            &[],
        )?))
    }
}

fn read_sync(
    io: &mut Deadlined<'_>,
    buf: &mut Vec<u8>,
    timeout: Duration,
) -> Result<(), WireError> {
    crate::frame::read_frame(io, MAX_HANDSHAKE_FRAME, buf).map_err(|e| match e {
        WireError::Timeout(_) => WireError::Timeout(timeout),
        e => e,
    })
}

fn write_sync(io: &mut Deadlined<'_>, frame: &[u8], timeout: Duration) -> Result<(), WireError> {
    crate::frame::write_frame(io, frame).map_err(|e| match e {
        WireError::Timeout(_) => WireError::Timeout(timeout),
        e => e,
    })
}

/// Runs `f` on the socket bounded by `timeout` in total (every read and write included), then
/// puts the socket's own timeouts back.
fn bounded<T>(
    stream: &mut TcpStream,
    timeout: Duration,
    f: impl FnOnce(&mut Deadlined<'_>) -> Result<T, WireError>,
) -> Result<T, WireError> {
    let (prev_r, prev_w) = (stream.read_timeout()?, stream.write_timeout()?);
    let mut armed = None;
    let res = f(&mut Deadlined::new(
        stream,
        Instant::now() + timeout,
        &mut armed,
    ));
    stream.set_read_timeout(prev_r)?;
    stream.set_write_timeout(prev_w)?;
    res
}

/// Blocking client handshake on a connected socket, bounded by `timeout` in total: a server
/// that answers one byte at a time cannot hold the caller past it.
pub fn client_sync(
    stream: &mut TcpStream,
    hello: &Hello,
    auth: &Auth,
    timeout: Duration,
) -> Result<Accepted, WireError> {
    bounded(stream, timeout, |io| {
        let (mut hs, first) = ClientHandshake::new(hello, auth)?;
        write_sync(io, &first, timeout)?;
        let mut buf = Vec::with_capacity(128);
        loop {
            read_sync(io, &mut buf, timeout)?;
            match hs.on_frame(&buf)? {
                Step::Send(f) => write_sync(io, &f, timeout)?,
                Step::Finish(_, r) => return r,
            }
        }
    })
}

/// Blocking server handshake: runs the exchange and returns the client's hello if accepted,
/// bounded by `timeout` in total — a stranger trickling bytes is cut off at the deadline.
pub fn server_sync(
    stream: &mut TcpStream,
    acceptor: &Acceptor,
    timeout: Duration,
) -> Result<Hello, WireError> {
    let mut hs = ServerHandshake::new(acceptor);
    let res = bounded(stream, timeout, |io| {
        let mut buf = Vec::with_capacity(128);
        loop {
            read_sync(io, &mut buf, timeout)?;
            match hs.on_frame(&buf)? {
                Step::Send(f) => write_sync(io, &f, timeout)?,
                Step::Finish(f, r) => {
                    write_sync(io, &f, timeout)?;
                    return r;
                }
            }
        }
    });
    if matches!(
        res,
        Err(WireError::Closed | WireError::Io(_) | WireError::Timeout(_))
    ) {
        hs.abandoned();
    }
    res
}

/// Async client handshake over a framed socket, bounded by `timeout`.
pub async fn client_async<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    hello: &Hello,
    auth: &Auth,
    timeout: Duration,
) -> Result<Accepted, WireError> {
    let fut = async {
        let (mut hs, first) = ClientHandshake::new(hello, auth)?;
        framed
            .send(bytes::Bytes::from(first))
            .await
            .map_err(WireError::Io)?;
        loop {
            let frame = framed.next().await.ok_or(WireError::Closed)??;
            match hs.on_frame(&frame)? {
                Step::Send(f) => framed
                    .send(bytes::Bytes::from(f))
                    .await
                    .map_err(WireError::Io)?,
                Step::Finish(_, r) => return r,
            }
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| WireError::Timeout(timeout))?
}

/// Async server handshake over a framed socket, bounded by `timeout`.
pub async fn server_async<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    acceptor: &Acceptor,
    timeout: Duration,
) -> Result<Hello, WireError> {
    let mut hs = ServerHandshake::new(acceptor);
    let fut = async {
        loop {
            let frame = match framed.next().await {
                Some(Ok(f)) => f,
                Some(Err(e)) => return Err(WireError::Io(e)),
                None => return Err(WireError::Closed),
            };
            match hs.on_frame(&frame)? {
                Step::Send(f) => framed
                    .send(bytes::Bytes::from(f))
                    .await
                    .map_err(WireError::Io)?,
                Step::Finish(f, r) => {
                    framed
                        .send(bytes::Bytes::from(f))
                        .await
                        .map_err(WireError::Io)?;
                    return r;
                }
            }
        }
    };
    let res = tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| WireError::Timeout(timeout))
        .and_then(|r| r);
    if matches!(
        res,
        Err(WireError::Closed | WireError::Io(_) | WireError::Timeout(_))
    ) {
        hs.abandoned();
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acceptor(planes: &[Plane], node: Option<&str>, inc: u64, auth: Auth) -> Acceptor {
        Acceptor {
            planes: planes.to_vec(),
            node: node.map(|n| NodeId::new(n).unwrap()),
            incarnation: Incarnation(inc),
            auth,
        }
    }

    /// Runs both state machines against each other in memory.
    fn run(
        client: &Auth,
        server: &Auth,
    ) -> (Result<Accepted, WireError>, Result<Hello, WireError>) {
        let acc = acceptor(&[Plane::Control], None, 1, server.clone());
        let mut srv = ServerHandshake::new(&acc);
        let (mut cli, mut to_server) =
            ClientHandshake::new(&hello(Plane::Control), client).unwrap();
        loop {
            let to_client = match srv.on_frame(&to_server) {
                Ok(Step::Send(f)) => f,
                Ok(Step::Finish(f, r)) => {
                    let c = match cli.on_frame(&f) {
                        Ok(Step::Finish(_, c)) => c,
                        Ok(Step::Send(_)) => Err(WireError::Handshake("unexpected send".into())),
                        Err(e) => Err(e),
                    };
                    return (c, r);
                }
                Err(e) => return (Err(WireError::Closed), Err(e)),
            };
            match cli.on_frame(&to_client) {
                Ok(Step::Send(f)) => to_server = f,
                Ok(Step::Finish(_, c)) => return (c, Err(WireError::Closed)),
                Err(e) => return (Err(e), Err(WireError::Closed)),
            }
        }
    }

    #[test]
    fn matrix_of_secrets() {
        let s1 = Auth::from_secret(b"first-cluster-secret").unwrap();
        let s2 = Auth::from_secret(b"other-cluster-secret").unwrap();
        let none = Auth::none();
        let (c, s) = run(&s1, &s1);
        assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
        let (c, s) = run(&none, &none);
        assert!(c.is_ok() && s.is_ok());
        // Wrong secret: the client refuses the server's proof before sending its own.
        let (c, _) = run(&s2, &s1);
        assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
        // No secret against a secured server: refused by the server, typed on both sides.
        let (c, s) = run(&none, &s1);
        assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
        assert!(matches!(s, Err(WireError::Unauthenticated(_))), "{s:?}");
        assert_eq!(s1.rejected(), 1);
        // A secured client never trusts an open server.
        let (c, _) = run(&s1, &none);
        assert!(matches!(c, Err(WireError::Unauthenticated(_))), "{c:?}");
    }

    #[test]
    fn a_client_with_the_wrong_secret_is_refused_by_the_server() {
        // Drive a client that ignores the server's proof and answers with its own wrong one.
        let good = Auth::from_secret(b"first-cluster-secret").unwrap();
        let bad = Auth::from_secret(b"other-cluster-secret").unwrap();
        let acc = acceptor(&[Plane::Control], None, 1, good.clone());
        let mut srv = ServerHandshake::new(&acc);
        let (cli, hello_frame) = ClientHandshake::new(&hello(Plane::Control), &bad).unwrap();
        let Step::Send(ch) = srv.on_frame(&hello_frame).unwrap() else {
            panic!("expected a challenge")
        };
        let ch: AuthChallenge = envelope::decode(&ch).unwrap();
        let proof = bad
            .proof(Side::Client, &cli.nonce, &ch.nonce, &hello_frame)
            .unwrap();
        let frame = envelope::encode(&AuthProof { proof }, &[]).unwrap();
        let Step::Finish(reply, r) = srv.on_frame(&frame).unwrap() else {
            panic!("expected the end")
        };
        assert!(matches!(r, Err(WireError::Unauthenticated(_))));
        assert!(matches!(
            envelope::decode::<HelloReply>(&reply).unwrap(),
            HelloReply::Reject { .. }
        ));
        assert_eq!(good.rejected(), 1);
    }

    fn hello(plane: Plane) -> Hello {
        Hello::new(plane, Some(NodeId::new("a").unwrap()), Incarnation(1))
    }

    #[test]
    fn accept_negotiates_highest_common_version() {
        let r = accept(
            &hello(Plane::Control),
            &[Plane::Control],
            None,
            Incarnation(2),
        );
        assert!(matches!(
            r,
            HelloReply::Accept {
                version: WIRE_VERSION,
                ..
            }
        ));
    }

    #[test]
    fn wrong_plane_and_future_only_clients_are_rejected() {
        let r = accept(&hello(Plane::Data), &[Plane::Control], None, Incarnation(2));
        assert!(matches!(r, HelloReply::Reject { .. }));
        let mut future = hello(Plane::Control);
        future.min_version = WIRE_VERSION + 1;
        future.max_version = WIRE_VERSION + 3;
        assert!(matches!(
            accept(&future, &[Plane::Control], None, Incarnation(2)),
            HelloReply::Reject { .. }
        ));
    }

    #[test]
    fn sync_handshake_over_real_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            server_sync(
                &mut s,
                &acceptor(&[Plane::Data], Some("srv"), 9, Auth::none()),
                Duration::from_secs(5),
            )
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let acc = client_sync(
            &mut c,
            &hello(Plane::Data),
            &Auth::none(),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(acc.node.unwrap().as_str(), "srv");
        assert_eq!(acc.incarnation, Incarnation(9));
        assert_eq!(srv.join().unwrap().unwrap().plane, Plane::Data);
    }

    #[test]
    fn silent_server_times_out_within_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let t0 = std::time::Instant::now();
        let err = client_sync(
            &mut c,
            &hello(Plane::Data),
            &Auth::none(),
            Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(l);
    }

    /// Writes `bytes` one at a time, `gap` apart, until they run out or the peer closes;
    /// returns when it stopped.
    fn trickle(mut s: TcpStream, bytes: &[u8], gap: Duration) -> std::time::Instant {
        use std::io::Write;
        for b in bytes {
            if s.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(gap);
        }
        std::time::Instant::now()
    }

    #[test]
    fn a_stranger_trickling_a_handshake_is_cut_off_at_the_total_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        // A plausible frame header, then a body, one byte every 100 ms: each read arrives well
        // inside a per-read timeout, but the exchange must still end at the total deadline.
        let mut bytes = 200u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[7u8; 200]);
        let writer = std::thread::spawn(move || trickle(c, &bytes, Duration::from_millis(100)));
        let t0 = std::time::Instant::now();
        let acc = acceptor(&[Plane::Data], Some("srv"), 1, Auth::none());
        let err = server_sync(&mut s, &acc, Duration::from_millis(600)).unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
        assert!(took < Duration::from_millis(1200), "cut off after {took:?}");
        drop(s);
        writer.join().unwrap();
    }

    #[test]
    fn a_tarpit_server_cannot_hold_a_client_past_its_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let tarpit = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut bytes = 300u32.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[1u8; 300]);
            trickle(s, &bytes, Duration::from_millis(100))
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let t0 = std::time::Instant::now();
        let err = client_sync(
            &mut c,
            &hello(Plane::Data),
            &Auth::none(),
            Duration::from_millis(600),
        )
        .unwrap_err();
        let took = t0.elapsed();
        assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
        assert!(took < Duration::from_millis(1200), "held for {took:?}");
        drop(c);
        tarpit.join().unwrap();
    }

    #[tokio::test]
    async fn async_handshake_round_trip() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let srv = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut f = Framed::new(s, crate::frame::codec(4096));
            server_async(
                &mut f,
                &acceptor(&[Plane::Discovery], None, 3, Auth::none()),
                Duration::from_secs(5),
            )
            .await
        });
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut f = Framed::new(s, crate::frame::codec(4096));
        let acc = client_async(
            &mut f,
            &hello(Plane::Discovery),
            &Auth::none(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(acc.incarnation, Incarnation(3));
        assert!(srv.await.unwrap().is_ok());
    }
}

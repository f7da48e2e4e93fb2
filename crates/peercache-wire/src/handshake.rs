//! The connection handshake every PeerCache connection starts with.
//!
//! The client sends [`Hello`] (the version range it speaks, which plane it wants, who it is);
//! the server answers [`HelloReply::Accept`] with the chosen version, or
//! [`HelloReply::Reject`] with a reason, before any request is served. The authentication issue
//! extends this exchange with a challenge–response; that will travel in envelope extensions so
//! this version's messages stay decodable.

use std::net::TcpStream;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::envelope::{self, MIN_WIRE_VERSION, Message, WIRE_VERSION};
use crate::{Incarnation, NodeId, WireError};

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

fn into_accepted(reply: HelloReply) -> Result<Accepted, WireError> {
    match reply {
        HelloReply::Accept {
            version,
            node,
            incarnation,
            ..
        } => Ok(Accepted {
            version,
            node,
            incarnation,
        }),
        HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
    }
}

/// Blocking client handshake on a connected socket, bounded by `timeout`.
pub fn client_sync(
    stream: &mut TcpStream,
    hello: &Hello,
    timeout: Duration,
) -> Result<Accepted, WireError> {
    let prev = stream.read_timeout()?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    crate::frame::write_frame(stream, &envelope::encode(hello, &[])?)?;
    let mut buf = Vec::with_capacity(128);
    let res = crate::frame::read_frame(stream, 4096, &mut buf).map_err(|e| match e {
        WireError::Timeout(_) => WireError::Timeout(timeout),
        e => e,
    });
    stream.set_read_timeout(prev)?;
    res?;
    into_accepted(envelope::decode::<HelloReply>(&buf)?)
}

/// Blocking server handshake: reads the hello, answers, and returns it if accepted.
pub fn server_sync(
    stream: &mut TcpStream,
    serves: &[Plane],
    node: Option<NodeId>,
    incarnation: Incarnation,
    timeout: Duration,
) -> Result<Hello, WireError> {
    let prev = stream.read_timeout()?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut buf = Vec::with_capacity(128);
    crate::frame::read_frame(stream, 4096, &mut buf).map_err(|e| match e {
        WireError::Timeout(_) => WireError::Timeout(timeout),
        e => e,
    })?;
    let hello = envelope::decode::<Hello>(&buf)?;
    let reply = accept(&hello, serves, node, incarnation);
    crate::frame::write_frame(stream, &envelope::encode(&reply, &[])?)?;
    stream.set_read_timeout(prev)?;
    match reply {
        HelloReply::Accept { .. } => Ok(hello),
        HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
    }
}

/// Async client handshake over a framed socket, bounded by `timeout`.
pub async fn client_async<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    hello: &Hello,
    timeout: Duration,
) -> Result<Accepted, WireError> {
    let fut = async {
        framed
            .send(bytes::Bytes::from(envelope::encode(hello, &[])?))
            .await
            .map_err(WireError::Io)?;
        let frame = framed.next().await.ok_or(WireError::Closed)??;
        into_accepted(envelope::decode::<HelloReply>(&frame)?)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| WireError::Timeout(timeout))?
}

/// Async server handshake over a framed socket, bounded by `timeout`.
pub async fn server_async<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    serves: &[Plane],
    node: Option<NodeId>,
    incarnation: Incarnation,
    timeout: Duration,
) -> Result<Hello, WireError> {
    let fut = async {
        let frame = framed.next().await.ok_or(WireError::Closed)??;
        let hello = envelope::decode::<Hello>(&frame)?;
        let reply = accept(&hello, serves, node, incarnation);
        framed
            .send(bytes::Bytes::from(envelope::encode(&reply, &[])?))
            .await
            .map_err(WireError::Io)?;
        match reply {
            HelloReply::Accept { .. } => Ok(hello),
            HelloReply::Reject { reason } => Err(WireError::Handshake(reason)),
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| WireError::Timeout(timeout))?
}

#[cfg(test)]
mod tests {
    use super::*;

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
                &[Plane::Data],
                Some(NodeId::new("srv").unwrap()),
                Incarnation(9),
                Duration::from_secs(5),
            )
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let acc = client_sync(&mut c, &hello(Plane::Data), Duration::from_secs(5)).unwrap();
        assert_eq!(acc.node.unwrap().as_str(), "srv");
        assert_eq!(acc.incarnation, Incarnation(9));
        assert_eq!(srv.join().unwrap().unwrap().plane, Plane::Data);
    }

    #[test]
    fn silent_server_times_out_within_deadline() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let t0 = std::time::Instant::now();
        let err = client_sync(&mut c, &hello(Plane::Data), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, WireError::Timeout(_)), "{err:?}");
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(l);
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
                &[Plane::Discovery],
                None,
                Incarnation(3),
                Duration::from_secs(5),
            )
            .await
        });
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut f = Framed::new(s, crate::frame::codec(4096));
        let acc = client_async(&mut f, &hello(Plane::Discovery), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(acc.incarnation, Incarnation(3));
        assert!(srv.await.unwrap().is_ok());
    }
}

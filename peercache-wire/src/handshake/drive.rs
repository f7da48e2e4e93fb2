//! Drivers of the handshake state machines over blocking and tokio sockets, each bounded by
//! one total deadline.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::{
    Accepted, Acceptor, ClientHandshake, Established, Hello, MAX_HANDSHAKE_FRAME, ServerHandshake,
    Step,
};
use crate::frame::Deadlined;
use crate::{Auth, WireError};

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

/// Blocking server handshake: runs the exchange and returns the client's hello (with its grant
/// and, when sealed, the connection's keys) if accepted, bounded by `timeout` in total — a
/// stranger trickling bytes is cut off at the deadline.
pub fn server_sync(
    stream: &mut TcpStream,
    acceptor: &Acceptor,
    timeout: Duration,
) -> Result<Established, WireError> {
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
    res.map(|hello| established(&hs, hello))
}

fn established(hs: &ServerHandshake<'_>, hello: Hello) -> Established {
    Established {
        hello,
        grant: hs.grant(),
        channel: hs.channel(),
        verified: hs.verified(),
    }
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

/// Async server handshake over a framed socket, bounded by `timeout`: the client's hello, what
/// its proof granted it (see [`crate::auth::Auth::accepting_read_only`]) and, when sealed, the
/// connection's keys.
pub async fn server_async<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, LengthDelimitedCodec>,
    acceptor: &Acceptor,
    timeout: Duration,
) -> Result<Established, WireError> {
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
    res.map(|hello| established(&hs, hello))
}

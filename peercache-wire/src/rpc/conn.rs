//! A client's pooled connection: its deadline-bounded I/O, and sealing when the handshake
//! agreed to it.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::WireError;
use crate::frame;
use crate::seal::{Opener, Sealer, TAG_BYTES};

use super::SEALED_REFUSED_TOTAL;

/// A pooled connection, the socket timeout currently set on it and its read-ahead.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: TcpStream,
    pub(super) armed: Option<Duration>,
    /// Reads each reply with one `recv` when it is small.
    pub(super) ahead: frame::ReadAhead,
    /// Present when the handshake agreed to seal this connection.
    pub(super) sealed: Option<SealedConn>,
}

/// One sealed connection's two directions and a request buffer reused across calls.
#[derive(Debug)]
pub(super) struct SealedConn {
    tx: Sealer,
    rx: Opener,
    out: Vec<u8>,
}

impl SealedConn {
    pub(super) fn new((tx, rx): (Sealer, Opener)) -> Self {
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
    pub(super) fn send(&mut self, deadline: Instant, req: &[u8]) -> Result<(), WireError> {
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
    pub(super) fn recv(&mut self, deadline: Instant, max: usize) -> Result<Vec<u8>, WireError> {
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

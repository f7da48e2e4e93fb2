//! One data-plane connection's byte stream, plain or sealed.
//!
//! Plain: vectored syscalls straight between registered memory and the socket ([`iov`]).
//! Sealed (the handshake agreed on encryption in transit, [`peercache_wire::seal`]): the same
//! bytes cut into records of at most [`RECORD_MAX`] bytes, each
//! `[u32 big-endian length][ciphertext][tag]`, sealed from the iovecs into one buffer and
//! opened into another before being copied to their destinations. Records do not follow
//! message boundaries; a read takes what it needs from the opened record and keeps the rest.
//!
//! Both forms honour the same per-batch [`Deadline`].

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use peercache_wire::WireError;
use peercache_wire::seal::{Opener, RECORD_MAX, Sealer, TAG_BYTES};

use super::iov::{self, Deadline};

/// The byte stream of one connection.
pub(crate) struct Link {
    stream: TcpStream,
    armed: Option<Duration>,
    sealed: Option<Box<Sealed>>,
}

/// Which end of a data connection a link is: names where a refused record is counted.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// The data server (`at="data"`).
    Server,
    /// A reader or writer receiving the server's replies (`at="data-reply"`).
    Client,
}

/// A sealed connection's two directions and record buffers, reused across batches.
struct Sealed {
    tx: Sealer,
    rx: Opener,
    end_of: End,
    /// The record being written: length prefix, then plaintext sealed in place, then the tag.
    out: Vec<u8>,
    /// The last record read, opened: plaintext in `[pos, end)` not yet consumed.
    inbuf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl Link {
    /// A link over `stream`, sealed with `channel` when the handshake agreed on it.
    pub(crate) fn new(stream: TcpStream, channel: Option<(Sealer, Opener)>, end: End) -> Self {
        Link {
            stream,
            armed: None,
            sealed: channel.map(|(tx, rx)| {
                Box::new(Sealed {
                    tx,
                    rx,
                    end_of: end,
                    out: Vec::new(),
                    inbuf: Vec::new(),
                    pos: 0,
                    end: 0,
                })
            }),
        }
    }

    /// Waits with no deadline for the next request to begin, then fills `hdr` within a fresh
    /// deadline of `total` (the server's idle wait between requests).
    pub(crate) fn read_idle(&mut self, hdr: &mut [u8], total: Duration) -> Result<(), WireError> {
        self.stream.set_read_timeout(None)?;
        self.armed = None;
        match self.sealed.as_deref_mut() {
            None => self
                .stream
                .read_exact(hdr)
                .map_err(peercache_wire::frame::map_io),
            Some(s) => {
                let mut d = Deadline::new(total);
                if s.pos == s.end {
                    let mut len = [0u8; 4];
                    self.stream
                        .read_exact(&mut len)
                        .map_err(peercache_wire::frame::map_io)?;
                    s.read_record_body(
                        u32::from_be_bytes(len),
                        &self.stream,
                        &mut d,
                        &mut self.armed,
                    )?;
                }
                let mut v = [iov::iovec(hdr.as_mut_ptr() as u64, hdr.len())];
                s.fill(
                    &mut v,
                    &[],
                    &self.stream,
                    &mut d,
                    &mut self.armed,
                    &mut |_| {},
                )
            }
        }
    }

    /// Fills every iovec from the stream, within the deadline.
    pub(crate) fn readv_exact(
        &mut self,
        iovs: &mut [libc::iovec],
        d: &mut Deadline,
    ) -> Result<(), WireError> {
        self.readv_exact_landing(iovs, &[], d, &mut |_| {})
    }

    /// [`Self::readv_exact`], calling `landed(g)` as soon as group `g` (the iovecs before
    /// `ends[g]`, from `ends[g - 1]`) is full.
    pub(crate) fn readv_exact_landing(
        &mut self,
        iovs: &mut [libc::iovec],
        ends: &[usize],
        d: &mut Deadline,
        landed: &mut dyn FnMut(usize),
    ) -> Result<(), WireError> {
        match self.sealed.as_deref_mut() {
            None if ends.is_empty() => iov::readv_exact(&self.stream, iovs, d, &mut self.armed),
            None => iov::readv_exact_landing(&self.stream, iovs, ends, d, &mut self.armed, landed),
            Some(s) => s.fill(iovs, ends, &self.stream, d, &mut self.armed, landed),
        }
    }

    /// Writes every iovec to the stream, within the deadline.
    pub(crate) fn writev_all(
        &mut self,
        iovs: &mut [libc::iovec],
        d: &mut Deadline,
    ) -> Result<(), WireError> {
        match self.sealed.as_deref_mut() {
            None => iov::writev_all(&self.stream, iovs, d, &mut self.armed),
            Some(s) => s.send(iovs, &self.stream, d, &mut self.armed),
        }
    }
}

impl Sealed {
    /// Reads a record's sealed body of `len` bytes (its length prefix already read) and opens
    /// it as the current plaintext.
    fn read_record_body(
        &mut self,
        len: u32,
        stream: &TcpStream,
        d: &mut Deadline,
        armed: &mut Option<Duration>,
    ) -> Result<(), WireError> {
        let len = len as usize;
        if !(TAG_BYTES..=RECORD_MAX + TAG_BYTES).contains(&len) {
            return Err(WireError::Malformed {
                what: "sealed record",
                detail: format!(
                    "{len} bytes; a record holds {TAG_BYTES}..={} bytes",
                    RECORD_MAX + TAG_BYTES
                ),
            });
        }
        self.inbuf.resize(len, 0);
        let mut v = [iov::iovec(self.inbuf.as_mut_ptr() as u64, len)];
        iov::readv_exact(stream, &mut v, d, armed)?;
        let at = match self.end_of {
            End::Server => "data",
            End::Client => "data-reply",
        };
        self.end = self.rx.open_in_place(&mut self.inbuf).inspect_err(|_| {
            metrics::counter!(peercache_wire::metrics::SEALED_REFUSED_TOTAL, "at" => at)
                .increment(1);
        })?;
        self.pos = 0;
        Ok(())
    }

    /// Reads the next record whole and opens it.
    fn next_record(
        &mut self,
        stream: &TcpStream,
        d: &mut Deadline,
        armed: &mut Option<Duration>,
    ) -> Result<(), WireError> {
        let mut len = [0u8; 4];
        let mut v = [iov::iovec(len.as_mut_ptr() as u64, 4)];
        iov::readv_exact(stream, &mut v, d, armed)?;
        self.read_record_body(u32::from_be_bytes(len), stream, d, armed)
    }

    /// Fills the iovecs from opened records, reading records as needed, and reports each
    /// group as it completes.
    fn fill(
        &mut self,
        iovs: &mut [libc::iovec],
        ends: &[usize],
        stream: &TcpStream,
        d: &mut Deadline,
        armed: &mut Option<Duration>,
        landed: &mut dyn FnMut(usize),
    ) -> Result<(), WireError> {
        let mut start = iov::advance(iovs, 0, 0);
        let mut g = 0;
        loop {
            while g < ends.len() && start >= ends[g] {
                landed(g);
                g += 1;
            }
            if start >= iovs.len() {
                return Ok(());
            }
            if self.pos == self.end {
                self.next_record(stream, d, armed)?;
            }
            let (next, copied) = iov::fill_from(iovs, start, &self.inbuf[self.pos..self.end]);
            start = next;
            self.pos += copied;
        }
    }

    /// Seals the iovecs' bytes into records and writes them, one record at a time.
    fn send(
        &mut self,
        iovs: &mut [libc::iovec],
        stream: &TcpStream,
        d: &mut Deadline,
        armed: &mut Option<Duration>,
    ) -> Result<(), WireError> {
        let mut start = iov::advance(iovs, 0, 0);
        while start < iovs.len() {
            self.out.clear();
            self.out.extend_from_slice(&[0; 4]);
            start = iov::drain_into(iovs, start, &mut self.out, RECORD_MAX);
            self.tx.seal_in_place(&mut self.out, 4)?;
            let len = (self.out.len() - 4) as u32;
            self.out[..4].copy_from_slice(&len.to_be_bytes());
            let mut v = [iov::iovec(self.out.as_ptr() as u64, self.out.len())];
            iov::writev_all(stream, &mut v, d, armed)?;
        }
        Ok(())
    }
}

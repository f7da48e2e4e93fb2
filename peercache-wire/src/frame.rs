//! Length-delimited framing: a 4-byte big-endian length, then the frame.
//!
//! The maximum frame size is checked *before* any buffer is sized from the length field, so a
//! hostile peer cannot make us allocate.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tokio_util::codec::LengthDelimitedCodec;

use crate::WireError;

/// Default maximum frame size: 16 MiB (directory and discovery requests split above it).
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// The async codec for control-plane sockets (`tokio_util::codec::Framed`).
pub fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .big_endian()
        .max_frame_length(max_frame)
        .new_codec()
}

/// Writes one frame to a blocking writer (length prefix and payload in one vectored write).
pub fn write_frame<W: Write>(w: &mut W, payload: &[u8]) -> Result<(), WireError> {
    let len = u32::try_from(payload.len()).map_err(|_| WireError::FrameTooLarge {
        len: payload.len(),
        max: u32::MAX as usize,
    })?;
    let hdr = len.to_be_bytes();
    let mut bufs = [std::io::IoSlice::new(&hdr), std::io::IoSlice::new(payload)];
    write_all_vectored(w, &mut bufs)?;
    Ok(())
}

/// Reads one frame from a blocking reader into `buf` (cleared and reused).
///
/// Socket timeouts surface as [`WireError::Timeout`]; EOF as [`WireError::Closed`].
pub fn read_frame<R: Read>(r: &mut R, max: usize, buf: &mut Vec<u8>) -> Result<(), WireError> {
    let mut hdr = [0u8; 4];
    read_exact_mapped(r, &mut hdr)?;
    let len = u32::from_be_bytes(hdr) as usize;
    if len > max {
        return Err(WireError::FrameTooLarge { len, max });
    }
    buf.clear();
    buf.resize(len, 0);
    read_exact_mapped(r, buf)?;
    Ok(())
}

fn read_exact_mapped<R: Read>(r: &mut R, buf: &mut [u8]) -> Result<(), WireError> {
    r.read_exact(buf).map_err(map_io)
}

/// Maps socket errors: EOF → [`WireError::Closed`], timeouts → [`WireError::Timeout`].
pub fn map_io(e: std::io::Error) -> WireError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Closed,
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            WireError::Timeout(std::time::Duration::ZERO)
        }
        _ => WireError::Io(e),
    }
}

/// A blocking socket bounded by one total deadline. Before each read or write the socket
/// timeouts are brought in line with what is left of the deadline, so a peer that trickles
/// bytes — or reads ours one at a time — cannot stretch a frame or a handshake past it: every
/// exchange through this wrapper ends by `deadline` (plus a few milliseconds of slack). Timeouts
/// are re-armed only when the armed value is stale, so a fast exchange costs no extra syscall.
#[derive(Debug)]
pub struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
    /// The timeout currently set on the socket (shared with the caller's connection state).
    armed: &'a mut Option<Duration>,
}

/// How far past the deadline one blocked call may end.
const SLACK: Duration = Duration::from_millis(5);

impl<'a> Deadlined<'a> {
    /// Bounds `stream` by `deadline`; `armed` remembers the timeout set on it across uses.
    pub fn new(stream: &'a TcpStream, deadline: Instant, armed: &'a mut Option<Duration>) -> Self {
        Deadlined {
            stream,
            deadline,
            armed,
        }
    }

    /// Sets the socket timeouts to what is left, unless the armed value already ends within
    /// the slack of the deadline and not much sooner. Past the deadline: `TimedOut`.
    pub fn arm(&mut self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let fresh = self
            .armed
            .is_some_and(|a| a <= left + SLACK && a * 2 >= left);
        if !fresh {
            self.stream.set_read_timeout(Some(left))?;
            self.stream.set_write_timeout(Some(left))?;
            *self.armed = Some(left);
        }
        Ok(())
    }

    fn retry<T>(
        &mut self,
        mut f: impl FnMut(&TcpStream) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        loop {
            self.arm()?;
            match f(self.stream) {
                // The armed timeout ran out before the deadline (it was armed long ago):
                // re-arm with what is left and go on.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) && Instant::now() < self.deadline =>
                {
                    *self.armed = None;
                }
                r => return r,
            }
        }
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.retry(|mut s| s.read(buf))
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.retry(|mut s| s.write(buf))
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.retry(|mut s| s.write_vectored(bufs))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `write_all` for a list of slices (std's version is unstable): loops over partial writes.
pub fn write_all_vectored<W: Write>(
    w: &mut W,
    mut bufs: &mut [std::io::IoSlice<'_>],
) -> Result<(), WireError> {
    std::io::IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(WireError::Closed),
            Ok(n) => std::io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_io(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_round_trip_and_limit() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        write_frame(&mut wire, &[]).unwrap();
        let mut r = &wire[..];
        let mut buf = Vec::new();
        read_frame(&mut r, 16, &mut buf).unwrap();
        assert_eq!(buf, b"hello");
        read_frame(&mut r, 16, &mut buf).unwrap();
        assert!(buf.is_empty());
        assert!(matches!(
            read_frame(&mut r, 16, &mut buf),
            Err(WireError::Closed)
        ));

        let mut big = Vec::new();
        write_frame(&mut big, &[0u8; 32]).unwrap();
        assert!(matches!(
            read_frame(&mut &big[..], 16, &mut buf),
            Err(WireError::FrameTooLarge { len: 32, max: 16 })
        ));
    }

    #[test]
    fn huge_length_field_does_not_allocate() {
        let wire = [0xff, 0xff, 0xff, 0xff, 1, 2];
        let mut buf = Vec::new();
        assert!(matches!(
            read_frame(&mut &wire[..], DEFAULT_MAX_FRAME, &mut buf),
            Err(WireError::FrameTooLarge { .. })
        ));
        assert_eq!(buf.capacity(), 0);
    }
}

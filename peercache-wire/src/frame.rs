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

/// Bytes a [`ReadAhead`] asks the socket for in one read (into a buffer on the stack): a small
/// reply arrives, length prefix and body, in one `recv`.
pub const READ_AHEAD: usize = 4 << 10;

/// A blocking frame reader that reads ahead: one `recv` fetches the length prefix and as much
/// of the frame as has arrived (up to [`READ_AHEAD`] bytes), where [`read_frame`] needs one
/// call for the prefix and one for the body. The read goes into a buffer on the stack, so an
/// idle reader holds no memory; bytes that arrived past the frame (a peer that sent two frames
/// at once) are kept for the next call. Keep one `ReadAhead` per stream for as long as you read
/// that stream.
///
/// ```
/// use peercache_wire::frame::{write_frame, ReadAhead};
///
/// let mut wire = Vec::new();
/// write_frame(&mut wire, b"one")?;
/// write_frame(&mut wire, b"two")?;
/// let (mut r, mut ahead, mut frame) = (&wire[..], ReadAhead::default(), Vec::new());
/// ahead.read_frame(&mut r, 16, &mut frame)?;
/// assert_eq!(frame, b"one");
/// assert!(ahead.buffered() > 0); // the second frame came in with the first
/// ahead.read_frame(&mut r, 16, &mut frame)?;
/// assert_eq!(frame, b"two");
/// # Ok::<(), peercache_wire::WireError>(())
/// ```
#[derive(Debug, Default)]
pub struct ReadAhead {
    /// Bytes read past the last frame returned, in stream order.
    left: Vec<u8>,
}

impl ReadAhead {
    /// Bytes read from the stream and not yet returned in a frame.
    pub fn buffered(&self) -> usize {
        self.left.len()
    }

    /// Reads one frame of at most `max` bytes into `out` (cleared), as [`read_frame`] does
    /// and with its errors; a frame over `max` is refused from its prefix, before anything is
    /// sized from it. After an error the stream is out of step: drop it.
    pub fn read_frame<R: Read>(
        &mut self,
        r: &mut R,
        max: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let mut scratch = [0u8; READ_AHEAD];
        // Bytes kept from the last call come first. They are what one read-ahead held past a
        // frame, so they always fit, and the stream is read only after them: the order holds.
        let mut n = self.left.len();
        scratch[..n].copy_from_slice(&self.left);
        self.left.clear();
        while n < 4 {
            match r.read(&mut scratch[n..]) {
                Ok(0) => return Err(WireError::Closed),
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(map_io(e)),
            }
        }
        let len = u32::from_be_bytes([scratch[0], scratch[1], scratch[2], scratch[3]]) as usize;
        if len > max {
            return Err(WireError::FrameTooLarge { len, max });
        }
        let body = &scratch[4..n];
        let have = len.min(body.len());
        out.clear();
        out.extend_from_slice(&body[..have]);
        if have < body.len() {
            // Past this frame: the next one's first bytes.
            self.left.extend_from_slice(&body[have..]);
        } else if have < len {
            out.resize(len, 0);
            read_exact_mapped(r, &mut out[have..])?;
        }
        Ok(())
    }
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

    /// A reader that hands out at most `step` bytes per read and counts its reads.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        reads: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.reads += 1;
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn read_ahead_takes_a_small_frame_in_one_read_and_keeps_the_next() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"first").unwrap();
        write_frame(&mut wire, b"").unwrap();
        write_frame(&mut wire, b"third").unwrap();
        let mut r = Trickle {
            data: &wire,
            step: usize::MAX,
            reads: 0,
        };
        let (mut ahead, mut out) = (ReadAhead::default(), Vec::new());
        ahead.read_frame(&mut r, 16, &mut out).unwrap();
        assert_eq!((out.as_slice(), r.reads), (&b"first"[..], 1));
        ahead.read_frame(&mut r, 16, &mut out).unwrap();
        assert_eq!((out.as_slice(), r.reads), (&b""[..], 1));
        ahead.read_frame(&mut r, 16, &mut out).unwrap();
        assert_eq!((out.as_slice(), r.reads), (&b"third"[..], 1));
        assert_eq!(ahead.buffered(), 0);
        assert!(matches!(
            ahead.read_frame(&mut r, 16, &mut out),
            Err(WireError::Closed)
        ));
    }

    #[test]
    fn read_ahead_reassembles_frames_split_anywhere_and_larger_than_its_buffer() {
        let big: Vec<u8> = (0..READ_AHEAD * 2 + 7)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let mut wire = Vec::new();
        write_frame(&mut wire, b"ab").unwrap();
        write_frame(&mut wire, &big).unwrap();
        write_frame(&mut wire, b"cde").unwrap();
        for step in [1, 3, 5, 4096, READ_AHEAD + 1] {
            let mut r = Trickle {
                data: &wire,
                step,
                reads: 0,
            };
            let (mut ahead, mut out) = (ReadAhead::default(), Vec::new());
            ahead.read_frame(&mut r, big.len(), &mut out).unwrap();
            assert_eq!(out, b"ab", "step {step}");
            ahead.read_frame(&mut r, big.len(), &mut out).unwrap();
            assert!(out == big, "step {step}");
            ahead.read_frame(&mut r, big.len(), &mut out).unwrap();
            assert_eq!(out, b"cde", "step {step}");
        }
    }

    #[test]
    fn read_ahead_refuses_an_oversize_frame_from_its_prefix_and_a_cut_stream() {
        let wire = [0xff, 0xff, 0xff, 0xff, 1, 2];
        let (mut ahead, mut out) = (ReadAhead::default(), Vec::new());
        assert!(matches!(
            ahead.read_frame(&mut &wire[..], DEFAULT_MAX_FRAME, &mut out),
            Err(WireError::FrameTooLarge { .. })
        ));
        assert_eq!(out.capacity(), 0);
        // The stream ends inside a header, then inside a body.
        for cut in [&[0u8, 0][..], &[0, 0, 0, 9, 1, 2][..]] {
            let mut ahead = ReadAhead::default();
            assert!(matches!(
                ahead.read_frame(&mut &cut[..], 16, &mut out),
                Err(WireError::Closed)
            ));
        }
    }
}

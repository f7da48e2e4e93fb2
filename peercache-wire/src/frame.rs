//! Length-delimited framing: a 4-byte big-endian length, then the frame.
//!
//! The maximum frame size is checked *before* any buffer is sized from the length field, so a
//! hostile peer cannot make us allocate.

use std::io::{Read, Write};

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

//! The `raw-tcp` baseline every TCP row is compared with.
//!
//! A 16-byte request (offset, length) and a reply of the page size, read into a reused
//! pre-faulted buffer, over plain std sockets with `TCP_NODELAY`; a batch sends all its
//! requests at once (pipelined) and then reads every reply.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

/// A pre-faulted byte buffer (every page touched once, so no fault lands in a measurement).
pub fn prefaulted(len: usize, seed: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    v
}

/// Serves baseline requests from `buf` on `listener` until the process exits.
pub fn serve(listener: TcpListener, buf: Arc<Vec<u8>>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let buf = buf.clone();
        std::thread::spawn(move || {
            let _ = stream.set_nodelay(true);
            let mut w = match stream.try_clone() {
                Ok(w) => w,
                Err(_) => return,
            };
            let mut r = BufReader::with_capacity(64 << 10, stream);
            let mut req = [0u8; 16];
            while r.read_exact(&mut req).is_ok() {
                let off = u64::from_le_bytes(req[..8].try_into().expect("8 bytes")) as usize;
                let len = u64::from_le_bytes(req[8..].try_into().expect("8 bytes")) as usize;
                let Some(page) = buf.get(off..off.saturating_add(len)) else {
                    return;
                };
                if w.write_all(page).is_err() {
                    return;
                }
            }
        });
    }
}

/// One baseline connection.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    req: Vec<u8>,
}

impl RawClient {
    /// Connects to a baseline server.
    pub fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(RawClient {
            stream,
            req: Vec::with_capacity(32 * 16),
        })
    }

    /// Requests `offsets.len()` pages of `page` bytes and reads them back to back into `dst`.
    pub fn batch(&mut self, offsets: &[u64], page: usize, dst: &mut [u8]) -> std::io::Result<()> {
        self.req.clear();
        for &o in offsets {
            self.req.extend_from_slice(&o.to_le_bytes());
            self.req.extend_from_slice(&(page as u64).to_le_bytes());
        }
        self.stream.write_all(&self.req)?;
        for i in 0..offsets.len() {
            self.stream.read_exact(&mut dst[i * page..(i + 1) * page])?;
        }
        Ok(())
    }
}

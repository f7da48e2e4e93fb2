//! The `raw-tcp` baseline every TCP row is compared with.
//!
//! A 16-byte request (offset, length) and a reply of the page size, read into a reused
//! pre-faulted buffer, over plain std sockets with `TCP_NODELAY`; a batch sends all its
//! requests at once (pipelined) and then reads every reply. And the one-way stream (`drive`'s
//! `raw-tcp/stream-xN`): a server that writes a buffer over and over to each connection, and a
//! reader that counts what N connections deliver in a time window — the most a reader process
//! can receive over that many connections.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A pre-faulted byte buffer (every page touched once, so no fault lands in a measurement).
pub fn prefaulted(len: usize, seed: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    v
}

/// As [`prefaulted`], on transparent huge pages where the kernel grants them (`MADV_HUGEPAGE`
/// on the 2 MiB-aligned interior, before the first touch) — as the node's pool is, so a stream
/// from a buffer this large is not slowed by TLB misses the pool does not have.
pub fn prefaulted_huge(len: usize, seed: u8) -> Vec<u8> {
    const HUGE: usize = 2 << 20;
    let mut v: Vec<u8> = Vec::with_capacity(len);
    let start = v.as_mut_ptr() as usize;
    let first = start.next_multiple_of(HUGE);
    let end = (start + len) / HUGE * HUGE;
    if end > first {
        // SAFETY: the range lies inside `v`'s allocation; advice changes no contents (none are
        // initialised yet) and failure is harmless (the buffer stays on small pages).
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
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

/// Streams `buf` over and over to every connection on `listener`, until each peer closes.
pub fn serve_stream(listener: TcpListener, buf: Arc<Vec<u8>>) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let buf = buf.clone();
        std::thread::spawn(move || while stream.write_all(&buf).is_ok() {});
    }
}

/// Receives from `connections` streams of the server at `addr` at once (one thread each, each
/// filling its own ring of `ring` bytes front to back, over and over), discards `warmup`, then
/// counts for `measure`. Returns (bytes, seconds measured).
///
/// A ring that fits in cache (1 MiB) gives TCP's ceiling with hot memory on the receiving side;
/// a ring the size of a caller's host pool makes the receiver write as much distinct memory as
/// a `get` of the same pages does.
pub fn stream_read(
    addr: SocketAddr,
    connections: usize,
    ring: usize,
    warmup: Duration,
    measure: Duration,
) -> std::io::Result<(u64, f64)> {
    let streams = (0..connections.max(1))
        .map(|_| {
            let s = TcpStream::connect(addr)?;
            // A bound on any single read: a server that stops sending ends the row.
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            Ok(s)
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            let (bytes, stop) = (bytes.clone(), stop.clone());
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut buf = prefaulted(ring.max(1), 5);
                let mut at = 0;
                while !stop.load(Ordering::Relaxed) {
                    let n = s.read(&mut buf[at..])?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    at = (at + n) % buf.len();
                    bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    // The window is timed by the clock, not synchronized with anything.
    std::thread::sleep(warmup);
    let (b0, t0) = (bytes.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(measure);
    let (b1, secs) = (bytes.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
    stop.store(true, Ordering::Relaxed);
    let mut first_error = None;
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(std::io::Error::other("a stream reader panicked"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((b1 - b0, secs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_delivers_bytes_over_every_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve_stream(l, Arc::new(prefaulted(1 << 16, 9))));
        // A cache-sized ring, and one that reads wrap around at an odd length.
        for ring in [1 << 20, 100_003] {
            let (bytes, secs) = stream_read(
                addr,
                2,
                ring,
                Duration::from_millis(20),
                Duration::from_millis(100),
            )
            .unwrap();
            assert!(bytes > 0 && secs >= 0.1, "{bytes} bytes in {secs} s");
        }
    }
}

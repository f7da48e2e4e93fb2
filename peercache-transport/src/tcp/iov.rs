//! Vectored socket I/O straight between registered memory and the kernel.
//!
//! This is the one place of the TCP engine that turns addresses into memory accesses. Callers
//! must have validated every `(addr, len)` against a registered region, under the region
//! table's read guard, before building an iovec.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use peercache_wire::WireError;

/// Most iovecs passed to one `readv`/`writev` (Linux `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Builds an iovec for a validated range.
pub(crate) fn iovec(addr: u64, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: len,
    }
}

/// Tracks one batch's deadline and keeps the socket timeouts no longer than what is left.
#[derive(Debug)]
pub(crate) struct Deadline {
    at: Instant,
    armed: Option<Duration>,
    total: Duration,
}

impl Deadline {
    /// When the current operation must be done.
    pub(crate) fn at(&self) -> Instant {
        self.at
    }

    pub(crate) fn new(total: Duration) -> Self {
        Deadline {
            at: Instant::now() + total,
            armed: None,
            total,
        }
    }

    pub(crate) fn total(&self) -> Duration {
        self.total
    }

    /// Called before each blocking syscall: fails if the deadline passed, else shortens the
    /// socket timeouts when less time is left than they allow. Costs a syscall only when the
    /// armed timeout changes (once per batch in the common case).
    pub(crate) fn arm(
        &mut self,
        s: &TcpStream,
        current: &mut Option<Duration>,
    ) -> Result<(), WireError> {
        let now = Instant::now();
        if now >= self.at {
            return Err(WireError::Timeout(self.total));
        }
        let left = self.at - now;
        let want = match *current {
            Some(cur) if cur <= left => return Ok(()),
            _ => left.min(self.total).max(Duration::from_millis(1)),
        };
        // Round up so tiny re-arms do not happen on every call.
        s.set_read_timeout(Some(want))?;
        s.set_write_timeout(Some(want))?;
        *current = Some(want);
        self.armed = Some(want);
        Ok(())
    }
}

fn map(e: io::Error, d: &Deadline) -> WireError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::Timeout(d.total()),
        io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    }
}

/// Advances an iovec list past `n` bytes; returns the index of the first unfinished entry.
pub(crate) fn advance(iovs: &mut [libc::iovec], mut start: usize, mut n: usize) -> usize {
    while n > 0 && start < iovs.len() {
        let v = &mut iovs[start];
        if n >= v.iov_len {
            n -= v.iov_len;
            v.iov_len = 0;
            start += 1;
        } else {
            // SAFETY: `n < iov_len`, so the new base stays inside the same validated range.
            v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut libc::c_void;
            v.iov_len -= n;
            n = 0;
        }
    }
    while start < iovs.len() && iovs[start].iov_len == 0 {
        start += 1;
    }
    start
}

/// Copies `src` into the iovecs from entry `start` on, as far as either goes, and advances
/// them; returns the first unfinished entry and the bytes copied (a sealed link's opened
/// record landing in its destinations).
pub(crate) fn fill_from(iovs: &mut [libc::iovec], start: usize, src: &[u8]) -> (usize, usize) {
    let mut i = start;
    let mut copied = 0;
    while i < iovs.len() && copied < src.len() {
        let take = iovs[i].iov_len.min(src.len() - copied);
        // SAFETY: the iovec points into memory validated against a registered region (or a
        // buffer owned by the caller) with at least `iov_len >= take` bytes left, held alive by
        // the caller; `src` is a distinct buffer of the link, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src[copied..].as_ptr(),
                iovs[i].iov_base as *mut u8,
                take,
            );
        }
        copied += take;
        i = advance(iovs, i, take);
    }
    (advance(iovs, i, 0), copied)
}

/// Appends up to `max` bytes of the iovecs from entry `start` on to `out` and advances them;
/// returns the first unfinished entry (a sealed link gathering a record's plaintext).
pub(crate) fn drain_into(
    iovs: &mut [libc::iovec],
    start: usize,
    out: &mut Vec<u8>,
    max: usize,
) -> usize {
    let mut i = start;
    let mut taken = 0;
    while i < iovs.len() && taken < max {
        let take = iovs[i].iov_len.min(max - taken);
        // SAFETY: the iovec points into memory validated against a registered region (or a
        // buffer owned by the caller) with at least `iov_len >= take` readable bytes, held
        // alive by the caller for the duration of the call.
        let src = unsafe { std::slice::from_raw_parts(iovs[i].iov_base as *const u8, take) };
        out.extend_from_slice(src);
        taken += take;
        i = advance(iovs, i, take);
    }
    advance(iovs, i, 0)
}

/// Runs `op` (`readv` or `writev`) until every iovec is done, within the deadline. Group `g`
/// is the iovecs before `ends[g]` (and from `ends[g - 1]`); no call crosses a group's end, and
/// `done(g)` is called as soon as the group is complete (no groups: one run, calls as large as
/// the kernel takes).
fn transfer_all(
    s: &TcpStream,
    iovs: &mut [libc::iovec],
    d: &mut Deadline,
    armed: &mut Option<Duration>,
    op: unsafe extern "C" fn(libc::c_int, *const libc::iovec, libc::c_int) -> libc::ssize_t,
    ends: &[usize],
    done: &mut dyn FnMut(usize),
) -> Result<(), WireError> {
    let fd = s.as_raw_fd();
    let mut start = advance(iovs, 0, 0);
    let mut g = 0;
    loop {
        while g < ends.len() && start >= ends[g] {
            done(g);
            g += 1;
        }
        if start >= iovs.len() {
            return Ok(());
        }
        d.arm(s, armed)?;
        let end = ends.get(g).copied().unwrap_or(iovs.len()).min(iovs.len());
        let cnt = (end - start).min(IOV_MAX);
        // SAFETY: every iovec points into memory validated against a registered region (or a
        // buffer owned by the caller), held alive by the caller for the duration of the call;
        // `op` is `readv` or `writev`.
        let r = unsafe { op(fd, iovs[start..].as_ptr(), cnt as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(map(e, d));
        }
        if r == 0 {
            return Err(WireError::Closed);
        }
        start = advance(iovs, start, r as usize);
    }
}

/// Fills every iovec from the socket, within the deadline.
pub(crate) fn readv_exact(
    s: &TcpStream,
    iovs: &mut [libc::iovec],
    d: &mut Deadline,
    armed: &mut Option<Duration>,
) -> Result<(), WireError> {
    transfer_all(s, iovs, d, armed, libc::readv, &[], &mut |_| {})
}

/// Fills every iovec from the socket, within the deadline, one group at a time: group `g`
/// is the iovecs before `ends[g]` (and from `ends[g - 1]`), and `landed(g)` is called as soon
/// as all of them are full — while those bytes are still in the CPU's caches. No `readv`
/// crosses a group's end, so a group is reported before any byte of the next one arrives.
pub(crate) fn readv_exact_landing(
    s: &TcpStream,
    iovs: &mut [libc::iovec],
    ends: &[usize],
    d: &mut Deadline,
    armed: &mut Option<Duration>,
    landed: &mut dyn FnMut(usize),
) -> Result<(), WireError> {
    transfer_all(s, iovs, d, armed, libc::readv, ends, landed)
}

/// Writes every iovec to the socket, within the deadline.
pub(crate) fn writev_all(
    s: &TcpStream,
    iovs: &mut [libc::iovec],
    d: &mut Deadline,
    armed: &mut Option<Duration>,
) -> Result<(), WireError> {
    transfer_all(s, iovs, d, armed, libc::writev, &[], &mut |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_reported_in_order_as_their_bytes_land() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let mut bufs = [vec![0u8; 100], vec![0u8; 300], vec![0u8; 0], vec![0u8; 600]];
        // Groups: [0], [1, 2], [3].
        let mut v: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| iovec(b.as_mut_ptr() as u64, b.len()))
            .collect();
        let writer = std::thread::spawn(move || {
            for part in data.chunks(70) {
                tx.write_all(part).unwrap();
            }
        });
        let mut d = Deadline::new(Duration::from_secs(10));
        let mut seen = Vec::new();
        readv_exact_landing(&rx, &mut v, &[1, 3, 4], &mut d, &mut None, &mut |g| {
            seen.push(g)
        })
        .unwrap();
        writer.join().unwrap();
        assert_eq!(seen, vec![0, 1, 2]);
        let got: Vec<u8> = bufs.concat();
        let want: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_peer_that_closes_early_is_an_error_after_the_groups_that_landed() {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        tx.write_all(&[7u8; 150]).unwrap();
        drop(tx);
        let mut bufs = [vec![0u8; 100], vec![0u8; 100]];
        let mut v: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| iovec(b.as_mut_ptr() as u64, b.len()))
            .collect();
        let mut d = Deadline::new(Duration::from_secs(10));
        let mut seen = Vec::new();
        let r = readv_exact_landing(&rx, &mut v, &[1, 2], &mut d, &mut None, &mut |g| {
            seen.push(g)
        });
        assert!(matches!(r, Err(WireError::Closed)), "{r:?}");
        assert_eq!(seen, vec![0], "only the whole first group landed");
    }

    #[test]
    fn advance_walks_partial_and_whole_entries() {
        let a = [0u8; 10];
        let b = [0u8; 5];
        let mut v = [iovec(a.as_ptr() as u64, 10), iovec(b.as_ptr() as u64, 5)];
        let s = advance(&mut v, 0, 3);
        assert_eq!(s, 0);
        assert_eq!(v[0].iov_len, 7);
        let s = advance(&mut v, s, 9);
        assert_eq!(s, 1);
        assert_eq!(v[1].iov_len, 3);
        assert_eq!(advance(&mut v, s, 3), 2);
    }
}

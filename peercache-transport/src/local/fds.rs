//! Descriptor passing over the lease socket (`SCM_RIGHTS`), the checks a received memory file
//! must pass before it is mapped, and the lease liveness probe.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use crate::RegionKey;
use crate::local::codec::{ENTRY_LEN, MAX_SHARED_REGIONS, TABLE_HDR, table_count, table_entries};
use crate::local::error::LocalError;

/// Room for the control message carrying up to `n` descriptors (8-byte aligned).
pub(crate) fn cmsg_room(n: usize) -> usize {
    // SAFETY: pure arithmetic on the length.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<i32>()) as u32) as usize }
}

pub(crate) fn send_with_fds(s: &UnixStream, body: &[u8], fds: &[i32]) -> std::io::Result<()> {
    let mut control = vec![0u64; cmsg_room(fds.len().max(1)).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: body.as_ptr() as *mut libc::c_void,
        iov_len: body.len(),
    };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = cmsg_room(fds.len()) as _;
        // SAFETY: `control` has room for one header plus `fds.len()` descriptors
        // (`cmsg_room`), so the first header and its data area lie inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut i32, fds.len());
        }
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The descriptors went with the first byte; the rest (if any) is plain data.
    let mut w = s;
    w.write_all(&body[n as usize..])
}

/// One received table entry: key, the owner's base address, length, file offset, file.
pub(crate) type Received = (RegionKey, u64, u64, u64, OwnedFd);

/// Receives the region table and its descriptors.
pub(crate) fn recv_table(s: &UnixStream) -> Result<Vec<Received>, LocalError> {
    let max = TABLE_HDR + MAX_SHARED_REGIONS * ENTRY_LEN;
    let mut body = vec![0u8; max];
    let mut control = vec![0u64; cmsg_room(MAX_SHARED_REGIONS).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr().cast(),
        iov_len: body.len(),
    };
    // SAFETY: a zeroed msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = (control.len() * 8) as _;
    // SAFETY: `msg` points at live buffers of the lengths it names.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(LocalError::Io {
            step: "recvmsg",
            source: std::io::Error::last_os_error(),
        });
    }
    // Take ownership of every descriptor first, so each is closed whatever happens next.
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: the kernel filled `msg_control` up to `msg_controllen`; the CMSG_* walk stays
    // inside it and each SCM_RIGHTS payload holds `(cmsg_len - CMSG_LEN(0)) / 4` descriptors
    // that now belong to this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let p = libc::CMSG_DATA(c) as *const i32;
                for i in 0..bytes / std::mem::size_of::<i32>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(LocalError::TooManyDescriptors);
    }
    let mut n = n as usize;
    if n < TABLE_HDR {
        let mut r = s;
        r.read_exact(&mut body[n..TABLE_HDR])
            .map_err(|source| LocalError::Io {
                step: "region table header",
                source,
            })?;
        n = TABLE_HDR;
    }
    let count = table_count(&body[..TABLE_HDR], fds.len())?;
    let total = TABLE_HDR + count * ENTRY_LEN;
    if n < total {
        let mut r = s;
        r.read_exact(&mut body[n..total])
            .map_err(|source| LocalError::Io {
                step: "region table",
                source,
            })?;
    }
    let entries = table_entries(&body[..total], count);
    Ok(entries
        .into_iter()
        .zip(fds)
        .map(|((k, base, len, off), fd)| (k, base, len, off, fd))
        .collect())
}

/// The seals a shared memory file must carry: no shrinking (a mapping can never lose pages
/// under a reader: no `SIGBUS`) and no writes through any descriptor but the owner's own
/// mapping made before the seal (`F_SEAL_FUTURE_WRITE`, or the stricter `F_SEAL_WRITE`).
fn sealed_for_sharing(seals: libc::c_int) -> bool {
    seals >= 0
        && seals & libc::F_SEAL_SHRINK != 0
        && seals & (libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_WRITE) != 0
}

/// Checks a memory file before it is shared (owner) or mapped (reader): sealed against
/// shrinking and writing, and long enough for the range at a page-aligned offset.
pub(crate) fn check_file(fd: &OwnedFd, offset: u64, len: u64) -> Result<(), LocalError> {
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if !sealed_for_sharing(seals) {
        return Err(LocalError::Unsealed);
    }
    // SAFETY: a zeroed stat is valid output space for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat into `st` on a descriptor we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(LocalError::Io {
            step: "fstat",
            source: std::io::Error::last_os_error(),
        });
    }
    let size = st.st_size as u64;
    let fits = offset.checked_add(len).is_some_and(|end| end <= size);
    if !fits || len == 0 || !offset.is_multiple_of(4096) {
        return Err(LocalError::BadFileRange { size, len, offset });
    }
    Ok(())
}

/// Whether the other end of a lease is still there. Neither side sends after attaching, so
/// anything readable (end of stream, an error) means it closed. One non-blocking peek.
pub(crate) fn lease_open(s: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a non-blocking peek of at most one byte into `b`.
    let r = unsafe {
        libc::recv(
            s.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// Checks a descriptor the owner is about to hand to peers: a read-only open of a memory file
/// that passes [`check_file`]. A read-write descriptor is refused even though the seals already
/// stop writes: what leaves this process carries no write permission at all.
pub(crate) fn check_shareable(fd: &OwnedFd, offset: u64, len: u64) -> Result<(), LocalError> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDONLY {
        return Err(LocalError::Writable);
    }
    check_file(fd, offset, len)
}

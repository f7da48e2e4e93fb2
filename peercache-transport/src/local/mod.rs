//! The host-local path: a peer on the same host reads this node's shared regions straight out
//! of memory — one copy, no socket, no server thread — instead of over loopback TCP.
//!
//! A region is shared when its memory is a sealed memory file ([`crate::Transport::share`];
//! the pool maps one with `MemfdAlloc`). A reader attaches in the background after its first
//! successful network read from a peer (never delaying a read, never asking a peer that does
//! not answer), in three steps:
//!
//! 1. the reader opens the peer's data port on the [`Plane::HostLocal`] plane (the usual
//!    authenticated handshake) and gets the name of an abstract Unix socket plus a 128-bit
//!    token;
//! 2. it connects to that socket — which only works from the same host and network namespace,
//!    so a peer elsewhere simply stays on TCP — and sends the token;
//! 3. the owner answers with its shared, remote-readable regions and their file descriptors
//!    (`SCM_RIGHTS`); the reader checks each file is sealed against shrinking and long enough,
//!    then maps it read-only.
//!
//! The Unix connection stays open as a lease: the owner closes every one whenever its set of
//! shared regions changes or it shuts down, and the reader checks its end once per batch (a
//! non-blocking peek), re-attaching or falling back to TCP when it finds it closed.
//!
//! Reads copy like RDMA READs do: the owner may rewrite a slot during the copy, so callers
//! verify what they read (the store checks every page's header and checksum).
//!
//! [`Plane::HostLocal`]: peercache_wire::handshake::Plane::HostLocal

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use peercache_wire::WireError;
use peercache_wire::auth::Auth;
use peercache_wire::handshake::{self, Hello, Plane};

use crate::region::{Region, RegionTable, SharedFile};
use crate::stats::Counters;
use crate::validate;
use crate::{Batch, OpResults, RegionKey};

const REPLY_MAGIC: u32 = 0x5043_484c;
const TABLE_MAGIC: u32 = 0x5043_4854;
const VERSION: u8 = 1;
const TOKEN_LEN: usize = 16;
/// Most regions one owner shares (one file descriptor each in one message).
pub(crate) const MAX_SHARED_REGIONS: usize = 32;
const TABLE_HDR: usize = 12;
const ENTRY_LEN: usize = 32;
/// Longest wait for an attaching reader's token.
const TOKEN_WAIT: Duration = Duration::from_millis(500);
/// How long a peer that could not be attached (a timeout, a refused connection) stays on the
/// network before the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The same when the answer is settled: the peer is on another host, or does not offer the
/// path. Only a restart changes that, and a restarted peer is asked again after this.
const RETRY_SETTLED: Duration = Duration::from_secs(300);

/// Why the same-host path could not attach to a peer or use one of its regions.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LocalError {
    /// A socket step failed (connect, timeouts, token, reading the table).
    #[error("{step}: {source}")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The data port's handshake or invitation frame failed.
    #[error("{step}: {source}")]
    Wire {
        /// What was being done.
        step: &'static str,
        /// Cause.
        #[source]
        source: WireError,
    },
    /// The peer's abstract socket is not reachable: it runs on another host or network
    /// namespace.
    #[error("not on this host: {0}")]
    NotOnThisHost(#[source] std::io::Error),
    /// The bytes are not what this build of the path sends.
    #[error("not a host-local {0}")]
    NotOurs(&'static str),
    /// The peer speaks another version of the path.
    #[error("host-local version {got} (this build speaks {VERSION})")]
    Version {
        /// The version received.
        got: u8,
    },
    /// A message ended early.
    #[error("truncated host-local {0}")]
    Truncated(&'static str),
    /// The invitation's socket name is not UTF-8.
    #[error("socket name is not UTF-8")]
    BadName,
    /// More descriptors than a table may carry.
    #[error("too many descriptors in the region table")]
    TooManyDescriptors,
    /// The table's count and the descriptors that came with it disagree.
    #[error("region table names {count} regions but carried {fds} descriptors")]
    CountMismatch {
        /// Regions named.
        count: usize,
        /// Descriptors received.
        fds: usize,
    },
    /// A memory file is not sealed against shrinking (a mapping could lose pages).
    #[error("memory file is not sealed against shrinking")]
    Unsealed,
    /// A memory file cannot hold the region at its offset.
    #[error("memory file of {size} bytes cannot hold {len} bytes at offset {offset}")]
    BadFileRange {
        /// File size.
        size: u64,
        /// Region length.
        len: u64,
        /// Offset in the file (page-aligned when valid).
        offset: u64,
    },
}

/// Why an attach failed, and whether asking again soon could change the answer.
struct AttachError {
    why: LocalError,
    settled: bool,
}

impl AttachError {
    fn transient(why: LocalError) -> Self {
        AttachError {
            why,
            settled: false,
        }
    }
    fn settled(why: LocalError) -> Self {
        AttachError { why, settled: true }
    }
}

/// What the data port tells a host-local client: where to attach and with which token.
#[derive(Clone, Debug)]
pub(crate) struct Invitation {
    name: String,
    token: [u8; TOKEN_LEN],
}

impl Invitation {
    /// Encodes the reply sent on the [`Plane::HostLocal`] plane.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + TOKEN_LEN + self.name.len());
        out.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.name.len() as u8);
        out.extend_from_slice(&self.token);
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    fn decode(b: &[u8]) -> Result<Self, LocalError> {
        if b.len() < 6 + TOKEN_LEN || b[..4] != REPLY_MAGIC.to_le_bytes() {
            return Err(LocalError::NotOurs("invitation"));
        }
        if b[4] != VERSION {
            return Err(LocalError::Version { got: b[4] });
        }
        let n = b[5] as usize;
        let name = b
            .get(6 + TOKEN_LEN..6 + TOKEN_LEN + n)
            .ok_or(LocalError::Truncated("invitation"))?;
        Ok(Invitation {
            name: String::from_utf8(name.to_vec()).map_err(|_| LocalError::BadName)?,
            token: b[6..6 + TOKEN_LEN].try_into().expect("16 bytes"),
        })
    }
}

fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: writes at most `N - got` bytes into the rest of `b`.
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), N - got, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            got += r as usize;
        }
    }
    Ok(b)
}

fn same_token(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The owner's side: the abstract Unix listener that hands shared regions to attached peers.
pub(crate) struct LocalServer {
    pub(crate) invitation: Invitation,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    leases: Arc<Leases>,
}

/// The lease connections of attached peers. All are closed whenever the region table's set of
/// shared regions changes, so readers re-attach (or fall back) before their next read.
#[derive(Debug, Default)]
struct Leases {
    open: Mutex<Vec<UnixStream>>,
}

impl Leases {
    /// Keeps `lease` open, unless the shared set changed since the table was sent
    /// (`seen`): then the table the peer got may be stale, and the lease is closed at once.
    fn add(&self, lease: UnixStream, seen: u64, table: &RegionTable) {
        let mut v = self.open.lock();
        v.retain(lease_open);
        if table.shared_changes() != seen {
            let _ = lease.shutdown(std::net::Shutdown::Both);
            return;
        }
        v.push(lease);
    }

    fn revoke(&self) {
        for s in self.open.lock().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl LocalServer {
    /// Binds a fresh abstract socket and starts its accept thread.
    pub(crate) fn start(table: Arc<RegionTable>, timeout: Duration) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let token = random_bytes::<TOKEN_LEN>()?;
        let tag = u64::from_le_bytes(random_bytes::<8>()?);
        let name = format!("peercache-local-{}-{tag:016x}", std::process::id());
        let listener = UnixListener::bind_addr(&UnixAddr::from_abstract_name(&name)?)?;
        let leases = Arc::new(Leases::default());
        table.watch({
            let leases = leases.clone();
            move || leases.revoke()
        });
        let thread = std::thread::Builder::new()
            .name("pc-local-accept".into())
            .spawn({
                let stop = stop.clone();
                let leases = leases.clone();
                move || accept_loop(listener, table, stop, token, timeout, &leases)
            })?;
        Ok(LocalServer {
            invitation: Invitation { name, token },
            stop,
            thread: Mutex::new(Some(thread)),
            leases,
        })
    }

    /// Closes every lease (readers stop using their mappings before their next read).
    pub(crate) fn revoke(&self) {
        self.leases.revoke();
    }

    /// Number of open leases.
    pub(crate) fn lease_count(&self) -> usize {
        self.leases.open.lock().len()
    }

    /// Stops the accept thread. Idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Ok(addr) = UnixAddr::from_abstract_name(&self.invitation.name) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    table: Arc<RegionTable>,
    stop: Arc<AtomicBool>,
    token: [u8; TOKEN_LEN],
    timeout: Duration,
    leases: &Leases,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut s) = conn else { continue };
        // A reader sends its token right after connecting: a short wait keeps one stalled
        // client from holding up the others.
        let wait = timeout.min(TOKEN_WAIT);
        if s.set_read_timeout(Some(wait)).is_err() || s.set_write_timeout(Some(timeout)).is_err() {
            continue;
        }
        let mut got = [0u8; TOKEN_LEN];
        if s.read_exact(&mut got).is_err() || !same_token(&got, &token) {
            tracing::debug!("host-local attach without the right token; closed");
            continue;
        }
        // Hold the table's read guard while sending, so no shared region goes away between
        // listing it and handing out its descriptor (deregistration also revokes attachments).
        let regions = table.read();
        let seen = table.shared_changes();
        let shared = shared_regions(&regions);
        let sent = send_table(&s, &shared);
        drop(regions);
        match sent {
            Ok(()) => leases.add(s, seen, &table),
            Err(e) => tracing::debug!(error = %e, "host-local attach failed while sending"),
        }
    }
}

type SharedEntry = (RegionKey, u64, u64, SharedFile);

fn shared_regions(regions: &HashMap<RegionKey, Region>) -> Vec<SharedEntry> {
    let mut out: Vec<SharedEntry> = regions
        .iter()
        .filter(|(_, r)| r.access.allows_remote_read() && !r.device)
        .filter_map(|(k, r)| r.shared.clone().map(|f| (*k, r.base, r.len, f)))
        .collect();
    out.sort_by_key(|e| e.1);
    out.truncate(MAX_SHARED_REGIONS);
    out
}

fn send_table(s: &UnixStream, shared: &[SharedEntry]) -> std::io::Result<()> {
    let mut body = Vec::with_capacity(TABLE_HDR + shared.len() * ENTRY_LEN);
    body.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
    body.extend_from_slice(&[VERSION, 0, 0, 0]);
    body.extend_from_slice(&(shared.len() as u32).to_le_bytes());
    for (k, base, len, f) in shared {
        for v in [k.0, *base, *len, f.offset] {
            body.extend_from_slice(&v.to_le_bytes());
        }
    }
    let fds: Vec<i32> = shared.iter().map(|e| e.3.fd.as_raw_fd()).collect();
    send_with_fds(s, &body, &fds)
}

/// Room for the control message carrying up to `n` descriptors (8-byte aligned).
fn cmsg_room(n: usize) -> usize {
    // SAFETY: pure arithmetic on the length.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<i32>()) as u32) as usize }
}

fn send_with_fds(s: &UnixStream, body: &[u8], fds: &[i32]) -> std::io::Result<()> {
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
type Received = (RegionKey, u64, u64, u64, OwnedFd);

/// Receives the region table and its descriptors.
fn recv_table(s: &UnixStream) -> Result<Vec<Received>, LocalError> {
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

/// Validates a region table header against the descriptors that came with it; the count.
fn table_count(hdr: &[u8], fds: usize) -> Result<usize, LocalError> {
    if hdr.len() < TABLE_HDR || hdr[..4] != TABLE_MAGIC.to_le_bytes() || hdr[4] != VERSION {
        return Err(LocalError::NotOurs("region table"));
    }
    let count = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
    if count > MAX_SHARED_REGIONS || count != fds {
        return Err(LocalError::CountMismatch { count, fds });
    }
    Ok(count)
}

/// The `count` entries of a table whose header `table_count` accepted: key, the owner's base
/// address, length, file offset.
fn table_entries(body: &[u8], count: usize) -> Vec<(RegionKey, u64, u64, u64)> {
    let word = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    (0..count)
        .map(|i| {
            let at = TABLE_HDR + i * ENTRY_LEN;
            (
                RegionKey(word(at)),
                word(at + 8),
                word(at + 16),
                word(at + 24),
            )
        })
        .collect()
}

/// Runs the host-local decoders (invitation, region table) on arbitrary bytes. For the fuzz
/// target: never a panic, whatever the bytes.
pub(crate) fn fuzz_decode(data: &[u8]) -> usize {
    let inv = Invitation::decode(data).map_or(0, |i| i.name.len());
    let fds = data
        .first()
        .map_or(0, |b| *b as usize % (MAX_SHARED_REGIONS + 2));
    let entries = match data.get(..TABLE_HDR).map(|h| table_count(h, fds)) {
        Some(Ok(count)) if data.len() >= TABLE_HDR + count * ENTRY_LEN => {
            table_entries(&data[..TABLE_HDR + count * ENTRY_LEN], count).len()
        }
        _ => 0,
    };
    inv + entries
}

/// Checks a received memory file before mapping it: sealed against shrinking (so the mapping
/// can never lose pages under us) and long enough for the range.
pub(crate) fn check_file(fd: &OwnedFd, offset: u64, len: u64) -> Result<(), LocalError> {
    // SAFETY: fcntl on a descriptor we own.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
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

/// One peer region mapped read-only into this process.
struct Mapped {
    key: RegionKey,
    /// The peer's address of the region's first byte.
    base: u64,
    len: u64,
    ptr: *const u8,
}

/// An attachment to one peer: its shared regions mapped here, and the lease connection.
struct View {
    lease: UnixStream,
    regions: Vec<Mapped>,
}

// SAFETY: the mappings are read-only views owned by this value (unmapped on drop, after the
// last `Arc` holder is done); the raw pointers are never written through.
unsafe impl Send for View {}
// SAFETY: as above; concurrent readers only copy out of the mappings.
unsafe impl Sync for View {}

impl Drop for View {
    fn drop(&mut self) {
        for m in &self.regions {
            // SAFETY: each mapping was created by `attach` with exactly this length and is
            // unmapped once, when no batch holds the view any more.
            unsafe { libc::munmap(m.ptr as *mut libc::c_void, m.len as usize) };
        }
    }
}

impl View {
    /// The owner keeps the lease open while the table it sent is current.
    fn current(&self) -> bool {
        lease_open(&self.lease)
    }

    fn find(&self, key: RegionKey) -> Option<&Mapped> {
        self.regions.iter().find(|m| m.key == key)
    }
}

enum Entry {
    /// An attach runs in the background.
    Pending,
    Attached(Arc<View>),
    /// Not attachable (another host, the path off there, a failed attach) until then.
    Unavailable(Instant),
}

/// What an attach needs, shared with the background thread that runs it.
struct Attacher {
    hello: Hello,
    auth: Auth,
    timeout: Duration,
    peers: RwLock<HashMap<SocketAddr, Entry>>,
    counters: Arc<Counters>,
    /// The lease watcher runs (started with the first attachment).
    watching: AtomicBool,
}

/// How often the lease watcher picks up new attachments.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Drops attachments whose lease closed as soon as it closes, whether or not anything reads
/// from that peer again: a mapping keeps the owner's whole pool alive, so a dead owner's memory
/// must not stay pinned by a reader that simply stopped asking it. Ends once the client is gone.
fn watch_leases(attacher: std::sync::Weak<Attacher>) {
    loop {
        let Some(a) = attacher.upgrade() else { return };
        let views: Vec<(SocketAddr, Arc<View>)> = a
            .peers
            .read()
            .iter()
            .filter_map(|(p, e)| match e {
                Entry::Attached(v) => Some((*p, v.clone())),
                _ => None,
            })
            .collect();
        drop(a);
        let mut fds: Vec<libc::pollfd> = views
            .iter()
            .map(|(_, v)| libc::pollfd {
                fd: v.lease.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfd entries whose descriptors stay
        // open for the call (the views are held).
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                WATCH_EVERY.as_millis() as libc::c_int,
            )
        };
        if n <= 0 {
            continue;
        }
        let Some(a) = attacher.upgrade() else { return };
        let mut peers = a.peers.write();
        for ((peer, v), pfd) in views.iter().zip(&fds) {
            if pfd.revents == 0 || v.current() {
                continue;
            }
            if matches!(peers.get(peer), Some(Entry::Attached(cur)) if Arc::ptr_eq(cur, v)) {
                peers.remove(peer);
                tracing::debug!(%peer, "host-local lease closed by the owner; mapping dropped");
            }
        }
    }
}

/// The reader's side: attachments to peers on this host.
///
/// Attaching never delays a read: it starts in the background after a network read from the
/// peer succeeded (so only real, answering PeerCache nodes are ever asked), and batches keep
/// taking the network until it is done.
pub(crate) struct LocalClient {
    inner: Arc<Attacher>,
    /// `peercache_transport_local_read_bytes_total`.
    local_read_bytes: metrics::Counter,
}

impl LocalClient {
    pub(crate) fn new(
        mut hello: Hello,
        auth: Auth,
        timeout: Duration,
        counters: Arc<Counters>,
        local_read_bytes: metrics::Counter,
    ) -> Self {
        hello.plane = Plane::HostLocal;
        LocalClient {
            local_read_bytes,
            inner: Arc::new(Attacher {
                hello,
                auth,
                timeout,
                peers: RwLock::new(HashMap::new()),
                counters,
                watching: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn forget(&self, peer: SocketAddr) {
        self.inner.peers.write().remove(&peer);
    }

    /// Number of peers currently attached.
    pub(crate) fn attached(&self) -> usize {
        self.inner
            .peers
            .read()
            .values()
            .filter(|e| matches!(e, Entry::Attached(_)))
            .count()
    }

    /// Whether reads from `peer` currently copy from its shared memory.
    pub(crate) fn is_attached(&self, peer: SocketAddr) -> bool {
        matches!(self.inner.peers.read().get(&peer), Some(Entry::Attached(v)) if v.current())
    }

    /// The current attachment to `peer`, if any. A closed lease drops it (the next network
    /// read from the peer attaches again).
    fn view(&self, peer: SocketAddr) -> Option<Arc<View>> {
        match self.inner.peers.read().get(&peer) {
            Some(Entry::Attached(v)) if v.current() => return Some(v.clone()),
            Some(Entry::Attached(_)) => {}
            _ => return None,
        }
        let mut peers = self.inner.peers.write();
        if matches!(peers.get(&peer), Some(Entry::Attached(v)) if !v.current()) {
            peers.remove(&peer);
        }
        None
    }

    /// Called after a read from `peer` succeeded over the network: starts an attach in the
    /// background unless one is running, done, or not due yet.
    pub(crate) fn network_read_ok(&self, peer: SocketAddr) {
        let due = |e: Option<&Entry>| match e {
            None => true,
            Some(Entry::Unavailable(t)) => Instant::now() >= *t,
            Some(_) => false,
        };
        if !due(self.inner.peers.read().get(&peer)) {
            return;
        }
        {
            let mut peers = self.inner.peers.write();
            if !due(peers.get(&peer)) {
                return;
            }
            peers.insert(peer, Entry::Pending);
        }
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("pc-local-attach".into())
            .spawn(move || {
                let entry = match inner.attach(peer) {
                    Ok(v) => {
                        Counters::add(&inner.counters.local_attaches, 1);
                        tracing::info!(%peer, regions = v.regions.len(), "host-local path attached: reads from this peer copy from shared memory");
                        Entry::Attached(Arc::new(v))
                    }
                    Err(e) => {
                        let why = e.why;
                        tracing::debug!(%peer, %why, settled = e.settled, "no host-local path to this peer; reads go over the network");
                        let wait = if e.settled { RETRY_SETTLED } else { RETRY_AFTER };
                        Entry::Unavailable(Instant::now() + wait)
                    }
                };
                let attached = matches!(entry, Entry::Attached(_));
                {
                    let mut peers = inner.peers.write();
                    // A `forget` meanwhile wins.
                    if matches!(peers.get(&peer), Some(Entry::Pending)) {
                        peers.insert(peer, entry);
                    }
                }
                if attached && !inner.watching.swap(true, Ordering::AcqRel) {
                    let weak = Arc::downgrade(&inner);
                    let started = std::thread::Builder::new()
                        .name("pc-local-leases".into())
                        .spawn(move || watch_leases(weak));
                    if started.is_err() {
                        // Batches still peek at their lease; try again with the next attach.
                        inner.watching.store(false, Ordering::Release);
                    }
                }
            });
        if spawned.is_err() {
            self.inner
                .peers
                .write()
                .insert(peer, Entry::Unavailable(Instant::now() + RETRY_AFTER));
        }
    }
}

impl Attacher {
    fn attach(&self, peer: SocketAddr) -> Result<View, AttachError> {
        let until = Instant::now() + self.timeout;
        let left = || {
            until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let t = |step: &'static str| {
            move |source: std::io::Error| AttachError::transient(LocalError::Io { step, source })
        };
        let mut tcp = TcpStream::connect_timeout(&peer, left()).map_err(t("connect"))?;
        handshake::client_sync(&mut tcp, &self.hello, &self.auth, left()).map_err(|source| {
            let settled = matches!(source, WireError::Handshake(_));
            let why = LocalError::Wire {
                step: "handshake",
                source,
            };
            // The peer answered and refused the plane: it does not offer the path.
            AttachError { why, settled }
        })?;
        tcp.set_read_timeout(Some(left())).map_err(t("timeout"))?;
        let mut buf = Vec::new();
        peercache_wire::frame::read_frame(&mut tcp, 512, &mut buf).map_err(|source| {
            AttachError::transient(LocalError::Wire {
                step: "invitation",
                source,
            })
        })?;
        let inv = Invitation::decode(&buf).map_err(AttachError::settled)?;
        let addr = UnixAddr::from_abstract_name(&inv.name).map_err(|source| {
            AttachError::settled(LocalError::Io {
                step: "socket name",
                source,
            })
        })?;
        // Only a process on this host (and network namespace) can reach the socket.
        let mut lease = UnixStream::connect_addr(&addr)
            .map_err(|e| AttachError::settled(LocalError::NotOnThisHost(e)))?;
        lease
            .set_read_timeout(Some(left()))
            .and_then(|_| lease.set_write_timeout(Some(left())))
            .map_err(t("timeout"))?;
        lease.write_all(&inv.token).map_err(t("token"))?;
        let table = recv_table(&lease).map_err(AttachError::transient)?;
        let mut regions = Vec::with_capacity(table.len());
        for (key, base, len, offset, fd) in table {
            if let Err(why) = check_file(&fd, offset, len) {
                tracing::warn!(%peer, %why, "host-local region refused; it is read over the network");
                continue;
            }
            // SAFETY: a read-only shared mapping of a sealed file at least `offset + len`
            // long (checked above); the result is checked and owned by the view.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    offset as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                tracing::warn!(%peer, error = %std::io::Error::last_os_error(), "host-local mapping failed");
                continue;
            }
            regions.push(Mapped {
                key,
                base,
                len,
                ptr: p as *const u8,
            });
        }
        // An empty view is kept too: its lease says when the owner starts sharing.
        Ok(View { lease, regions })
    }
}

impl LocalClient {
    /// Runs a read batch over shared memory if every op names a region `peer` shares with
    /// this host; `None` hands the whole batch to the network path.
    pub(crate) fn read_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        table: &RegionTable,
        max_op_bytes: u32,
        counters: &Counters,
    ) -> Option<OpResults> {
        if batch.is_empty() {
            return None;
        }
        let view = self.view(peer)?;
        if !batch
            .ops()
            .iter()
            .all(|op| view.find(op.remote.region).is_some())
        {
            return None;
        }
        let mut results: OpResults = Vec::with_capacity(batch.len());
        // The guard keeps every local region alive for the whole batch.
        let regions = table.read();
        let (mut ok, mut bytes) = (0u64, 0u64);
        for op in batch.ops() {
            let m = view.find(op.remote.region).expect("checked above");
            let r = validate::op_len(op.remote.len, max_op_bytes)
                .and_then(|()| {
                    validate::range(m.key, m.base, m.len, op.remote.addr, op.remote.len.into())
                })
                .and_then(|()| validate::local_segments(&regions, batch, op, max_op_bytes));
            if r.is_ok() {
                let mut src = m.ptr.wrapping_add((op.remote.addr - m.base) as usize);
                for s in batch.op_segments(op) {
                    // SAFETY: `src..src+len` lies inside the read-only mapping (checked by
                    // the range check; the segments add up to the op's length); the
                    // destination is a registered local region (kept alive by `regions`) or
                    // caller memory the batch vouches for (`local_segments`). The owner may
                    // write the source concurrently: bytes may be torn, never out of
                    // bounds, and callers verify them.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src, s.addr as *mut u8, s.len as usize)
                    };
                    src = src.wrapping_add(s.len as usize);
                }
                ok += 1;
                bytes += op.remote.len as u64;
            }
            results.push(r);
        }
        drop(regions);
        // Reads, bytes and errors are counted with the transport's other reads by the caller.
        Counters::add(&counters.local_read_ops, ok);
        Counters::add(&counters.local_read_bytes, bytes);
        self.local_read_bytes.increment(bytes);
        Some(results)
    }
}

/// The same-host path as one of the transport's data paths: this node's listener (what it
/// shares) and its attachments to peers on this host (what it reads).
pub(crate) struct LocalPath {
    server: LocalServer,
    client: LocalClient,
    table: Arc<RegionTable>,
    max_op_bytes: u32,
    counters: Arc<Counters>,
    metrics: crate::metrics::Handles,
}

impl LocalPath {
    /// Starts the listener; `hello` is the data plane's (the attach uses its own plane).
    pub(crate) fn start(
        table: Arc<RegionTable>,
        cfg: &crate::TransportConfig,
        hello: Hello,
        counters: Arc<Counters>,
        metrics: crate::metrics::Handles,
    ) -> std::io::Result<Self> {
        let server = LocalServer::start(table.clone(), cfg.op_timeout)?;
        let client = LocalClient::new(
            hello,
            cfg.auth.clone(),
            cfg.op_timeout,
            counters.clone(),
            metrics.local_read_bytes.clone(),
        );
        Ok(LocalPath {
            server,
            client,
            table,
            max_op_bytes: cfg.max_op_bytes,
            counters,
            metrics,
        })
    }

    /// What the data port answers on the same-host plane.
    pub(crate) fn invitation(&self) -> Invitation {
        self.server.invitation.clone()
    }

    /// Whether reads from `peer` currently copy from its shared memory.
    pub(crate) fn is_attached(&self, peer: SocketAddr) -> bool {
        self.client.is_attached(peer)
    }
}

impl std::fmt::Debug for LocalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPath")
            .field("socket", &self.server.invitation.name)
            .finish()
    }
}

impl crate::path::DataPath for LocalPath {
    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> crate::path::Carried {
        let res =
            self.client
                .read_batch(peer, batch, &self.table, self.max_op_bytes, &self.counters)?;
        self.counters.count_batch(&self.metrics, false, batch, &res);
        Some(Ok(res))
    }

    fn read_elsewhere(&self, peer: SocketAddr, outcome: &Result<OpResults, crate::TransportError>) {
        if matches!(outcome, Ok(r) if r.iter().any(|x| x.is_ok())) {
            self.client.network_read_ok(peer);
        }
    }

    fn forget_peer(&self, peer: SocketAddr) {
        self.client.forget(peer);
    }

    fn add_stats(&self, s: &mut crate::TransportStats) {
        s.local_peers = self.client.attached() as u64;
        s.local_leases = self.server.lease_count() as u64;
    }

    fn shutdown(&self) {
        self.server.stop();
        self.server.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invitation_round_trips_and_rejects_garbage() {
        let inv = Invitation {
            name: "peercache-local-1-00ff".into(),
            token: [7; TOKEN_LEN],
        };
        let back = Invitation::decode(&inv.encode()).unwrap();
        assert_eq!(back.name, inv.name);
        assert_eq!(back.token, inv.token);
        assert!(Invitation::decode(b"short").is_err());
        let mut bad = inv.encode();
        bad[4] = 9;
        assert!(matches!(
            Invitation::decode(&bad),
            Err(LocalError::Version { .. })
        ));
        let mut cut = inv.encode();
        cut.truncate(cut.len() - 3);
        assert!(Invitation::decode(&cut).is_err());
    }

    #[test]
    fn region_tables_must_match_their_descriptors() {
        let mut body = Vec::new();
        body.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
        body.extend_from_slice(&[VERSION, 0, 0, 0]);
        body.extend_from_slice(&2u32.to_le_bytes());
        for v in [11u64, 0x1000, 8192, 0, 12, 0x9000, 4096, 8192] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(table_count(&body, 2).unwrap(), 2);
        assert_eq!(
            table_entries(&body, 2),
            vec![
                (RegionKey(11), 0x1000, 8192, 0),
                (RegionKey(12), 0x9000, 4096, 8192)
            ]
        );
        assert!(table_count(&body, 1).is_err(), "one descriptor short");
        assert!(table_count(&body[..8], 2).is_err(), "truncated header");
        let mut wrong = body.clone();
        wrong[0] ^= 1;
        assert!(table_count(&wrong, 2).is_err());
        let mut huge = body.clone();
        huge[8..12].copy_from_slice(&(MAX_SHARED_REGIONS as u32 + 1).to_le_bytes());
        assert!(table_count(&huge, MAX_SHARED_REGIONS + 1).is_err());
        assert_eq!(
            fuzz_decode(&body),
            0,
            "two descriptors are not implied by the byte"
        );
    }

    #[test]
    fn tokens_compare_whole() {
        let a = [1u8; TOKEN_LEN];
        let mut b = a;
        assert!(same_token(&a, &b));
        b[15] = 2;
        assert!(!same_token(&a, &b));
    }

    #[test]
    fn unsealed_or_short_files_are_refused() {
        // SAFETY: a fresh memory file this test owns.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizes the file we own.
        assert_eq!(unsafe { libc::ftruncate(raw, 1 << 16) }, 0);
        assert!(matches!(
            check_file(&fd, 0, 4096),
            Err(LocalError::Unsealed)
        ));
        let sealed = {
            // SAFETY: a fresh memory file this test owns.
            let raw = unsafe {
                libc::memfd_create(c"s".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            };
            // SAFETY: `raw` is ours; sized then sealed.
            unsafe {
                assert_eq!(libc::ftruncate(raw, 1 << 16), 0);
                assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
                OwnedFd::from_raw_fd(raw)
            }
        };
        check_file(&sealed, 0, 1 << 16).unwrap();
        assert!(check_file(&sealed, 4096, 1 << 16).is_err(), "past the end");
        assert!(check_file(&sealed, 100, 4096).is_err(), "unaligned offset");
    }
}

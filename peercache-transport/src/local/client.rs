//! The reader's side: attaching to a peer on this host (in the background, after a good
//! network read), the read-only mappings and their leases, and reads copied out of them.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use peercache_wire::WireError;
use peercache_wire::auth::Auth;
use peercache_wire::handshake::{self, Hello, Plane};

use crate::local::codec::Invitation;
use crate::local::error::LocalError;
use crate::local::fds::{check_file, lease_open, recv_table};
use crate::metrics::Counters;
use crate::region::RegionTable;
use crate::validate;
use crate::{Batch, OpResults, RegionKey};

/// How long a peer that could not be attached (a timeout, a refused connection) stays on the
/// network before the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The same when the answer is settled: the peer is on another host, or does not offer the
/// path. Only a restart changes that, and a restarted peer is asked again after this.
const RETRY_SETTLED: Duration = Duration::from_secs(300);

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

/// How much of a view one `MADV_POPULATE_READ` maps in.
const POPULATE_STEP: u64 = 64 << 20;

/// Maps every page of `view`'s regions into this process ahead of reads
/// (`MADV_POPULATE_READ`, [`POPULATE_STEP`] at a time, counted in `done`), so copying a page out
/// of a peer's pool takes no page fault on the read path. Runs on the attach thread after the
/// view is in use; stops when the view is gone (no batch and no table holds it) or the kernel
/// lacks the advice (before Linux 5.14: the first read of each page faults it in instead).
fn populate(view: &std::sync::Weak<View>, done: &AtomicU64) {
    let Some(regions) = view.upgrade().map(|v| v.regions.len()) else {
        return;
    };
    for i in 0..regions {
        let mut off = 0u64;
        loop {
            // Held for one step only: a view dropped meanwhile is unmapped after it.
            let Some(v) = view.upgrade() else { return };
            let m = &v.regions[i];
            if off >= m.len {
                break;
            }
            let n = POPULATE_STEP.min(m.len - off);
            // SAFETY: `[ptr + off, ptr + off + n)` lies inside a read-only mapping `v` owns and
            // keeps while it is held here; the advice only faults its pages in for reading.
            let rc = unsafe {
                libc::madvise(
                    m.ptr.add(off as usize).cast_mut().cast(),
                    n as usize,
                    libc::MADV_POPULATE_READ,
                )
            };
            if rc != 0 {
                tracing::debug!(
                    error = %std::io::Error::last_os_error(),
                    "host-local view not populated ahead; its pages fault in on first read"
                );
                return;
            }
            done.fetch_add(n, Ordering::Relaxed);
            off += n;
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
    /// Bytes of peers' shared regions whose pages are mapped in ahead of reads.
    populated: AtomicU64,
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
}

impl LocalClient {
    pub(crate) fn new(
        mut hello: Hello,
        auth: Auth,
        timeout: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        hello.plane = Plane::HostLocal;
        LocalClient {
            inner: Arc::new(Attacher {
                hello,
                auth,
                timeout,
                peers: RwLock::new(HashMap::new()),
                counters,
                watching: AtomicBool::new(false),
                populated: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn forget(&self, peer: SocketAddr) {
        self.inner.peers.write().remove(&peer);
    }

    /// Bytes of peers' shared regions mapped in ahead of reads (`MADV_POPULATE_READ`).
    pub(crate) fn populated_bytes(&self) -> u64 {
        self.inner.populated.load(Ordering::Relaxed)
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
                let mut view = None;
                let entry = match inner.attach(peer) {
                    Ok(v) => {
                        inner.counters.local_attaches.add(1);
                        tracing::info!(%peer, regions = v.regions.len(), "host-local path attached: reads from this peer copy from shared memory");
                        let v = Arc::new(v);
                        view = Some(Arc::downgrade(&v));
                        Entry::Attached(v)
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
                // Reads use the view already; map its pages in behind them.
                if let Some(view) = view {
                    populate(&view, &inner.populated);
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
        counters.local_read_ops.add(ok);
        counters.local_read_bytes.add(bytes);
        Some(results)
    }
}

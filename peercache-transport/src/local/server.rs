//! The owner's side: the abstract Unix listener that hands this node's shared regions to
//! attached peers, and the leases it keeps (closed whenever the shared set changes).

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::RegionKey;
use crate::local::codec::{
    ENTRY_LEN, Invitation, MAX_SHARED_REGIONS, TABLE_HDR, TABLE_MAGIC, TOKEN_LEN, VERSION,
};
use crate::local::fds::{lease_open, send_with_fds};
use crate::region::{Region, RegionTable, SharedFile};

/// Longest wait for an attaching reader's token.
const TOKEN_WAIT: Duration = Duration::from_millis(500);

/// Invitations handed out and not yet used: past this, the oldest is dropped (its reader
/// retries), so a flood of handshakes cannot grow the set.
const MAX_OUTSTANDING: usize = 64;

/// The tokens of invitations handed out on the data port's same-host plane. Each is good for
/// one attach within its lifetime (the data plane's `op_timeout`, at least 1 s): a token a
/// reader used, one that expired and one seen by anybody after its attach open nothing.
#[derive(Debug)]
pub(crate) struct Invites {
    /// The abstract socket's name (the same for every invitation of this node's life).
    name: String,
    ttl: Duration,
    open: Mutex<std::collections::VecDeque<([u8; TOKEN_LEN], std::time::Instant)>>,
}

impl Invites {
    fn new(name: String, ttl: Duration) -> Self {
        Invites {
            name,
            ttl: ttl.max(Duration::from_secs(1)),
            open: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// A fresh single-use invitation (the name and a new random token).
    pub(crate) fn invite(&self) -> std::io::Result<Invitation> {
        let token = random_bytes::<TOKEN_LEN>()?;
        let now = std::time::Instant::now();
        let mut open = self.open.lock();
        open.retain(|(_, until)| *until > now);
        while open.len() >= MAX_OUTSTANDING {
            open.pop_front();
        }
        open.push_back((token, now + self.ttl));
        Ok(Invitation {
            name: self.name.clone(),
            token,
        })
    }

    /// Takes `token` if an unexpired invitation holds it: true once, false ever after. Every
    /// outstanding token is compared in constant time.
    pub(crate) fn redeem(&self, token: &[u8; TOKEN_LEN]) -> bool {
        let now = std::time::Instant::now();
        let mut open = self.open.lock();
        let mut hit = None;
        for (i, (t, until)) in open.iter().enumerate() {
            if same_token(t, token) && *until > now {
                hit = Some(i);
            }
        }
        hit.and_then(|i| open.remove(i)).is_some()
    }

    /// The socket's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Invitations handed out and neither used nor expired.
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        let now = std::time::Instant::now();
        self.open.lock().iter().filter(|(_, u)| *u > now).count()
    }
}

pub(crate) fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
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

pub(crate) fn same_token(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The owner's side: the abstract Unix listener that hands shared regions to attached peers.
pub(crate) struct LocalServer {
    pub(crate) invites: Arc<Invites>,
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
        let tag = u64::from_le_bytes(random_bytes::<8>()?);
        let name = format!("peercache-local-{}-{tag:016x}", std::process::id());
        let listener = UnixListener::bind_addr(&UnixAddr::from_abstract_name(&name)?)?;
        let invites = Arc::new(Invites::new(name, timeout));
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
                let invites = invites.clone();
                move || accept_loop(listener, table, stop, invites, timeout, &leases)
            })?;
        Ok(LocalServer {
            invites,
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
        if let Ok(addr) = UnixAddr::from_abstract_name(self.invites.name()) {
            let _ = UnixStream::connect_addr(&addr);
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// Attaches served at once; a connection beyond this is closed (an owner has one attach per
/// co-located peer, so only a flood reaches it).
const MAX_ATTACHING: usize = 32;

fn accept_loop(
    listener: UnixListener,
    table: Arc<RegionTable>,
    stop: Arc<AtomicBool>,
    invites: Arc<Invites>,
    timeout: Duration,
    leases: &Arc<Leases>,
) {
    let attaching = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let throttle = peercache_wire::limits::Throttle::new();
    let mut backoff = peercache_wire::limits::AcceptBackoff::new();
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let s = match conn {
            Ok(s) => {
                backoff.accepted();
                s
            }
            Err(e) => {
                let pause = backoff.failed(&e, "host-local");
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
                continue;
            }
        };
        // Each attach runs on its own short-lived thread, so a connection that sends its token
        // slowly (or never) delays nobody else's attach.
        if attaching.fetch_add(1, Ordering::AcqRel) >= MAX_ATTACHING {
            attaching.fetch_sub(1, Ordering::AcqRel);
            if let Some(held) = throttle.admit() {
                tracing::warn!(
                    limit = MAX_ATTACHING,
                    refused_since_last = held,
                    "host-local listener busy; closing an attach"
                );
            }
            continue;
        }
        let (table, leases, attaching2) = (table.clone(), leases.clone(), attaching.clone());
        let invites = invites.clone();
        let spawned = std::thread::Builder::new()
            .name("pc-local-attach".into())
            .spawn(move || {
                serve_attach(s, &table, &invites, timeout, &leases);
                attaching2.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            attaching.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One attach: an outstanding invitation's token within [`TOKEN_WAIT`] in total (used up by
/// this attach), then the region table and its descriptors, then the connection is kept as the
/// peer's lease.
fn serve_attach(
    mut s: UnixStream,
    table: &RegionTable,
    invites: &Invites,
    timeout: Duration,
    leases: &Leases,
) {
    let until = std::time::Instant::now() + timeout.min(TOKEN_WAIT);
    if s.set_write_timeout(Some(timeout)).is_err() {
        return;
    }
    let mut got = [0u8; TOKEN_LEN];
    let mut n = 0;
    // A total deadline for the token, however it is split into reads.
    while n < TOKEN_LEN {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            tracing::debug!("host-local attach sent no token in time; closed");
            return;
        }
        match s.read(&mut got[n..]) {
            Ok(0) | Err(_) => return,
            Ok(k) => n += k,
        }
    }
    if !invites.redeem(&got) {
        tracing::debug!("host-local attach without an outstanding invitation's token; closed");
        return;
    }
    // Hold the table's read guard while sending, so no shared region goes away between
    // listing it and handing out its descriptor (deregistration also revokes attachments).
    let regions = table.read();
    let seen = table.shared_changes();
    let shared = shared_regions(&regions);
    let sent = send_table(&s, &shared);
    drop(regions);
    match sent {
        Ok(()) => leases.add(s, seen, table),
        Err(e) => tracing::debug!(error = %e, "host-local attach failed while sending"),
    }
}

pub(crate) type SharedEntry = (RegionKey, u64, u64, SharedFile);

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

pub(crate) fn send_table(s: &UnixStream, shared: &[SharedEntry]) -> std::io::Result<()> {
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

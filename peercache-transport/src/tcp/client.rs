//! The TCP client side: per-peer connection pools and the batch protocol.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use peercache_wire::WireError;
use peercache_wire::handshake::{self, Hello};

use super::iov::{self, Deadline};
use super::link::{End, Link};
use super::proto::{self, Header, WireOp};
use crate::metrics::Counters;
use crate::region::RegionTable;
use crate::{Batch, OpError, OpResults, TransportConfig, TransportError};

/// One connection with its reusable buffers.
pub(crate) struct Conn {
    link: Link,
    req: Vec<u8>,
    status: Vec<u8>,
    iov: Vec<libc::iovec>,
    /// Original op index of each op sent (ops rejected locally are not sent).
    sent: Vec<u32>,
    /// Per read op whose payload is coming: where its iovecs end in `iov`, and its index.
    ends: Vec<usize>,
    landing: Vec<u32>,
    next_id: u64,
}

// SAFETY: the raw iovec pointers are only scratch space filled and consumed within one call
// on the thread that owns the connection at that time; no pointer outlives the call.
unsafe impl Send for Conn {}

#[derive(Default)]
struct PoolState {
    idle: Vec<Conn>,
    total: usize,
    suspect_until: Option<Instant>,
}

/// Connections to one peer.
pub(crate) struct PeerPool {
    addr: SocketAddr,
    errors: std::sync::atomic::AtomicU64,
    timeouts: std::sync::atomic::AtomicU64,
    state: Mutex<PoolState>,
    freed: Condvar,
}

pub(crate) struct Client {
    pub(crate) table: Arc<RegionTable>,
    pub(crate) cfg: TransportConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) hello: Hello,
    peers: RwLock<HashMap<SocketAddr, Arc<PeerPool>>>,
}

/// What a batch does; a read may report each op as its bytes land.
enum Kind<'a> {
    Read(Option<&'a mut dyn FnMut(usize)>),
    Write,
}

impl Client {
    pub(crate) fn new(
        table: Arc<RegionTable>,
        cfg: TransportConfig,
        counters: Arc<Counters>,
        hello: Hello,
    ) -> Self {
        Client {
            table,
            cfg,
            counters,
            hello,
            peers: RwLock::new(HashMap::new()),
        }
    }

    fn pool(&self, peer: SocketAddr) -> Arc<PeerPool> {
        if let Some(p) = self.peers.read().get(&peer) {
            return p.clone();
        }
        self.peers
            .write()
            .entry(peer)
            .or_insert_with(|| {
                Arc::new(PeerPool {
                    addr: peer,
                    errors: Default::default(),
                    timeouts: Default::default(),
                    state: Mutex::new(PoolState::default()),
                    freed: Condvar::new(),
                })
            })
            .clone()
    }

    /// Per-peer counters.
    pub(crate) fn peer_stats(&self) -> Vec<crate::stats::PeerStats> {
        let now = Instant::now();
        self.peers
            .read()
            .values()
            .map(|p| crate::stats::PeerStats {
                peer: p.addr,
                errors: p.errors.load(std::sync::atomic::Ordering::Relaxed),
                timeouts: p.timeouts.load(std::sync::atomic::Ordering::Relaxed),
                suspect: p.state.lock().suspect_until.is_some_and(|t| t > now),
            })
            .collect()
    }

    /// Forgets idle connections to `peer` (e.g. after it left the cluster).
    pub(crate) fn forget(&self, peer: SocketAddr) {
        self.peers.write().remove(&peer);
    }

    fn acquire(
        &self,
        pool: &PeerPool,
        d: &Deadline,
        until: Instant,
    ) -> Result<Conn, TransportError> {
        let mut st = pool.state.lock();
        loop {
            if let Some(t) = st.suspect_until {
                let now = Instant::now();
                if now < t {
                    self.counters.suspect_rejects.add(1);
                    return Err(TransportError::Suspect {
                        peer: pool.addr,
                        remaining: t - now,
                    });
                }
                st.suspect_until = None;
            }
            if let Some(c) = st.idle.pop() {
                return Ok(c);
            }
            if st.total < self.cfg.max_channels_per_peer {
                st.total += 1;
                drop(st);
                return self.connect(pool, until).inspect_err(|_| {
                    let mut st = pool.state.lock();
                    st.total -= 1;
                    pool.freed.notify_one();
                });
            }
            if pool.freed.wait_until(&mut st, until).timed_out() {
                return Err(TransportError::Timeout {
                    peer: pool.addr,
                    after: d.total(),
                });
            }
        }
    }

    fn connect(&self, pool: &PeerPool, until: Instant) -> Result<Conn, TransportError> {
        let left = until.saturating_duration_since(Instant::now());
        let err = |source| TransportError::Connect {
            peer: pool.addr,
            source,
        };
        if left.is_zero() {
            return Err(err(WireError::Timeout(self.cfg.op_timeout)));
        }
        let mut stream = TcpStream::connect_timeout(&pool.addr, left).map_err(|e| {
            err(match e.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                    WireError::Timeout(left)
                }
                _ => WireError::Io(e),
            })
        })?;
        stream
            .set_nodelay(true)
            .map_err(|e| err(WireError::Io(e)))?;
        let left = until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let accepted =
            handshake::client_sync(&mut stream, &self.hello, &self.cfg.auth, left).map_err(err)?;
        self.counters.connects.add(1);
        Ok(Conn {
            link: Link::new(stream, accepted.channel.map(|k| k.client()), End::Client),
            req: Vec::new(),
            status: Vec::new(),
            iov: Vec::new(),
            sent: Vec::new(),
            ends: Vec::new(),
            landing: Vec::new(),
            next_id: 1,
        })
    }

    fn release(&self, pool: &PeerPool, conn: Option<Conn>, timed_out: bool) {
        let mut st = pool.state.lock();
        match conn {
            Some(c) => st.idle.push(c),
            None => {
                st.total -= 1;
                self.counters.conn_discards.add(1);
            }
        }
        if timed_out {
            self.mark_suspect(pool, &mut st);
        }
        pool.freed.notify_one();
    }

    /// Fails the peer fast for `suspect_for`; its idle connections are not trusted either.
    fn mark_suspect(&self, pool: &PeerPool, st: &mut PoolState) {
        st.suspect_until = Some(Instant::now() + self.cfg.suspect_for);
        let dropped = st.idle.len();
        st.idle.clear();
        st.total -= dropped;
        self.counters.suspect_marks.add(1);
        tracing::warn!(peer = %pool.addr, suspect_for = ?self.cfg.suspect_for, "peer timed out; marked suspect");
    }

    pub(crate) fn read_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
    ) -> Result<OpResults, TransportError> {
        self.run(peer, batch, Kind::Read(None))
    }

    /// As [`Self::read_batch`], calling `landed(i)` as soon as op `i`'s bytes are all in.
    pub(crate) fn read_batch_landing(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        landed: &mut dyn FnMut(usize),
    ) -> Result<OpResults, TransportError> {
        self.run(peer, batch, Kind::Read(Some(landed)))
    }

    pub(crate) fn write_batch(
        &self,
        peer: SocketAddr,
        batch: &Batch,
    ) -> Result<OpResults, TransportError> {
        self.run(peer, batch, Kind::Write)
    }

    fn run(
        &self,
        peer: SocketAddr,
        batch: &Batch,
        mut kind: Kind<'_>,
    ) -> Result<OpResults, TransportError> {
        let n = batch.len();
        if n > self.cfg.max_batch_ops {
            return Err(TransportError::BatchTooLarge {
                ops: n,
                max: self.cfg.max_batch_ops,
            });
        }
        let mut results: OpResults = vec![Ok(()); n];
        if n == 0 {
            return Ok(results);
        }
        let mut d = Deadline::new(self.cfg.op_timeout);
        let until = Instant::now() + self.cfg.op_timeout;
        let pool = self.pool(peer);
        let mut conn = match self.acquire(&pool, &d, until) {
            Ok(c) => c,
            Err(e) => {
                if !matches!(e, TransportError::Suspect { .. }) {
                    pool.errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                if matches!(
                    e,
                    TransportError::Timeout { .. }
                        | TransportError::Connect {
                            source: WireError::Timeout(_),
                            ..
                        }
                ) {
                    pool.timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.counters.timeouts.add(1);
                    self.mark_suspect(&pool, &mut pool.state.lock());
                }
                return Err(e);
            }
        };
        // The guard keeps every local region alive (and its memory valid) for the whole batch.
        let regions = self.table.read();
        let outcome = exchange(
            &mut conn,
            batch,
            &mut kind,
            &regions,
            &self.cfg,
            &mut d,
            &mut results,
        );
        drop(regions);
        match outcome {
            Ok(()) => {
                self.release(&pool, Some(conn), false);
                self.counters
                    .count_batch(matches!(kind, Kind::Write), batch, &results);
                Ok(results)
            }
            Err(e) => {
                let timed_out = matches!(e, WireError::Timeout(_));
                pool.errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if timed_out {
                    pool.timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                self.release(&pool, None, timed_out);
                if timed_out {
                    self.counters.timeouts.add(1);
                    return Err(TransportError::Timeout {
                        peer,
                        after: self.cfg.op_timeout,
                    });
                }
                self.counters.batch_errors.add(1);
                match e {
                    WireError::Malformed { detail, .. } if detail.starts_with("batch rejected") => {
                        Err(TransportError::Rejected {
                            peer,
                            reason: "peer refused the batch (too many ops or bytes)",
                        })
                    }
                    source => Err(TransportError::Connection { peer, source }),
                }
            }
        }
    }
}

/// Rebuilds a typed error from a server status code.
fn from_code(code: u8, op: &crate::OpDesc, max: u32) -> OpError {
    let r = op.remote;
    match code {
        1 => OpError::UnknownRegion(r.region),
        2 => OpError::OutOfRegion {
            region: r.region,
            addr: r.addr,
            len: r.len as u64,
            region_len: 0,
        },
        3 => OpError::AccessDenied(r.region),
        4 => OpError::BadLength {
            len: r.len as u64,
            max: max as u64,
        },
        other => OpError::Batch(format!("peer answered unknown status {other}")),
    }
}

fn exchange(
    c: &mut Conn,
    batch: &Batch,
    kind: &mut Kind<'_>,
    regions: &HashMap<crate::RegionKey, crate::region::Region>,
    cfg: &TransportConfig,
    d: &mut Deadline,
    results: &mut OpResults,
) -> Result<(), WireError> {
    c.sent.clear();
    c.req.clear();
    c.req.resize(proto::HDR_LEN, 0);
    for (i, op) in batch.ops().iter().enumerate() {
        match crate::validate::local_segments(regions, batch, op, cfg.max_op_bytes) {
            Ok(()) => {
                c.sent.push(i as u32);
                WireOp {
                    region: op.remote.region,
                    addr: op.remote.addr,
                    len: op.remote.len,
                }
                .encode_into(&mut c.req);
            }
            Err(e) => results[i] = Err(e),
        }
    }
    if c.sent.is_empty() {
        return Ok(());
    }
    let req_id = c.next_id;
    c.next_id += 1;
    let mut hb = [0u8; proto::HDR_LEN];
    Header {
        magic: proto::REQ_MAGIC,
        code: match kind {
            Kind::Read(_) => proto::OP_READ,
            Kind::Write => proto::OP_WRITE,
        },
        count: c.sent.len() as u32,
        req_id,
    }
    .encode(&mut hb);
    c.req[..proto::HDR_LEN].copy_from_slice(&hb);

    // Send the request (and, for writes, every payload gathered from its segments).
    c.iov.clear();
    c.iov.push(iov::iovec(c.req.as_ptr() as u64, c.req.len()));
    if let Kind::Write = kind {
        for &i in &c.sent {
            for s in batch.op_segments(&batch.ops()[i as usize]) {
                c.iov.push(iov::iovec(s.addr, s.len as usize));
            }
        }
    }
    c.link.writev_all(&mut c.iov, d)?;

    // Reply header and per-op statuses.
    let n = c.sent.len();
    c.status.clear();
    c.status.resize(proto::HDR_LEN + n, 0);
    c.iov.clear();
    c.iov
        .push(iov::iovec(c.status.as_mut_ptr() as u64, proto::HDR_LEN));
    c.link.readv_exact(&mut c.iov, d)?;
    let h = Header::decode(c.status[..proto::HDR_LEN].try_into().expect("header"));
    if h.magic != proto::REP_MAGIC || h.req_id != req_id {
        return Err(WireError::BadMagic { found: h.magic });
    }
    if h.code != proto::BATCH_OK {
        return Err(WireError::Malformed {
            what: "data reply",
            detail: format!("batch rejected with code {}", h.code),
        });
    }
    if h.count as usize != n {
        return Err(WireError::Malformed {
            what: "data reply",
            detail: format!("{} statuses for {} ops", h.count, n),
        });
    }
    c.iov.clear();
    c.iov.push(iov::iovec(
        c.status[proto::HDR_LEN..].as_mut_ptr() as u64,
        n,
    ));
    c.link.readv_exact(&mut c.iov, d)?;

    // Payloads of successful reads land straight in their destination segments.
    c.iov.clear();
    c.ends.clear();
    c.landing.clear();
    for (j, &i) in c.sent.iter().enumerate() {
        let op = &batch.ops()[i as usize];
        let code = c.status[proto::HDR_LEN + j];
        if code != 0 {
            results[i as usize] = Err(from_code(code, op, cfg.max_op_bytes));
        } else if let Kind::Read(landed) = kind {
            for s in batch.op_segments(op) {
                c.iov.push(iov::iovec(s.addr, s.len as usize));
            }
            // Where each op ends is kept only when someone is told as each one lands.
            if landed.is_some() {
                c.ends.push(c.iov.len());
                c.landing.push(i);
            }
        }
    }
    if !c.iov.is_empty() {
        match kind {
            Kind::Read(Some(landed)) => {
                let ops = &c.landing;
                c.link
                    .readv_exact_landing(&mut c.iov, &c.ends, d, &mut |g| landed(ops[g] as usize))?
            }
            _ => c.link.readv_exact(&mut c.iov, d)?,
        }
    }
    Ok(())
}

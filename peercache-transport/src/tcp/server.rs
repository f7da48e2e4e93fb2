//! The TCP data server: serves registered regions to peers, one thread per connection.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use peercache_wire::handshake::{self, Acceptor, Plane};
use peercache_wire::{Incarnation, NodeId, WireError};

use super::iov::{self, Deadline};
use super::link::{End, Link};
use super::proto::{self, Header, WireOp};
use crate::TransportConfig;
use crate::metrics::Counters;
use crate::region::RegionTable;
use crate::validate;

/// Largest total payload of one inbound write batch.
const MAX_WRITE_BATCH_BYTES: u64 = 1 << 30;

pub(crate) struct ServerShared {
    pub(crate) table: Arc<RegionTable>,
    pub(crate) cfg: TransportConfig,
    pub(crate) counters: Arc<Counters>,
    pub(crate) incarnation: Incarnation,
    pub(crate) stop: AtomicBool,
    pub(crate) live: AtomicUsize,
    pub(crate) conns: Mutex<HashMap<u64, TcpStream>>,
    pub(crate) next_conn: AtomicU64,
    /// The RDMA path whose bootstrap plane this port also serves.
    pub(crate) rdma: Option<Arc<dyn crate::rdma::path::RdmaPlane>>,
    /// What the host-local plane answers (None: the path is off).
    pub(crate) local: Option<Arc<crate::local::Invites>>,
}

/// Binds the listener and starts the accept thread. Returns the bound address.
pub(crate) fn start(
    shared: Arc<ServerShared>,
) -> Result<(SocketAddr, std::thread::JoinHandle<()>), std::io::Error> {
    let listener = TcpListener::bind(shared.cfg.bind)?;
    let addr = listener.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("pc-data-accept".into())
        .spawn(move || accept_loop(listener, shared))?;
    Ok((addr, handle))
}

fn accept_loop(listener: TcpListener, shared: Arc<ServerShared>) {
    let mut backoff = peercache_wire::limits::AcceptBackoff::new();
    let at_limit = peercache_wire::limits::Throttle::new();
    let at_share = peercache_wire::limits::Throttle::new();
    let per_source = shared.cfg.max_server_connections_per_source;
    let share = (per_source > 0).then(|| peercache_wire::shares::SourceShare::new(per_source));
    let refused = |reason: &'static str| {
        metrics::counter!(
            peercache_wire::metrics::CONNECTIONS_REFUSED_TOTAL,
            "server" => "pc-data", "reason" => reason
        )
    };
    let (refused_limit, refused_source) = (refused("limit"), refused("source"));
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(s) => {
                backoff.accepted();
                s
            }
            Err(e) => {
                // Out of descriptors the pending connection stays queued: accepting again at
                // once would spin. Pause (bounded; shutdown waits at most one pause).
                let pause = backoff.failed(&e, "data");
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
                continue;
            }
        };
        if shared.live.load(Ordering::Acquire) >= shared.cfg.max_server_connections {
            refused_limit.increment(1);
            if let Some(held) = at_limit.admit() {
                tracing::warn!(
                    limit = shared.cfg.max_server_connections,
                    refused_since_last = held,
                    "data server at its connection limit; refusing connections"
                );
            }
            continue;
        }
        let slot = match (&share, stream.peer_addr()) {
            (Some(share), Ok(peer)) => match share.admit(peer.ip()) {
                Some(slot) => Some(slot),
                None => {
                    refused_source.increment(1);
                    if let Some(held) = at_share.admit() {
                        tracing::warn!(
                            source = %peer.ip(),
                            share = per_source,
                            refused_since_last = held,
                            "a source address holds its share of the data connections; \
                             refusing its connections"
                        );
                    }
                    continue;
                }
            },
            _ => None,
        };
        let _ = stream.set_nodelay(true);
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = stream.try_clone() {
            shared.conns.lock().insert(id, clone);
        }
        shared.live.fetch_add(1, Ordering::AcqRel);
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("pc-data-conn".into())
            .spawn(move || {
                let _slot = slot;
                let peer = stream.peer_addr().ok();
                if let Err(e) = serve_conn(stream, &sh)
                    && !matches!(e, WireError::Closed)
                    && !sh.stop.load(Ordering::Acquire)
                {
                    sh.counters.server_desyncs.add(1);
                    tracing::debug!(?peer, error = %e, "data connection closed");
                }
                sh.conns.lock().remove(&id);
                sh.live.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            shared.conns.lock().remove(&id);
            shared.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Per-connection buffers, reused across requests.
struct ConnBufs {
    /// The node id the peer proved in the handshake (write guards check it).
    peer: Option<NodeId>,
    ops: Vec<u8>,
    reply: Vec<u8>,
    iov: Vec<libc::iovec>,
    sink: Vec<u8>,
}

fn serve_conn(mut stream: TcpStream, sh: &ServerShared) -> Result<(), WireError> {
    let mut planes = vec![Plane::Data];
    if sh.rdma.is_some() {
        planes.push(Plane::RdmaBootstrap);
    }
    if sh.local.is_some() {
        planes.push(Plane::HostLocal);
    }
    let acceptor = Acceptor {
        planes,
        node: None,
        incarnation: sh.incarnation,
        auth: sh.cfg.auth.clone(),
    };
    let established = handshake::server_sync(&mut stream, &acceptor, sh.cfg.op_timeout)?;
    let hello = &established.hello;
    if hello.plane == Plane::RdmaBootstrap {
        if let Some(r) = &sh.rdma {
            r.serve(stream);
        }
        return Ok(());
    }
    if hello.plane == Plane::HostLocal {
        if let Some(invites) = &sh.local {
            // A fresh token for this authenticated handshake, good for one attach.
            let inv = invites.invite()?;
            stream.set_write_timeout(Some(sh.cfg.op_timeout))?;
            peercache_wire::frame::write_frame(&mut stream, &inv.encode())?;
        }
        return Ok(());
    }
    let mut bufs = ConnBufs {
        peer: hello.node.clone(),
        ops: Vec::new(),
        reply: Vec::new(),
        iov: Vec::new(),
        sink: Vec::new(),
    };
    let mut link = Link::new(stream, established.channel.map(|k| k.server()), End::Server);
    let stream = &mut link;
    loop {
        // Idle wait for the next request has no deadline; everything after the header does.
        let mut hdr = [0u8; proto::HDR_LEN];
        stream.read_idle(&mut hdr, sh.cfg.op_timeout)?;
        if sh.stop.load(Ordering::Acquire) {
            return Err(WireError::Closed);
        }
        let h = Header::decode(&hdr);
        if h.magic != proto::REQ_MAGIC {
            return Err(WireError::BadMagic { found: h.magic });
        }
        let mut d = Deadline::new(sh.cfg.op_timeout);
        let reject = if h.code != proto::OP_READ && h.code != proto::OP_WRITE {
            Some(proto::BATCH_BAD_KIND)
        } else if h.count as usize > sh.cfg.max_batch_ops {
            Some(proto::BATCH_TOO_MANY_OPS)
        } else {
            None
        };
        if let Some(code) = reject {
            send_batch_reject(stream, &h, code, &mut d, &mut bufs)?;
            return Err(WireError::Malformed {
                what: "data request",
                detail: format!("batch rejected with code {code}"),
            });
        }
        let n = h.count as usize;
        bufs.ops.clear();
        bufs.ops.resize(n * proto::OP_LEN, 0);
        bufs.iov.clear();
        bufs.iov
            .push(iov::iovec(bufs.ops.as_mut_ptr() as u64, bufs.ops.len()));
        stream.readv_exact(&mut bufs.iov, &mut d)?;
        if h.code == proto::OP_READ {
            serve_read(stream, sh, &h, &mut d, &mut bufs)?;
        } else {
            serve_write(stream, sh, &h, &mut d, &mut bufs)?;
        }
    }
}

fn reply_header(bufs: &mut ConnBufs, h: &Header, status: u8, count: u32) {
    let mut hb = [0u8; proto::HDR_LEN];
    Header {
        magic: proto::REP_MAGIC,
        code: status,
        count,
        req_id: h.req_id,
    }
    .encode(&mut hb);
    bufs.reply.clear();
    bufs.reply.extend_from_slice(&hb);
}

fn send_batch_reject(
    stream: &mut Link,
    h: &Header,
    code: u8,
    d: &mut Deadline,
    bufs: &mut ConnBufs,
) -> Result<(), WireError> {
    reply_header(bufs, h, code, 0);
    bufs.iov.clear();
    bufs.iov
        .push(iov::iovec(bufs.reply.as_ptr() as u64, bufs.reply.len()));
    stream.writev_all(&mut bufs.iov, d)
}

fn count_served(sh: &ServerShared, ok: u64, bytes: u64, errs: u64, write: bool) {
    sh.counters.count_served(ok, bytes, errs, write);
}

fn serve_read(
    stream: &mut Link,
    sh: &ServerShared,
    h: &Header,
    d: &mut Deadline,
    bufs: &mut ConnBufs,
) -> Result<(), WireError> {
    let n = h.count as usize;
    reply_header(bufs, h, proto::BATCH_OK, h.count);
    bufs.reply.resize(proto::HDR_LEN + n, 0);
    bufs.iov.clear();
    // Placeholder for the reply header + statuses; filled once the statuses are known.
    bufs.iov.push(iov::iovec(0, 0));
    // The guard keeps every region alive until the payload is on the wire.
    let regions = sh.table.read();
    let (mut ok, mut bytes, mut errs) = (0u64, 0u64, 0u64);
    for i in 0..n {
        let op = WireOp::decode(&bufs.ops[i * proto::OP_LEN..(i + 1) * proto::OP_LEN]);
        match validate::remote_op(
            &regions,
            op.region,
            op.addr,
            op.len,
            validate::Way::Read,
            sh.cfg.max_op_bytes,
        ) {
            Ok(()) => {
                bufs.reply[proto::HDR_LEN + i] = 0;
                bufs.iov.push(iov::iovec(op.addr, op.len as usize));
                ok += 1;
                bytes += op.len as u64;
            }
            Err(e) => {
                bufs.reply[proto::HDR_LEN + i] = e.code();
                errs += 1;
            }
        }
    }
    bufs.iov[0] = iov::iovec(bufs.reply.as_ptr() as u64, bufs.reply.len());
    // Counted before the reply leaves, so a client that saw the reply sees the counters.
    count_served(sh, ok, bytes, errs, false);
    stream.writev_all(&mut bufs.iov, d)?;
    drop(regions);
    Ok(())
}

fn serve_write(
    stream: &mut Link,
    sh: &ServerShared,
    h: &Header,
    d: &mut Deadline,
    bufs: &mut ConnBufs,
) -> Result<(), WireError> {
    let n = h.count as usize;
    let mut total = 0u64;
    for i in 0..n {
        let op = WireOp::decode(&bufs.ops[i * proto::OP_LEN..(i + 1) * proto::OP_LEN]);
        total += op.len as u64;
    }
    if total > MAX_WRITE_BATCH_BYTES {
        send_batch_reject(stream, h, proto::BATCH_TOO_MANY_BYTES, d, bufs)?;
        return Err(WireError::FrameTooLarge {
            len: total as usize,
            max: MAX_WRITE_BATCH_BYTES as usize,
        });
    }
    if bufs.sink.is_empty() {
        bufs.sink.resize(64 << 10, 0);
    }
    reply_header(bufs, h, proto::BATCH_OK, h.count);
    bufs.reply.resize(proto::HDR_LEN + n, 0);
    bufs.iov.clear();
    let regions = sh.table.read();
    let (mut ok, mut bytes, mut errs) = (0u64, 0u64, 0u64);
    for i in 0..n {
        let op = WireOp::decode(&bufs.ops[i * proto::OP_LEN..(i + 1) * proto::OP_LEN]);
        match validate::remote_op(
            &regions,
            op.region,
            op.addr,
            op.len,
            validate::Way::Write {
                peer: bufs.peer.as_ref(),
                done_by: d.at(),
            },
            sh.cfg.max_op_bytes,
        ) {
            Ok(()) => {
                bufs.reply[proto::HDR_LEN + i] = 0;
                bufs.iov.push(iov::iovec(op.addr, op.len as usize));
                ok += 1;
                bytes += op.len as u64;
            }
            Err(e) => {
                // The payload is on the wire anyway: drain it into the sink.
                bufs.reply[proto::HDR_LEN + i] = e.code();
                errs += 1;
                let mut left = op.len as usize;
                while left > 0 {
                    let take = left.min(bufs.sink.len());
                    bufs.iov
                        .push(iov::iovec(bufs.sink.as_mut_ptr() as u64, take));
                    left -= take;
                }
            }
        }
    }
    stream.readv_exact(&mut bufs.iov, d)?;
    drop(regions);
    bufs.iov.clear();
    bufs.iov
        .push(iov::iovec(bufs.reply.as_ptr() as u64, bufs.reply.len()));
    // Counted before the reply leaves, as reads are: a client that got the reply sees them.
    count_served(sh, ok, bytes, errs, true);
    stream.writev_all(&mut bufs.iov, d)?;
    Ok(())
}

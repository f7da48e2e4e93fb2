//! RC queue-pair bootstrap over TCP: before two hosts can use a reliable-connected queue pair,
//! each must learn the other's queue-pair number, packet sequence number, address (LID and
//! GID) and MTU. This module exchanges them on a TCP connection that first runs the
//! `peercache-wire` handshake on the [`Plane::RdmaBootstrap`] plane — so only a node that
//! proves the cluster secret gets a queue pair into this host's memory.
//!
//! * The client sends one [`QpInfo`] for a rail; the server's [`Responder`] creates a queue
//!   pair connected to it and answers with its own [`QpInfo`] (or a reason it cannot).
//! * The path MTU is negotiated: both sides use the smaller of the two active MTUs.
//! * The responder's queue pair lives exactly as long as the TCP connection: the client keeps
//!   the socket with its queue pair and closes it when the queue pair is dropped; the server
//!   then releases its side. A client host that vanishes without closing is noticed by TCP
//!   keepalive (probes after 30 s idle, every 10 s, 3 tries).
//!
//! The verbs calls themselves sit behind [`Responder`] (the server side) and the caller of
//! [`connect`] (the client side), so the exchange is tested with a software responder.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use peercache_wire::auth::Auth;
use peercache_wire::envelope;
use peercache_wire::envelope::{Envelope, Extension};
use peercache_wire::handshake::{self, Acceptor, Hello, Plane};
pub use peercache_wire::qp::{
    BootstrapRequest, ChunkedRegion, ChunkedRegions, QpInfo, QpReply, RegionRkeys, RegionTable,
};
use peercache_wire::qp::{TAG_CHUNKED_REGIONS, TAG_READS_CHUNKS};
use peercache_wire::{Incarnation, NodeId, WireError};

/// Largest bootstrap request, and largest reply a client of an earlier release reads (a region
/// table of a few hundred whole regions fits).
const MAX_FRAME: usize = 64 << 10;
/// Largest reply this client reads: a table with chunked regions (a 1 TiB pool in 1 GiB chunks
/// on four rails is about 20 KiB; this leaves room for many such regions).
const MAX_REPLY: usize = 4 << 20;

/// Every region a node lets peers target over RDMA: those registered whole, and those
/// registered in chunks (sent only to clients that read them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionTables {
    /// Regions registered in one piece.
    pub whole: Vec<RegionRkeys>,
    /// Regions registered in chunks, with the keys of the chunks registered so far.
    pub chunked: Vec<ChunkedRegion>,
}

/// Errors of the bootstrap.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The handshake or a frame failed (includes authentication and deadlines).
    #[error("rdma bootstrap: {0}")]
    Wire(#[from] WireError),
    /// The server refused to connect a queue pair.
    #[error("rdma bootstrap refused by the peer: {0}")]
    Refused(String),
    /// The peer's queue-pair information makes no sense.
    #[error("rdma bootstrap: bad queue-pair information: {0}")]
    Invalid(String),
}

/// The path MTU both sides use: the smaller of the two (verbs enum values 1..=5).
pub fn negotiate_mtu(a: u8, b: u8) -> u8 {
    a.min(b).clamp(1, 5)
}

/// Checks a peer's [`QpInfo`].
pub fn validate(info: &QpInfo, rails: usize) -> Result<(), BootstrapError> {
    if usize::from(info.rail) >= rails {
        return Err(BootstrapError::Invalid(format!(
            "rail {} of {rails}",
            info.rail
        )));
    }
    if !(1..=5).contains(&info.mtu) {
        return Err(BootstrapError::Invalid(format!("mtu code {}", info.mtu)));
    }
    if info.psn > 0x00ff_ffff {
        return Err(BootstrapError::Invalid(format!("psn {:#x}", info.psn)));
    }
    if info.qpn == 0 || info.qpn > 0x00ff_ffff {
        return Err(BootstrapError::Invalid(format!("qpn {:#x}", info.qpn)));
    }
    Ok(())
}

/// The server side's queue-pair factory.
pub trait Responder: Send + Sync {
    /// The server's half of a connected queue pair, kept while the connection lives.
    type Held: Send + 'static;
    /// Rails this host has.
    fn rails(&self) -> usize;
    /// Creates a queue pair on `remote.rail` connected to `remote` (path MTU: the smaller of
    /// its own and `remote.mtu`, [`negotiate_mtu`]) and returns its information.
    fn accept(&self, remote: &QpInfo) -> Result<(QpInfo, Self::Held), super::RdmaError>;
}

/// A client's connected bootstrap: the peer's queue pair, and the socket that keeps the
/// peer's side alive (drop it after the local queue pair).
#[derive(Debug)]
pub struct Bootstrapped {
    /// The peer's queue pair.
    pub remote: QpInfo,
    /// The path MTU both sides use.
    pub mtu: u8,
    /// Keeps the peer's queue pair alive; closing it releases that queue pair.
    pub keepalive: TcpStream,
}

/// Client: connects to `peer`'s bootstrap plane, sends `local` and returns the peer's queue
/// pair, all within `timeout`.
pub fn connect(
    peer: SocketAddr,
    node: Option<NodeId>,
    auth: &Auth,
    local: &QpInfo,
    timeout: Duration,
) -> Result<Bootstrapped, BootstrapError> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&peer, timeout).map_err(WireError::Io)?;
    let buf = exchange(
        &mut s,
        node,
        auth,
        &BootstrapRequest::Qp(*local),
        &[],
        deadline,
    )?;
    match envelope::decode::<QpReply>(&buf)? {
        QpReply::Accept(remote) => {
            validate(&remote, usize::from(local.rail) + 1)?;
            if remote.rail != local.rail {
                return Err(BootstrapError::Invalid(format!(
                    "asked for rail {}, got rail {}",
                    local.rail, remote.rail
                )));
            }
            Ok(Bootstrapped {
                remote,
                mtu: negotiate_mtu(local.mtu, remote.mtu),
                keepalive: s,
            })
        }
        QpReply::Reject(why) => Err(BootstrapError::Refused(why)),
    }
}

/// Client: the regions `peer` lets members target over RDMA, with their per-rail rkeys —
/// chunked regions included (a peer of an earlier release has none to send).
pub fn fetch_regions(
    peer: SocketAddr,
    node: Option<NodeId>,
    auth: &Auth,
    timeout: Duration,
) -> Result<RegionTables, BootstrapError> {
    let deadline = Instant::now() + timeout;
    let mut s = TcpStream::connect_timeout(&peer, timeout).map_err(WireError::Io)?;
    let asks = [Extension {
        tag: TAG_READS_CHUNKS,
        data: Vec::new(),
    }];
    let buf = exchange(
        &mut s,
        node,
        auth,
        &BootstrapRequest::Regions,
        &asks,
        deadline,
    )?;
    let env = Envelope::parse(&buf)?;
    let whole = env.decode::<RegionTable>()?.regions;
    let chunked = env
        .extension_value::<ChunkedRegions>(TAG_CHUNKED_REGIONS)?
        .unwrap_or_default()
        .regions;
    Ok(RegionTables { whole, chunked })
}

/// Handshake on the bootstrap plane, one request, one reply frame (returned), all by
/// `deadline`; the socket is left without timeouts.
fn exchange(
    s: &mut TcpStream,
    node: Option<NodeId>,
    auth: &Auth,
    req: &BootstrapRequest,
    extensions: &[Extension],
    deadline: Instant,
) -> Result<Vec<u8>, BootstrapError> {
    s.set_nodelay(true).map_err(WireError::Io)?;
    let hello = Hello {
        min_version: envelope::MIN_WIRE_VERSION,
        max_version: envelope::WIRE_VERSION,
        plane: Plane::RdmaBootstrap,
        node,
        incarnation: Incarnation(0),
        features: 0,
    };
    handshake::client_sync(s, &hello, auth, left(deadline)?)?;
    s.set_write_timeout(Some(left(deadline)?))
        .map_err(WireError::Io)?;
    peercache_wire::frame::write_frame(s, &envelope::encode(req, extensions)?)?;
    s.set_read_timeout(Some(left(deadline)?))
        .map_err(WireError::Io)?;
    let mut buf = Vec::with_capacity(256);
    peercache_wire::frame::read_frame(s, MAX_REPLY, &mut buf)?;
    s.set_read_timeout(None).map_err(WireError::Io)?;
    s.set_write_timeout(None).map_err(WireError::Io)?;
    Ok(buf)
}

fn left(deadline: Instant) -> Result<Duration, WireError> {
    let now = Instant::now();
    if now >= deadline {
        return Err(WireError::Timeout(Duration::ZERO));
    }
    Ok(deadline - now)
}

/// Server: runs one bootstrap connection to its end — the handshake (refusing strangers),
/// then [`serve_request`]. Returns when the connection is over.
pub fn serve<R: Responder>(
    mut s: TcpStream,
    acceptor: &Acceptor,
    responder: &R,
    regions: &dyn Fn() -> RegionTables,
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let hello = handshake::server_sync(&mut s, acceptor, timeout)?.hello;
    if hello.plane != Plane::RdmaBootstrap {
        return Err(BootstrapError::Invalid(format!(
            "plane {:?} on the bootstrap path",
            hello.plane
        )));
    }
    serve_request(s, responder, regions, timeout)
}

/// Server, after an accepted handshake on the bootstrap plane: one request — a queue pair
/// from `responder` (then held until the client closes the socket) or the region table. Holds
/// the calling thread for the queue pair's life; a server of many queue pairs uses
/// [`accept_request`] and a [`super::holder::Holder`] instead.
pub fn serve_request<R: Responder + ?Sized>(
    s: TcpStream,
    responder: &R,
    regions: &dyn Fn() -> RegionTables,
    timeout: Duration,
) -> Result<(), BootstrapError> {
    let Some((mut s, held)) = accept_request(s, responder, regions, timeout)? else {
        return Ok(());
    };
    s.set_read_timeout(None).map_err(WireError::Io)?;
    let mut one = [0u8; 1];
    let _ = s.read(&mut one);
    drop(held);
    Ok(())
}

/// Server, after an accepted handshake on the bootstrap plane: answers one request within
/// `timeout`. For a queue pair, returns the socket and the server's half, to be kept exactly
/// as long as the client keeps the socket open (EOF, a reset, or any byte from the client —
/// it never sends more — ends it; keepalive notices a client host that vanished). `None`
/// when the request needed no holding (the region table, or a refusal sent with its reason).
/// The table lists chunked regions only to a client that asked for them
/// ([`TAG_READS_CHUNKS`]): one of an earlier release would take a chunk for the whole region.
pub fn accept_request<R: Responder + ?Sized>(
    mut s: TcpStream,
    responder: &R,
    regions: &dyn Fn() -> RegionTables,
    timeout: Duration,
) -> Result<Option<(TcpStream, R::Held)>, BootstrapError> {
    s.set_read_timeout(Some(timeout)).map_err(WireError::Io)?;
    s.set_write_timeout(Some(timeout)).map_err(WireError::Io)?;
    let mut buf = Vec::with_capacity(128);
    peercache_wire::frame::read_frame(&mut s, MAX_FRAME, &mut buf)?;
    let env = Envelope::parse(&buf)?;
    let remote = match env.decode::<BootstrapRequest>()? {
        BootstrapRequest::Regions => {
            let tables = regions();
            let mut ext = Vec::new();
            if env.extension(TAG_READS_CHUNKS)?.is_some() {
                let chunked = ChunkedRegions {
                    regions: tables.chunked,
                };
                ext.push(Extension::of(TAG_CHUNKED_REGIONS, &chunked)?);
            }
            let table = RegionTable {
                regions: tables.whole,
            };
            peercache_wire::frame::write_frame(&mut s, &envelope::encode(&table, &ext)?)?;
            return Ok(None);
        }
        BootstrapRequest::Qp(remote) => remote,
    };
    let reply = match validate(&remote, responder.rails()) {
        Err(e) => Err(e.to_string()),
        Ok(()) => responder.accept(&remote).map_err(|e| e.to_string()),
    };
    let (msg, held) = match reply {
        Ok((mine, held)) => (QpReply::Accept(mine), Some(held)),
        Err(why) => (QpReply::Reject(why), None),
    };
    peercache_wire::frame::write_frame(&mut s, &envelope::encode(&msg, &[])?)?;
    let Some(held) = held else {
        return Ok(None);
    };
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10))
        .with_retries(3);
    socket2::SockRef::from(&s)
        .set_tcp_keepalive(&ka)
        .map_err(WireError::Io)?;
    Ok(Some((s, held)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(rail: u8, mtu: u8) -> QpInfo {
        QpInfo {
            rail,
            qpn: 0x11,
            psn: 0x123456,
            lid: 0,
            gid: [7; 16],
            mtu,
            rd_atomic: 16,
        }
    }

    #[test]
    fn mtu_is_the_smaller_and_codes_are_checked() {
        assert_eq!(negotiate_mtu(5, 3), 3);
        assert_eq!(negotiate_mtu(2, 5), 2);
        assert!(validate(&info(0, 5), 1).is_ok());
        assert!(validate(&info(1, 5), 1).is_err(), "rail out of range");
        assert!(validate(&info(0, 0), 1).is_err(), "mtu code 0");
        assert!(validate(&info(0, 6), 1).is_err(), "mtu code 6");
        let mut bad = info(0, 5);
        bad.psn = 1 << 24;
        assert!(validate(&bad, 1).is_err(), "psn wider than 24 bits");
        bad = info(0, 5);
        bad.qpn = 0;
        assert!(validate(&bad, 1).is_err(), "qpn 0");
    }

    #[test]
    fn messages_round_trip_through_the_envelope() {
        let i = info(1, 4);
        let f = envelope::encode(&i, &[]).unwrap();
        assert_eq!(envelope::decode::<QpInfo>(&f).unwrap(), i);
        let q = BootstrapRequest::Qp(i);
        let f = envelope::encode(&q, &[]).unwrap();
        assert_eq!(envelope::decode::<BootstrapRequest>(&f).unwrap(), q);
        let r = QpReply::Reject("no rail 3".into());
        let f = envelope::encode(&r, &[]).unwrap();
        assert_eq!(envelope::decode::<QpReply>(&f).unwrap(), r);
        // A reply is not a QpInfo.
        assert!(envelope::decode::<QpInfo>(&f).is_err());
    }
}

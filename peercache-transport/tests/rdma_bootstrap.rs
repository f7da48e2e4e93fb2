//! The RC queue-pair bootstrap over loopback with a software responder: the exchange runs
//! inside the authenticated handshake, negotiates the MTU, refuses bad requests with a reason,
//! keeps the server's queue pair exactly as long as the client's socket, and every wait has a
//! deadline.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use peercache_transport::rdma::RdmaError;
use peercache_transport::rdma::bootstrap::{
    self, BootstrapError, BootstrapRequest, ChunkedRegion, QpInfo, RegionTable, Responder,
};
use peercache_wire::auth::Auth;
use peercache_wire::envelope;
use peercache_wire::handshake::{self, Acceptor, Hello, Plane};
use peercache_wire::{Incarnation, NodeId, WireError};

mod common;
use common::wait_for;

const SECRET: &[u8] = b"a-cluster-secret-of-enough-bytes";

/// A responder whose "queue pairs" are counted tokens.
struct SoftResponder {
    rails: usize,
    mtu: u8,
    next_qpn: AtomicU32,
    live: Arc<AtomicUsize>,
    accepted: AtomicUsize,
}

struct Held(Arc<AtomicUsize>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Responder for SoftResponder {
    type Held = Held;
    fn rails(&self) -> usize {
        self.rails
    }
    fn accept(&self, remote: &QpInfo) -> Result<(QpInfo, Held), RdmaError> {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        self.live.fetch_add(1, Ordering::SeqCst);
        let mine = QpInfo {
            rail: remote.rail,
            qpn: self.next_qpn.fetch_add(1, Ordering::SeqCst),
            psn: 0x00ab_cdef,
            lid: 0,
            gid: [9; 16],
            mtu: bootstrap::negotiate_mtu(self.mtu, remote.mtu),
            rd_atomic: 16,
        };
        Ok((mine, Held(self.live.clone())))
    }
}

fn server(secret: Option<&[u8]>) -> (SocketAddr, Arc<SoftResponder>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let responder = Arc::new(SoftResponder {
        rails: 2,
        mtu: 3,
        next_qpn: AtomicU32::new(0x100),
        live: Arc::new(AtomicUsize::new(0)),
        accepted: AtomicUsize::new(0),
    });
    let acceptor = Acceptor {
        planes: vec![Plane::RdmaBootstrap],
        node: Some(NodeId::new("server").unwrap()),
        incarnation: Incarnation(1),
        auth: secret.map_or_else(Auth::none, |s| Auth::from_secret(s).unwrap()),
    };
    let r = responder.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { break };
            let (a, r) = (acceptor.clone(), r.clone());
            std::thread::spawn(move || {
                let table = || bootstrap::RegionTables {
                    whole: vec![bootstrap::RegionRkeys {
                        key: 7,
                        base: 0x1000,
                        len: 4096,
                        rkeys: vec![11, 12],
                        writable: false,
                    }],
                    chunked: vec![chunked()],
                };
                let _ = bootstrap::serve(s, &a, &*r, &table, Duration::from_secs(2));
            });
        }
    });
    (addr, responder)
}

/// A region of three 8 KiB chunks, two of them registered so far.
fn chunked() -> ChunkedRegion {
    ChunkedRegion {
        key: 8,
        base: 0x10_0000,
        len: 3 * 8192,
        chunk: 8192,
        chunks: 3,
        rkeys: vec![vec![21, 22], vec![23, 24]],
        writable: false,
    }
}

fn client_info(rail: u8) -> QpInfo {
    QpInfo {
        rail,
        qpn: 0x42,
        psn: 0x0012_3456,
        lid: 0,
        gid: [1; 16],
        mtu: 5,
        rd_atomic: 16,
    }
}

#[test]
fn a_member_gets_a_queue_pair_with_the_smaller_mtu_held_while_its_socket_lives() {
    let (addr, r) = server(Some(SECRET));
    let auth = Auth::from_secret(SECRET).unwrap();
    let me = Some(NodeId::new("client").unwrap());
    let b = bootstrap::connect(
        addr,
        me.clone(),
        &auth,
        &client_info(1),
        Duration::from_secs(2),
    )
    .unwrap();
    assert_eq!(b.remote.rail, 1);
    assert_eq!(b.remote.qpn, 0x100);
    assert_eq!(b.mtu, 3, "min(4096, 1024) = 1024 (code 3)");
    assert_eq!(b.remote.mtu, 3);
    assert_eq!(r.live.load(Ordering::SeqCst), 1);
    // A second queue pair (another channel) is independent.
    let b2 = bootstrap::connect(addr, me, &auth, &client_info(0), Duration::from_secs(2)).unwrap();
    assert_eq!(b2.remote.qpn, 0x101);
    assert_eq!(r.live.load(Ordering::SeqCst), 2);
    // Closing the socket releases exactly that queue pair on the server.
    drop(b);
    wait_for(
        Duration::from_secs(5),
        "the first queue pair's release",
        || r.live.load(Ordering::SeqCst) == 1,
    );
    drop(b2);
    wait_for(
        Duration::from_secs(5),
        "the second queue pair's release",
        || r.live.load(Ordering::SeqCst) == 0,
    );
}

#[test]
fn members_can_list_the_regions_with_their_rkeys_and_strangers_cannot() {
    let (addr, _r) = server(Some(SECRET));
    let auth = Auth::from_secret(SECRET).unwrap();
    let t = bootstrap::fetch_regions(addr, None, &auth, Duration::from_secs(2)).unwrap();
    assert_eq!(t.whole.len(), 1);
    assert_eq!(
        (t.whole[0].key, t.whole[0].rkeys.clone()),
        (7, vec![11, 12])
    );
    assert_eq!(
        t.chunked,
        vec![chunked()],
        "a client that reads chunks gets them"
    );
    let e = bootstrap::fetch_regions(addr, None, &Auth::none(), Duration::from_secs(2));
    assert!(e.is_err());
}

/// A client of an earlier release asks for the table without saying it reads chunks: it gets
/// the whole regions and no chunked one, which it would take for a region one chunk long.
#[test]
fn a_client_that_does_not_read_chunks_gets_no_chunked_region() {
    let (addr, _r) = server(Some(SECRET));
    let auth = Auth::from_secret(SECRET).unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let hello = Hello {
        min_version: envelope::MIN_WIRE_VERSION,
        max_version: envelope::WIRE_VERSION,
        plane: Plane::RdmaBootstrap,
        node: None,
        incarnation: Incarnation(0),
        features: 0,
    };
    handshake::client_sync(&mut s, &hello, &auth, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let req = envelope::encode(&BootstrapRequest::Regions, &[]).unwrap();
    peercache_wire::frame::write_frame(&mut s, &req).unwrap();
    let mut buf = Vec::new();
    peercache_wire::frame::read_frame(&mut s, 64 << 10, &mut buf).unwrap();
    let env = envelope::Envelope::parse(&buf).unwrap();
    let table = env.decode::<RegionTable>().unwrap();
    assert_eq!(table.regions.len(), 1);
    assert_eq!(table.regions[0].key, 7);
    assert_eq!(env.extensions().count(), 0, "no chunked regions sent");
}

#[test]
fn strangers_get_no_queue_pair() {
    let (addr, r) = server(Some(SECRET));
    let wrong = Auth::from_secret(b"another-secret-of-enough-bytes!!").unwrap();
    let e = bootstrap::connect(addr, None, &wrong, &client_info(0), Duration::from_secs(2))
        .unwrap_err();
    assert!(
        matches!(e, BootstrapError::Wire(WireError::Unauthenticated(_))),
        "{e:?}"
    );
    let e = bootstrap::connect(
        addr,
        None,
        &Auth::none(),
        &client_info(0),
        Duration::from_secs(2),
    )
    .unwrap_err();
    assert!(matches!(e, BootstrapError::Wire(_)), "{e:?}");
    assert_eq!(
        r.accepted.load(Ordering::SeqCst),
        0,
        "no queue pair was ever created"
    );
}

#[test]
fn a_bad_request_is_refused_with_a_reason() {
    let (addr, r) = server(None);
    let e = bootstrap::connect(
        addr,
        None,
        &Auth::none(),
        &client_info(5),
        Duration::from_secs(2),
    )
    .unwrap_err();
    match e {
        BootstrapError::Refused(why) => assert!(why.contains("rail 5 of 2"), "{why}"),
        other => panic!("{other:?}"),
    }
    let mut bad = client_info(0);
    bad.mtu = 9;
    let e =
        bootstrap::connect(addr, None, &Auth::none(), &bad, Duration::from_secs(2)).unwrap_err();
    assert!(
        matches!(e, BootstrapError::Refused(ref w) if w.contains("mtu")),
        "{e:?}"
    );
    assert_eq!(r.accepted.load(Ordering::SeqCst), 0);
}

#[test]
fn a_silent_peer_costs_the_deadline_not_a_hang() {
    // Accepts the TCP connection and never answers.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let hold = std::thread::spawn(move || {
        let s = l.accept().unwrap();
        // Silent until the client gave up (bounded, in case it never does).
        let _ = done_rx.recv_timeout(Duration::from_secs(10));
        drop(s);
    });
    let t0 = Instant::now();
    let e = bootstrap::connect(
        addr,
        None,
        &Auth::none(),
        &client_info(0),
        Duration::from_millis(300),
    )
    .unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, BootstrapError::Wire(_)), "{e:?}");
    assert!(took < Duration::from_millis(1000), "took {took:?}");
    done_tx.send(()).unwrap();
    hold.join().unwrap();
}

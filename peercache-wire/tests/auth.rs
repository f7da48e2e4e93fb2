//! Authenticated handshakes over real sockets: the secret works, strangers are refused and
//! counted, and a recorded exchange replayed on a new connection fails in both directions.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use peercache_wire::envelope::{self, Message};
use peercache_wire::frame::{read_frame, write_frame};
use peercache_wire::handshake::{
    AuthChallenge, ClientHandshake, Hello, HelloReply, Plane, Step, client_sync,
};
use peercache_wire::rpc::{self, ClientConfig, Reply, RpcClient, RpcServer, ServerConfig};
use peercache_wire::{Auth, Incarnation, WireError};
use serde::{Deserialize, Serialize};

const SECRET: &[u8] = b"the-shared-cluster-secret";

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Ping(u32);
impl Message for Ping {
    const KIND: u16 = 0x00e1;
    const NAME: &'static str = "Ping";
}

fn server(auth: Auth) -> RpcServer {
    let handler: rpc::Handler = Arc::new(|_peer, env| {
        let Ping(n) = env.decode().unwrap();
        Reply::Frame(envelope::encode(&Ping(n + 1), &[]).unwrap())
    });
    RpcServer::start(
        ServerConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            planes: vec![Plane::Control],
            node: None,
            incarnation: Incarnation(1),
            max_frame: 1 << 16,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 16,
            offload: &[],
            workers: 1,
            name: "auth-rpc",
            auth,
            shares: Default::default(),
        },
        handler,
    )
    .unwrap()
}

fn call(srv: &RpcServer, auth: Auth) -> Result<u32, WireError> {
    let c = RpcClient::new(ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(2)),
        max_idle_per_peer: 1,
        max_frame: 1 << 16,
        auth,
    });
    let f = c.call(
        srv.local_addr(),
        &envelope::encode(&Ping(41), &[]).unwrap(),
        Duration::from_secs(2),
    )?;
    Ok(rpc::decode_reply::<Ping>(&f)?.0)
}

fn read(s: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    read_frame(s, 4096, &mut buf).unwrap();
    buf
}

#[test]
fn the_secret_is_required_and_checked() {
    let good = Auth::from_secret(SECRET).unwrap();
    let srv = server(good.clone());
    assert_eq!(call(&srv, good.clone()).unwrap(), 42);
    let wrong = Auth::from_secret(b"not-the-cluster-secret").unwrap();
    assert!(matches!(
        call(&srv, wrong),
        Err(WireError::Unauthenticated(_))
    ));
    // The wrong-secret client refuses the server's proof and hangs up; the server counts the
    // abandoned exchange (asynchronously, so wait for it with a deadline).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while good.rejected() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "rejection not counted"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(
        call(&srv, Auth::none()),
        Err(WireError::Unauthenticated(_))
    ));
    assert_eq!(good.rejected(), 2);
    // A secured client refuses an open server rather than talk to an impostor.
    let open = server(Auth::none());
    assert!(matches!(
        call(&open, good.clone()),
        Err(WireError::Unauthenticated(_))
    ));
    assert_eq!(
        call(&srv, good).unwrap(),
        42,
        "the server keeps serving members"
    );
}

#[test]
fn a_recorded_client_exchange_replayed_is_refused() {
    let auth = Auth::from_secret(SECRET).unwrap();
    let srv = server(auth.clone());
    let hello = Hello::new(Plane::Control, None, Incarnation(7));

    // Record a genuine exchange: hello, proof.
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    let (mut hs, hello_frame) = ClientHandshake::new(&hello, &auth).unwrap();
    write_frame(&mut s, &hello_frame).unwrap();
    let Step::Send(proof_frame) = hs.on_frame(&read(&mut s)).unwrap() else {
        panic!("expected a challenge");
    };
    write_frame(&mut s, &proof_frame).unwrap();
    let Step::Finish(_, ok) = hs.on_frame(&read(&mut s)).unwrap() else {
        panic!("expected the reply");
    };
    ok.unwrap();
    drop(s);

    // Replay both frames byte for byte on a new connection: the server picked a new nonce.
    let before = auth.rejected();
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    write_frame(&mut s, &hello_frame).unwrap();
    let challenge = read(&mut s);
    assert_eq!(
        envelope::Envelope::parse(&challenge).unwrap().kind,
        AuthChallenge::KIND
    );
    write_frame(&mut s, &proof_frame).unwrap();
    let reply: HelloReply = envelope::decode(&read(&mut s)).unwrap();
    assert!(
        matches!(&reply, HelloReply::Reject { reason } if reason.contains("authentication")),
        "{reply:?}"
    );
    assert_eq!(auth.rejected(), before + 1);
}

#[test]
fn a_recorded_server_acceptance_replayed_is_refused() {
    let auth = Auth::from_secret(SECRET).unwrap();
    let srv = server(auth.clone());
    // Record a genuine exchange: the challenge and the acceptance that carries the proof.
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    let hello = Hello::new(Plane::Control, None, Incarnation(8));
    let (mut hs, hello_frame) = ClientHandshake::new(&hello, &auth).unwrap();
    write_frame(&mut s, &hello_frame).unwrap();
    let challenge = read(&mut s);
    let Step::Send(proof_frame) = hs.on_frame(&challenge).unwrap() else {
        panic!("expected a challenge");
    };
    write_frame(&mut s, &proof_frame).unwrap();
    let acceptance = read(&mut s);
    let Step::Finish(_, ok) = hs.on_frame(&acceptance).unwrap() else {
        panic!("expected the reply");
    };
    ok.unwrap();
    drop(s);

    // An impostor without the secret replays both to a fresh client, whose nonce is new.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let _hello = read(&mut c);
        write_frame(&mut c, &challenge).unwrap();
        let _proof = read(&mut c);
        write_frame(&mut c, &acceptance).unwrap();
        // Wait for the client to hang up.
        let mut buf = Vec::new();
        let _ = read_frame(&mut c, 4096, &mut buf);
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let e = client_sync(&mut c, &hello, &auth, Duration::from_secs(2)).unwrap_err();
    assert!(matches!(e, WireError::Unauthenticated(_)), "{e:?}");
    drop(c);
    impostor.join().unwrap();
}

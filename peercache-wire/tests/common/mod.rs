//! Helpers the wire crate's integration tests share: an echo service over the RPC shell.
#![allow(dead_code)] // each test file uses a different subset

use std::sync::Arc;
use std::time::Duration;

use peercache_wire::envelope::{self, Message};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{
    self, ClientConfig, Reply, RpcClient, RpcError, RpcServer, ServerConfig,
};
use peercache_wire::{Auth, Incarnation};
use serde::{Deserialize, Serialize};

/// The echo request and reply: the reply's number is the request's plus one.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Echo(pub(crate) u64, pub(crate) String);
impl Message for Echo {
    const KIND: u16 = 0x00e0;
    const NAME: &'static str = "Echo";
}

/// An echo server on the control plane at `addr` (frames up to `max_frame`).
pub(crate) fn echo_server(
    addr: &str,
    auth: Auth,
    max_frame: usize,
    name: &'static str,
) -> RpcServer {
    let handler: rpc::Handler = Arc::new(|_peer, env| match env.decode::<Echo>() {
        Ok(Echo(n, s)) => Reply::Frame(envelope::encode(&Echo(n + 1, s), &[]).unwrap()),
        Err(e) => Reply::Error {
            error: RpcError {
                code: RpcError::CODE_MALFORMED,
                message: e.to_string(),
            },
            close: true,
        },
    });
    RpcServer::start(
        ServerConfig {
            bind: addr.parse().unwrap(),
            planes: vec![Plane::Control],
            node: None,
            incarnation: Incarnation(1),
            max_frame,
            handshake_timeout: Duration::from_secs(2),
            max_connections: 64,
            offload: &[],
            workers: 1,
            name,
            auth,
            shares: Default::default(),
        },
        handler,
    )
    .unwrap()
}

/// A tool's client of the control plane (frames up to `max_frame`).
pub(crate) fn echo_client(auth: Auth, max_frame: usize) -> RpcClient {
    RpcClient::new(ClientConfig {
        hello: Hello::new(Plane::Control, None, Incarnation(2)),
        max_idle_per_peer: 4,
        max_frame,
        auth,
    })
}

//! The discovery server: a [`ServerCore`] behind the shared RPC server on the meta port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peercache_wire::Auth;
use peercache_wire::envelope::{self, Message};
use peercache_wire::handshake::Plane;
use peercache_wire::rpc::{self, Reply, RpcError, RpcServer, ServerConfig};
use peercache_wire::{Incarnation, NodeId, WireError};

use crate::msg::{DiscReply, DiscRequest};
use crate::server_core::{Millis, ServerCore};

/// A running discovery server.
pub struct DiscoveryServer {
    server: RpcServer,
    core: Arc<Mutex<ServerCore>>,
    epoch: Instant,
}

impl std::fmt::Debug for DiscoveryServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryServer")
            .field("addr", &self.server.local_addr())
            .finish()
    }
}

/// Outcome of trying to host the cluster's discovery server on the meta port.
#[derive(Debug)]
pub enum Hosting {
    /// This process hosts it.
    Hosting(DiscoveryServer),
    /// The port is taken (a co-located rank hosts it): client only.
    PortTaken,
}

impl DiscoveryServer {
    /// Binds `bind` and serves with members expiring `ttl` after their last heartbeat.
    pub fn start(
        bind: SocketAddr,
        ttl: Duration,
        node: Option<NodeId>,
        auth: Auth,
    ) -> Result<Self, WireError> {
        let core = Arc::new(Mutex::new(ServerCore::new(ttl.as_millis() as Millis)));
        let epoch = Instant::now();
        let c = core.clone();
        let handler: rpc::Handler = Arc::new(move |env| {
            if env.kind != DiscRequest::KIND {
                return Reply::Error {
                    error: RpcError {
                        code: RpcError::CODE_UNKNOWN_KIND,
                        message: format!("kind {:#06x} is not served on the meta port", env.kind),
                    },
                    close: true,
                };
            }
            match env.decode::<DiscRequest>() {
                Ok(req) => {
                    let now = epoch.elapsed().as_millis() as Millis;
                    let reply = c.lock().handle(req, now);
                    match envelope::encode(&reply, &[]) {
                        Ok(f) => Reply::Frame(f),
                        Err(e) => Reply::Error {
                            error: RpcError {
                                code: RpcError::CODE_REFUSED,
                                message: e.to_string(),
                            },
                            close: false,
                        },
                    }
                }
                Err(e) => Reply::Error {
                    error: RpcError {
                        code: RpcError::CODE_MALFORMED,
                        message: e.to_string(),
                    },
                    close: true,
                },
            }
        });
        let server = RpcServer::start(
            ServerConfig {
                bind,
                planes: vec![Plane::Discovery],
                node,
                incarnation: Incarnation::fresh(),
                max_frame: 8 << 20,
                handshake_timeout: Duration::from_secs(2),
                max_connections: 4096,
                workers: 1,
                name: "pc-meta",
                auth,
            },
            handler,
        )?;
        Ok(DiscoveryServer {
            server,
            core,
            epoch,
        })
    }

    /// Tries to host the server on the meta port; a port already in use means a co-located
    /// rank hosts it.
    pub fn try_host(
        bind: SocketAddr,
        ttl: Duration,
        node: Option<NodeId>,
        auth: Auth,
    ) -> Result<Hosting, WireError> {
        match Self::start(bind, ttl, node, auth) {
            Ok(s) => Ok(Hosting::Hosting(s)),
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::AddrInUse => {
                Ok(Hosting::PortTaken)
            }
            Err(e) => Err(e),
        }
    }

    /// Bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Members this server holds now.
    pub fn members(&self) -> Vec<crate::NodeInfo> {
        self.core
            .lock()
            .members(self.epoch.elapsed().as_millis() as Millis)
    }

    /// Stops serving.
    pub fn shutdown(&mut self) {
        self.server.shutdown();
    }
}

/// Decodes a discovery reply frame.
pub(crate) fn decode(frame: &[u8]) -> Result<DiscReply, WireError> {
    rpc::decode_reply::<DiscReply>(frame)
}

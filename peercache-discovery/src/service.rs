//! The discovery server: a [`ServerCore`] behind the shared RPC server on the meta port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use peercache_wire::Auth;
use peercache_wire::envelope::{self, Message};
use peercache_wire::handshake::Plane;
use peercache_wire::metrics::IDENTITY_REFUSED_TOTAL;
use peercache_wire::rpc::{self, Reply, RpcError, RpcServer, ServerConfig};
use peercache_wire::tally::Tally;
use peercache_wire::{Incarnation, NodeId, WireError};

use crate::admission::Refusal;
use crate::msg::{DiscReply, DiscRequest};
use crate::server_core::{Millis, ServerCore};

/// A running discovery server.
pub struct DiscoveryServer {
    server: RpcServer,
    core: Arc<Mutex<ServerCore>>,
    epoch: Instant,
    refused: Arc<Refused>,
}

/// Refusal counts of one server.
struct Refused {
    /// Requests that acted for another member ([`IDENTITY_REFUSED_TOTAL`], `service =
    /// "discovery"`).
    identity: Tally,
    /// Every refused request, label `reason` ([`crate::metrics::REFUSED_TOTAL`]).
    by_reason: [Tally; 5],
    /// Live entries changed within one life ([`crate::metrics::ENTRY_CHANGES_TOTAL`]).
    live_changes: Tally,
}

impl Refused {
    const REASONS: [&'static str; 5] = [
        "not_yours",
        "too_many_members",
        "oversized",
        "table_full",
        "foreign_address",
    ];

    fn register() -> Self {
        Refused {
            identity: Tally::new(
                metrics::counter!(IDENTITY_REFUSED_TOTAL, "service" => "discovery"),
            ),
            by_reason: Self::REASONS.map(|r| {
                Tally::new(metrics::counter!(crate::metrics::REFUSED_TOTAL, "reason" => r))
            }),
            live_changes: Tally::new(metrics::counter!(crate::metrics::ENTRY_CHANGES_TOTAL)),
        }
    }

    fn count(&self, r: &Refusal) {
        if r.is_identity() {
            self.identity.add(1);
        }
        if let Some(i) = Self::REASONS.iter().position(|x| *x == r.reason()) {
            self.by_reason[i].add(1);
        }
    }
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

/// What one peer may hold of the meta port by default: frames above 64 KiB are charged, while
/// they arrive, to a budget of this many bytes (a member's requests are at most 16 KiB).
pub const META_FRAME_BUDGET: usize = 64 << 20;

impl DiscoveryServer {
    /// Binds `bind` and serves with members expiring `ttl` after their last heartbeat; large
    /// frames share a budget of [`META_FRAME_BUDGET`], and no source address is limited below
    /// the connection cap.
    pub fn start(
        bind: SocketAddr,
        ttl: Duration,
        node: Option<NodeId>,
        auth: Auth,
    ) -> Result<Self, WireError> {
        Self::start_with(bind, ttl, node, auth, Self::default_shares())
    }

    /// The shares [`DiscoveryServer::start`] serves with.
    pub fn default_shares() -> rpc::Shares {
        rpc::Shares {
            per_source: None,
            frame_budget: Some(peercache_wire::shares::FrameBudget::new(META_FRAME_BUDGET)),
        }
    }

    /// [`DiscoveryServer::start`] with the connection share per source address and the frame
    /// budget given (a node passes its own, so the meta port shares them with its other ports).
    pub fn start_with(
        bind: SocketAddr,
        ttl: Duration,
        node: Option<NodeId>,
        auth: Auth,
        shares: rpc::Shares,
    ) -> Result<Self, WireError> {
        let core = Arc::new(Mutex::new(ServerCore::new(ttl.as_millis() as Millis)));
        let epoch = Instant::now();
        let refused = Arc::new(Refused::register());
        let (c, counts) = (core.clone(), refused.clone());
        // Every refusal is counted; the log gets one line per 10 s, with how many it held back,
        // so a member hammering the port cannot flood it.
        let refusal_log = Arc::new(peercache_wire::limits::Throttle::new());
        let change_log = Arc::new(peercache_wire::limits::Throttle::new());
        let handler: rpc::Handler = Arc::new(move |peer, env| {
            let fail = |code, message: String, close| Reply::Error {
                error: RpcError { code, message },
                close,
            };
            if env.kind != DiscRequest::KIND {
                return fail(
                    RpcError::CODE_UNKNOWN_KIND,
                    format!("kind {:#06x} is not served on the meta port", env.kind),
                    true,
                );
            }
            let req = match env.decode::<DiscRequest>() {
                Ok(req) => req,
                Err(e) => return fail(RpcError::CODE_MALFORMED, e.to_string(), true),
            };
            let now = epoch.elapsed().as_millis() as Millis;
            let (reply, changed) = {
                let mut core = c.lock();
                let before = core.live_changes();
                let reply = core.handle(peer, req, now);
                (reply, core.live_changes() - before)
            };
            if changed > 0 {
                counts.live_changes.add(changed);
                if let Some(held) = change_log.admit() {
                    tracing::warn!(
                        peer = %peer.label(),
                        changed_since_last = held,
                        "a live member's entry changed without a restart: a registration in its \
                         name, or its repair (the member re-registers its own)"
                    );
                }
            }
            match reply {
                Ok(reply) => match envelope::encode(&reply, &[]) {
                    Ok(f) => Reply::Frame(f),
                    Err(e) => fail(RpcError::CODE_REFUSED, e.to_string(), false),
                },
                Err(r) => {
                    counts.count(&r);
                    if let Some(held) = refusal_log.admit() {
                        tracing::warn!(peer = %peer.label(), refusal = %r, refused_since_last = held, "discovery request refused");
                    }
                    let code = if r.is_identity() {
                        RpcError::CODE_FORBIDDEN
                    } else {
                        RpcError::CODE_REFUSED
                    };
                    fail(code, r.to_string(), false)
                }
            }
        });
        let server = RpcServer::start(
            ServerConfig {
                bind,
                planes: vec![Plane::Discovery],
                node,
                incarnation: Incarnation::fresh(),
                max_frame: crate::admission::MAX_FRAME,
                handshake_timeout: Duration::from_secs(2),
                max_connections: 4096,
                offload: &[],
                workers: 1,
                name: "pc-meta",
                auth,
                shares,
            },
            handler,
        )?;
        Ok(DiscoveryServer {
            server,
            core,
            epoch,
            refused,
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
        Self::try_host_with(bind, ttl, node, auth, Self::default_shares())
    }

    /// [`DiscoveryServer::try_host`] with the shares given ([`DiscoveryServer::start_with`]).
    pub fn try_host_with(
        bind: SocketAddr,
        ttl: Duration,
        node: Option<NodeId>,
        auth: Auth,
        shares: rpc::Shares,
    ) -> Result<Hosting, WireError> {
        match Self::start_with(bind, ttl, node, auth, shares) {
            Ok(s) => Ok(Hosting::Hosting(s)),
            Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::AddrInUse => {
                Ok(Hosting::PortTaken)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether a registration must announce only addresses of the host it comes from (on by
    /// default; [`crate::admission::check_sources`]). Turn it off where members reach the meta
    /// server through a NAT or from another interface than the one they announce.
    pub fn check_sources(&self, on: bool) {
        self.core.lock().set_check_sources(on);
    }

    /// Bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// Connections closed at accept because their source address held its share
    /// ([`DiscoveryServer::start_with`]).
    pub fn refused_for_source(&self) -> u64 {
        self.server.counters().refused_source.get()
    }

    /// Members this server holds now.
    pub fn members(&self) -> Vec<crate::NodeInfo> {
        self.core
            .lock()
            .members(self.epoch.elapsed().as_millis() as Millis)
    }

    /// Requests this server refused because they acted for another member.
    pub fn identity_refused(&self) -> u64 {
        self.refused.identity.get()
    }

    /// Registrations that changed a live member's entry within one life (a registration in
    /// its name, or the member's repair of one).
    pub fn live_changes(&self) -> u64 {
        self.refused.live_changes.get()
    }

    /// Requests this server refused for `reason` (`not_yours`, `too_many_members`,
    /// `oversized`, `table_full`).
    pub fn refused(&self, reason: &str) -> u64 {
        Refused::REASONS
            .iter()
            .position(|x| *x == reason)
            .map_or(0, |i| self.refused.by_reason[i].get())
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

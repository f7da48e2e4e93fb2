//! The discovery client: a background thread that registers, heartbeats, merges and publishes
//! membership events.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use peercache_wire::envelope;
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient};
use peercache_wire::{Auth, WireError};

use crate::client_core::{ClientCore, Event};
use crate::error::DiscoveryError;
use crate::info::NodeInfo;

/// Client settings.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// `discovery_addr` seeds (the head first); all share the cluster-wide meta port.
    pub seeds: Vec<SocketAddr>,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// Active masters.
    pub max_masters: usize,
    /// Deadline of one round of requests.
    pub rpc_timeout: Duration,
    /// Cluster authentication towards the masters.
    pub auth: Auth,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            seeds: Vec::new(),
            heartbeat: Duration::from_secs(1),
            max_masters: 3,
            rpc_timeout: Duration::from_millis(800),
            auth: Auth::none(),
        }
    }
}

struct Shared {
    core: Mutex<ClientCore>,
    state: Mutex<State>,
    cv: Condvar,
    subscribers: Mutex<Vec<mpsc::Sender<Event>>>,
    rpc: RpcClient,
    cfg: DiscoveryConfig,
}

#[derive(Default)]
struct State {
    stop: bool,
    ready: bool,
    rounds: u64,
}

/// A running membership client. All methods take `&self`.
///
/// # Example
///
/// One master on loopback and two members that register with it; each member sees both
/// within a deadline, and a member that stops is gone at once (it deregisters):
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use std::time::Duration;
///
/// use peercache_discovery::{DiscoveryClient, DiscoveryConfig, DiscoveryServer, NodeInfo};
/// use peercache_wire::{Auth, Incarnation, NodeId};
///
/// let master = DiscoveryServer::start(
///     "127.0.0.1:0".parse()?,
///     Duration::from_secs(2), // a member whose heartbeats stop is dropped after this
///     None,
///     Auth::none(),
/// )?;
/// let cfg = DiscoveryConfig {
///     seeds: vec![master.local_addr()],
///     heartbeat: Duration::from_millis(200),
///     ..DiscoveryConfig::default()
/// };
/// let member = |name: &str, port: u16| -> Result<DiscoveryClient, Box<dyn std::error::Error>> {
///     let host = IpAddr::from([127, 0, 0, 1]);
///     let info = NodeInfo {
///         node: NodeId::new(name)?,
///         incarnation: Incarnation::fresh(),
///         host,
///         meta: None,
///         control: SocketAddr::new(host, port),
///         data: vec![SocketAddr::new(host, port + 1)],
///         role: "inference".into(),
///         attrs: vec![],
///     };
///     Ok(DiscoveryClient::start(info, cfg.clone())?)
/// };
/// let a = member("node-a", 7100)?;
/// let b = member("node-b", 7200)?;
/// assert!(a.wait_for(Duration::from_secs(5), |m| m.len() == 2));
///
/// b.shutdown();
/// assert!(a.wait_for(Duration::from_secs(5), |m| m.len() == 1));
/// assert_eq!(a.members()[0].node.as_str(), "node-a");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DiscoveryClient {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for DiscoveryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryClient")
            .field("me", &self.shared.core.lock().me().node)
            .finish()
    }
}

impl DiscoveryClient {
    /// Starts heartbeating as `me`. Returns at once; see [`DiscoveryClient::wait_ready`].
    pub fn start(me: NodeInfo, cfg: DiscoveryConfig) -> Result<Self, DiscoveryError> {
        if cfg.seeds.is_empty() {
            return Err(DiscoveryError::NoSeeds);
        }
        let rpc = RpcClient::new(rpc::ClientConfig {
            hello: Hello::new(Plane::Discovery, Some(me.node.clone()), me.incarnation),
            max_idle_per_peer: 2,
            max_frame: crate::admission::MAX_FRAME,
            auth: cfg.auth.clone(),
        });
        let shared = Arc::new(Shared {
            core: Mutex::new(ClientCore::new(me, cfg.seeds.clone(), cfg.max_masters)),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            subscribers: Mutex::new(Vec::new()),
            rpc,
            cfg,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pc-discovery".into())
            .spawn(move || run(s))
            .map_err(|e| DiscoveryError::Wire(e.into()))?;
        Ok(DiscoveryClient {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Waits until a discovery server has this member registered (`None`: wait forever).
    pub fn wait_ready(&self, timeout: Option<Duration>) -> Result<(), DiscoveryError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut st = self.shared.state.lock();
        while !st.ready {
            if st.stop {
                return Err(DiscoveryError::Stopped);
            }
            match deadline {
                Some(d) => {
                    if self.shared.cv.wait_until(&mut st, d).timed_out() && !st.ready {
                        return Err(DiscoveryError::NotReady {
                            after: timeout.unwrap_or_default(),
                            seeds: self.shared.cfg.seeds.clone(),
                        });
                    }
                }
                None => self.shared.cv.wait(&mut st),
            }
        }
        Ok(())
    }

    /// True once registered with a discovery server.
    pub fn is_ready(&self) -> bool {
        self.shared.state.lock().ready
    }

    /// Waits until `cond(members)` holds or `timeout` passes; returns whether it held. The
    /// condition is re-checked after every heartbeat round.
    pub fn wait_for(&self, timeout: Duration, cond: impl Fn(&[NodeInfo]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock();
        loop {
            // Snapshot first: `cond` may call back into this client.
            let members = self.shared.core.lock().members();
            if cond(&members) {
                return true;
            }
            if st.stop || self.shared.cv.wait_until(&mut st, deadline).timed_out() {
                let members = self.shared.core.lock().members();
                return cond(&members);
            }
        }
    }

    /// Current members (this node included once registered).
    pub fn members(&self) -> Vec<NodeInfo> {
        self.shared.core.lock().members()
    }

    /// Current masters.
    pub fn masters(&self) -> Vec<SocketAddr> {
        self.shared.core.lock().masters().to_vec()
    }

    /// Rounds completed.
    pub fn rounds(&self) -> u64 {
        self.shared.state.lock().rounds
    }

    /// A channel of membership events from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel();
        self.shared.subscribers.lock().push(tx);
        rx
    }

    /// Deregisters from every master and stops. Idempotent.
    pub fn shutdown(&self) {
        {
            let mut st = self.shared.state.lock();
            if st.stop {
                return;
            }
            st.stop = true;
            self.shared.cv.notify_all();
        }
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    /// Stops without deregistering (what a crash looks like to the cluster; for tests).
    pub fn abandon(&self) {
        {
            let mut st = self.shared.state.lock();
            st.stop = true;
            st.ready = false;
            self.shared.cv.notify_all();
        }
        self.shared.core.lock().forget_masters();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for DiscoveryClient {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How often a member logs its heartbeat summary at INFO when nothing changed.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(10);

fn run(sh: Arc<Shared>) {
    let mut attempt = 0u32;
    let mut last_wait_log: Option<Instant> = None;
    let mut last_steady_log = Instant::now();
    let refusals = peercache_wire::limits::Throttle::new();
    loop {
        let round = sh.core.lock().round();
        let frames: Vec<(SocketAddr, Vec<u8>)> = round
            .iter()
            .filter_map(|(t, req)| envelope::encode(req, &[]).ok().map(|f| (*t, f)))
            .collect();
        let calls: Vec<(SocketAddr, &[u8])> =
            frames.iter().map(|(t, f)| (*t, f.as_slice())).collect();
        let replies = sh.rpc.call_many(&calls, sh.cfg.rpc_timeout);
        let answers: Vec<_> = calls
            .iter()
            .zip(replies)
            .map(|((t, _), r)| {
                let reply = r.and_then(|f| crate::service::decode(&f));
                // A refusal names what to fix (a foreign address, a full table): say it, at
                // most once per 10 s, instead of only "waiting for meta".
                if let Err(WireError::Remote { message, .. }) = &reply
                    && let Some(held) = refusals.admit()
                {
                    tracing::warn!(
                        server = %t,
                        refused_since_last = held,
                        "a discovery server refused this node: {message}"
                    );
                }
                (*t, reply.ok())
            })
            .collect();
        let any = answers.iter().any(|(_, a)| a.is_some());
        let answers_ok = answers.iter().filter(|(_, a)| a.is_some()).count();
        let calls_n = calls.len();
        for (t, a) in &answers {
            if a.is_none() {
                sh.rpc.forget(*t);
            }
        }
        let (events, ready, n, lost, misrecorded, masters) = {
            let mut core = sh.core.lock();
            let ev = core.merge(answers);
            (
                ev,
                core.is_ready(),
                core.members().len(),
                core.lost_registrations().to_vec(),
                core.misrecorded().to_vec(),
                core.masters().to_vec(),
            )
        };
        for e in &events {
            match e {
                Event::Joined(i) => {
                    tracing::info!(node = %i.node, control = %i.control, "member joined")
                }
                Event::Left(i) => tracing::info!(node = %i.node, "member left"),
                Event::MastersChanged(m) => {
                    tracing::info!(masters = ?m, "discovery masters changed")
                }
            }
        }
        for t in &lost {
            tracing::info!(server = %t, "registration lost at a discovery server; registering again");
        }
        for t in &misrecorded {
            tracing::warn!(
                server = %t,
                "a discovery server lists this node with endpoints it did not announce \
                 (a registration in its name); registering its own again"
            );
        }
        if !events.is_empty() {
            sh.subscribers
                .lock()
                .retain(|tx| events.iter().all(|e| tx.send(e.clone()).is_ok()));
        }
        if any {
            attempt = 0;
            // The summary operators grep for: every 10 s, and at once when something changed.
            let answered = answers_ok;
            if !events.is_empty()
                || !lost.is_empty()
                || !misrecorded.is_empty()
                || last_steady_log.elapsed() >= SUMMARY_EVERY
            {
                tracing::info!(
                    members = n,
                    masters = ?masters,
                    answered,
                    asked = calls_n,
                    "discovery heartbeat"
                );
                last_steady_log = Instant::now();
            }
        } else {
            attempt += 1;
            if last_wait_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                tracing::info!(seeds = ?sh.cfg.seeds, attempt, "waiting for meta");
                last_wait_log = Some(Instant::now());
            }
        }
        let wait = if any || n > 0 {
            sh.cfg.heartbeat
        } else {
            // Never joined: back off up to 8 heartbeats (at most 5 s).
            (sh.cfg.heartbeat * 2u32.saturating_pow(attempt.min(3)))
                .min(Duration::from_secs(5).max(sh.cfg.heartbeat))
        };
        let mut st = sh.state.lock();
        st.rounds += 1;
        if ready && !st.ready {
            st.ready = true;
        }
        sh.cv.notify_all();
        if !st.stop {
            let _ = sh.cv.wait_for(&mut st, wait);
        }
        if st.stop {
            let deregister = st.ready;
            drop(st);
            if deregister {
                let leave = sh.core.lock().leave();
                let frames: Vec<(SocketAddr, Vec<u8>)> = leave
                    .iter()
                    .filter_map(|(t, req)| envelope::encode(req, &[]).ok().map(|f| (*t, f)))
                    .collect();
                let calls: Vec<(SocketAddr, &[u8])> =
                    frames.iter().map(|(t, f)| (*t, f.as_slice())).collect();
                let _ = sh.rpc.call_many(&calls, sh.cfg.rpc_timeout);
            }
            return;
        }
    }
}

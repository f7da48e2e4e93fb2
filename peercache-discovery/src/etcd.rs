//! Membership kept in etcd: one key per member under a lease, a watch on the members prefix.
//!
//! A background thread runs a small single-threaded async runtime (etcd-client is async) and
//! one *session* at a time: connect, grant (or keep) the lease, write this member's key, list
//! the prefix, then refresh the lease every heartbeat and apply watch events until something
//! fails. When etcd is lost the last membership is kept and marked stale
//! (`peercache_discovery_stale` 1, [`EtcdClient::is_stale`]); the next session resumes it with a
//! fresh listing. A clean stop revokes the lease (the key goes at once); a process that dies
//! leaves when its lease expires. Every etcd call has a deadline.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    WatchOptions,
};
use metrics::{Counter, Gauge};
use parking_lot::{Condvar, Mutex};

use crate::admission::Limits;
use crate::client_core::Event;
use crate::error::DiscoveryError;
use crate::etcd_config::{EtcdConfig, EtcdTls};
use crate::etcd_view::{self, View};
use crate::info::NodeInfo;

struct Shared {
    me: NodeInfo,
    cfg: EtcdConfig,
    key: String,
    members_prefix: String,
    view: Mutex<View>,
    state: Mutex<State>,
    cv: Condvar,
    subscribers: Mutex<Vec<mpsc::Sender<Event>>>,
    stop: tokio::sync::watch::Sender<bool>,
    stale_gauge: Gauge,
    sessions: Counter,
    /// `peercache_discovery_refused_total` by reason, made where the node's recorder is set.
    refused: Vec<(&'static str, Counter)>,
}

#[derive(Default)]
struct State {
    stop: bool,
    abandon: bool,
    ready: bool,
    stale: bool,
    rounds: u64,
}

/// A running etcd membership client. All methods take `&self`.
pub struct EtcdClient {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdClient")
            .field("me", &self.shared.me.node)
            .field("endpoints", &self.shared.cfg.endpoints)
            .finish()
    }
}

impl EtcdClient {
    /// Starts keeping `me` in etcd. Returns at once; see [`EtcdClient::wait_ready`].
    pub fn start(me: NodeInfo, cfg: EtcdConfig) -> Result<Self, DiscoveryError> {
        Self::start_with_limits(me, cfg, Limits::default())
    }

    /// As [`EtcdClient::start`], admitting members up to `limits`.
    pub fn start_with_limits(
        me: NodeInfo,
        cfg: EtcdConfig,
        limits: Limits,
    ) -> Result<Self, DiscoveryError> {
        if cfg.endpoints.is_empty() {
            return Err(DiscoveryError::NoEtcdEndpoints);
        }
        // Fail at start, not in the background, on files that cannot be read.
        let options = connect_options(&cfg)?;
        let prefix = cfg.clean_prefix().to_string();
        let (stop, _) = tokio::sync::watch::channel(false);
        let shared = Arc::new(Shared {
            key: etcd_view::member_key(&prefix, &me.node),
            members_prefix: etcd_view::members_prefix(&prefix),
            me,
            cfg,
            view: Mutex::new(View::new(limits)),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            subscribers: Mutex::new(Vec::new()),
            stop,
            stale_gauge: metrics::gauge!(crate::metrics::STALE),
            sessions: metrics::counter!(crate::metrics::ETCD_SESSIONS_TOTAL),
            refused: ["malformed", "not_yours", "oversized", "too_many_members"]
                .into_iter()
                .map(|r| {
                    (
                        r,
                        metrics::counter!(crate::metrics::REFUSED_TOTAL, "reason" => r),
                    )
                })
                .collect(),
        });
        shared.stale_gauge.set(0.0);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("pc-discovery-etcd".into())
            .spawn(move || run(s, options))
            .map_err(|e| DiscoveryError::Wire(e.into()))?;
        Ok(EtcdClient {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Waits until this member's key is written and the members listed (`None`: forever).
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
                        return Err(DiscoveryError::EtcdNotReady {
                            after: timeout.unwrap_or_default(),
                            endpoints: self.shared.cfg.endpoints.clone(),
                        });
                    }
                }
                None => self.shared.cv.wait(&mut st),
            }
        }
        Ok(())
    }

    /// True once this member is in etcd and has listed the others.
    pub fn is_ready(&self) -> bool {
        self.shared.state.lock().ready
    }

    /// True while etcd is unreachable: [`EtcdClient::members`] is the last membership seen.
    pub fn is_stale(&self) -> bool {
        self.shared.state.lock().stale
    }

    /// Waits until `cond(members)` holds or `timeout` passes; returns whether it held. The
    /// condition is re-checked after every lease refresh and watch event.
    pub fn wait_for(&self, timeout: Duration, cond: impl Fn(&[NodeInfo]) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock();
        loop {
            let members = self.shared.view.lock().members();
            if cond(&members) {
                return true;
            }
            if st.stop || self.shared.cv.wait_until(&mut st, deadline).timed_out() {
                let members = self.shared.view.lock().members();
                return cond(&members);
            }
        }
    }

    /// Current members (this node included once ready).
    pub fn members(&self) -> Vec<NodeInfo> {
        self.shared.view.lock().members()
    }

    /// The etcd client URLs.
    pub fn endpoints(&self) -> &[String] {
        &self.shared.cfg.endpoints
    }

    /// Lease refreshes and watch events handled.
    pub fn rounds(&self) -> u64 {
        self.shared.state.lock().rounds
    }

    /// A channel of membership events from now on.
    pub fn subscribe(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel();
        self.shared.subscribers.lock().push(tx);
        rx
    }

    /// Revokes the lease (this member's key goes at once) and stops. Idempotent.
    pub fn shutdown(&self) {
        self.stop(false);
    }

    /// Stops without revoking (what a crash looks like: the key stays until its lease
    /// expires; for tests).
    pub fn abandon(&self) {
        self.stop(true);
    }

    fn stop(&self, abandon: bool) {
        {
            let mut st = self.shared.state.lock();
            if !st.stop {
                st.stop = true;
                st.abandon = abandon;
            }
            self.shared.cv.notify_all();
        }
        self.shared.stop.send_replace(true);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for EtcdClient {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The client options: TLS files read and checked here, once.
fn connect_options(cfg: &EtcdConfig) -> Result<ConnectOptions, DiscoveryError> {
    let mut o = ConnectOptions::new()
        .with_connect_timeout(cfg.rpc_timeout)
        .with_keep_alive(
            cfg.heartbeat.max(Duration::from_millis(500)),
            cfg.rpc_timeout,
        )
        .with_keep_alive_while_idle(true);
    if let Some((user, password)) = &cfg.user {
        o = o.with_user(user.clone(), password.clone());
    }
    if let Some(tls) = &cfg.tls {
        o = o.with_tls(tls_options(tls)?);
    }
    Ok(o)
}

fn tls_options(tls: &EtcdTls) -> Result<TlsOptions, DiscoveryError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|source| DiscoveryError::EtcdFile {
            path: p.to_path_buf(),
            source,
        })
    };
    let mut o = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&tls.ca_file)?));
    match (&tls.cert_file, &tls.key_file) {
        (Some(c), Some(k)) => o = o.identity(Identity::from_pem(read(c)?, read(k)?)),
        (None, None) => {}
        _ => return Err(DiscoveryError::EtcdIdentityIncomplete),
    }
    if let Some(d) = &tls.domain {
        o = o.domain_name(d.clone());
    }
    Ok(o)
}

/// Why one session ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("{what} took longer than {after:?}")]
    Timeout { what: &'static str, after: Duration },
    #[error("{what}: {source}")]
    Etcd {
        what: &'static str,
        source: etcd_client::Error,
    },
    #[error("{0}")]
    Closed(&'static str),
    #[error("the lease expired (etcd did not hear from this member for its TTL)")]
    LeaseLost,
}

/// Runs `f` with the session's deadline, naming what timed out or failed.
async fn call<T>(
    what: &'static str,
    after: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, SessionEnd> {
    match tokio::time::timeout(after, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(SessionEnd::Etcd { what, source }),
        Err(_) => Err(SessionEnd::Timeout { what, after }),
    }
}

fn run(sh: Arc<Shared>, options: ConnectOptions) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "etcd discovery could not start its runtime");
            return;
        }
    };
    rt.block_on(supervise(sh, options));
}

/// Sessions one after another, with a bounded back-off between failed ones.
async fn supervise(sh: Arc<Shared>, options: ConnectOptions) {
    let mut stop = sh.stop.subscribe();
    let mut lease: Option<i64> = None;
    let mut attempt = 0u32;
    let mut last_log: Option<Instant> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        sh.sessions.increment(1);
        let end = session(&sh, &options, &mut lease, &mut attempt, &mut stop).await;
        let Err(why) = end else { return };
        if matches!(why, SessionEnd::LeaseLost) {
            lease = None;
        }
        let was_ready = {
            let mut st = sh.state.lock();
            if st.ready && !st.stale {
                st.stale = true;
                sh.stale_gauge.set(1.0);
                sh.cv.notify_all();
                true
            } else {
                false
            }
        };
        if was_ready {
            tracing::warn!(
                endpoints = ?sh.cfg.endpoints, error = %why,
                members = sh.view.lock().members().len(),
                "etcd lost; keeping the last membership (stale) and reconnecting"
            );
        } else if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            tracing::info!(
                endpoints = ?sh.cfg.endpoints, attempt, error = %why,
                "waiting for etcd"
            );
            last_log = Some(Instant::now());
        }
        attempt = attempt.saturating_add(1);
        let wait = (sh.cfg.heartbeat / 2 * 2u32.saturating_pow(attempt.min(3)))
            .min(Duration::from_secs(5));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}

/// One connection's life: returns `Ok` when asked to stop, `Err` when etcd failed.
async fn session(
    sh: &Shared,
    options: &ConnectOptions,
    lease: &mut Option<i64>,
    attempt: &mut u32,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Result<(), SessionEnd> {
    let t = sh.cfg.rpc_timeout;
    let limits = *sh.view.lock().limits();
    let mut client = call(
        "connecting",
        t,
        Client::connect(sh.cfg.endpoints.clone(), Some(options.clone())),
    )
    .await?;
    // Keep the lease of a previous session if etcd still has it (an etcd restart keeps
    // leases), so peers never see this member leave; otherwise grant a new one.
    let kept = match *lease {
        Some(id) => {
            let ttl = call("reading the lease", t, client.lease_time_to_live(id, None)).await?;
            (ttl.ttl() > 0).then_some(id)
        }
        None => None,
    };
    let id = match kept {
        Some(id) => id,
        None => call(
            "granting the lease",
            t,
            client.lease_grant(sh.cfg.lease_ttl_secs(), None),
        )
        .await?
        .id(),
    };
    *lease = Some(id);
    call(
        "writing this member's key",
        t,
        client.put(
            sh.key.as_str(),
            etcd_view::encode(&sh.me),
            Some(PutOptions::new().with_lease(id)),
        ),
    )
    .await?;
    let listing = call(
        "listing the members",
        t,
        client.get(
            sh.members_prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_limit(limits.max_members as i64 + 1),
            ),
        ),
    )
    .await?;
    let revision = listing.header().map_or(0, |h| h.revision());
    let mut infos = Vec::with_capacity(listing.kvs().len());
    for kv in listing.kvs() {
        match etcd_view::decode(&sh.members_prefix, kv.key(), kv.value(), &limits) {
            Ok(info) => infos.push(info),
            Err(why) => refuse(sh, &why),
        }
    }
    let (mut keeper, mut acks) =
        call("opening the keep-alive", t, client.lease_keep_alive(id)).await?;
    let mut watch = call(
        "opening the watch",
        t,
        client.watch(
            sh.members_prefix.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        ),
    )
    .await?;
    let events = sh.view.lock().replace(infos);
    let resumed = {
        let mut st = sh.state.lock();
        let resumed = st.stale;
        st.stale = false;
        st.ready = true;
        st.rounds += 1;
        resumed
    };
    sh.stale_gauge.set(0.0);
    *attempt = 0;
    publish(sh, events);
    let n = sh.view.lock().members().len();
    if resumed {
        tracing::info!(
            members = n,
            lease = id,
            "etcd reachable again; membership resumed"
        );
    } else {
        tracing::info!(members = n, lease = id, endpoints = ?sh.cfg.endpoints, "joined through etcd");
    }
    let mut tick = tokio::time::interval(sh.cfg.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut last_summary = Instant::now();
    loop {
        tokio::select! {
            _ = stop.changed() => {
                let abandon = sh.state.lock().abandon;
                if !abandon {
                    // The key goes with the lease: peers see this member leave at once.
                    let _ = call("revoking the lease", t, client.lease_revoke(id)).await;
                    *lease = None;
                }
                return Ok(());
            }
            _ = tick.tick() => {
                call("refreshing the lease", t, keeper.keep_alive()).await?;
                let ack = call("refreshing the lease", t, acks.message())
                    .await?
                    .ok_or(SessionEnd::Closed("etcd closed the keep-alive stream"))?;
                if ack.ttl() <= 0 {
                    return Err(SessionEnd::LeaseLost);
                }
                sh.state.lock().rounds += 1;
                sh.cv.notify_all();
                if last_summary.elapsed() >= crate::client::SUMMARY_EVERY {
                    tracing::info!(
                        members = sh.view.lock().members().len(), lease = id,
                        "discovery heartbeat (etcd)"
                    );
                    last_summary = Instant::now();
                }
            }
            msg = watch.message() => {
                let resp = msg
                    .map_err(|source| SessionEnd::Etcd { what: "watching the members", source })?
                    .ok_or(SessionEnd::Closed("etcd closed the watch"))?;
                if resp.canceled() || resp.compact_revision() > 0 {
                    // Compacted past our revision (or cancelled): list again from scratch.
                    return Err(SessionEnd::Closed("etcd cancelled the watch"));
                }
                let mut events = Vec::new();
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    match ev.event_type() {
                        EventType::Put => {
                            let admitted = etcd_view::decode(
                                &sh.members_prefix, kv.key(), kv.value(), &limits,
                            )
                            .and_then(|info| sh.view.lock().put(info));
                            match admitted {
                                Ok(e) => events.extend(e),
                                Err(why) => refuse(sh, &why),
                            }
                        }
                        EventType::Delete => match etcd_view::node_of(&sh.members_prefix, kv.key()) {
                            Ok(node) => {
                                let gone = sh.view.lock().delete(&node);
                                // Our own key deleted by someone else: write it again.
                                if node == sh.me.node && !gone.is_empty() {
                                    return Err(SessionEnd::Closed("this member's key was deleted"));
                                }
                                events.extend(gone);
                            }
                            Err(why) => refuse(sh, &why),
                        },
                    }
                }
                sh.state.lock().rounds += 1;
                publish(sh, events);
            }
        }
    }
}

fn refuse(sh: &Shared, why: &etcd_view::Refused) {
    if let Some((_, c)) = sh.refused.iter().find(|(r, _)| *r == why.reason()) {
        c.increment(1);
    }
    tracing::warn!(error = %why, "refused a member entry in etcd");
}

fn publish(sh: &Shared, events: Vec<Event>) {
    for e in &events {
        match e {
            Event::Joined(i) => {
                tracing::info!(node = %i.node, control = %i.control, "member joined")
            }
            Event::Left(i) => tracing::info!(node = %i.node, "member left"),
            Event::MastersChanged(_) => {}
        }
    }
    if !events.is_empty() {
        sh.subscribers
            .lock()
            .retain(|tx| events.iter().all(|e| tx.send(e.clone()).is_ok()));
    }
    sh.cv.notify_all();
}

//! KV events for routers: every node publishes what its directory shard gains and loses, in
//! vLLM's KV-event format over ZeroMQ, so a router subscribed to every node sees which node
//! holds which page with no central emitter (docs/routing.md).
//!
//! * [`batch`] — changes as vLLM `KVEventBatch`es, one per holding node.
//! * [`zmtp`] and [`msgpack`] — the wire: ZeroMQ's ZMTP 3.0 and MessagePack, as much as a
//!   publisher needs, so the node links no ZeroMQ library.
//! * [`log`] — the numbered, bounded log of published batches and the state a late
//!   subscriber is replayed.
//! * [`stream`] — the `PUB` port: each subscriber gets every batch whose topic (the holder's
//!   node id) matches one of its subscriptions, or misses it (counted) when it falls behind.
//! * [`replay`] — the `ROUTER` port: the batches from a sequence number on, or the shard's
//!   whole current state.

mod batch;
mod log;
mod msgpack;
mod replay;
mod stream;
mod zmtp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use peercache_directory::DirectoryService;
use peercache_wire::NodeId;

use crate::serve::listener::ServerThread;

pub(crate) use log::EventLog;

/// Where and how a node publishes its KV events.
#[derive(Clone, Debug)]
pub(crate) struct KvEventsConfig {
    /// The `PUB` port's address.
    pub(crate) bind: SocketAddr,
    /// The replay (`ROUTER`) port's address, if any.
    pub(crate) replay_bind: Option<SocketAddr>,
    /// Tokens per page, told in `BlockStored.block_size`.
    pub(crate) block_size: u64,
    /// How often the shard's changes are collected into batches.
    pub(crate) interval: Duration,
    /// This node (the topic of the batches that are not about one holder).
    pub(crate) node: NodeId,
}

/// Counters of the event stream, labelled with the node.
#[derive(Clone)]
pub(crate) struct EventCounters {
    /// Batches published.
    pub(crate) batches: metrics::Counter,
    /// Batches a slow subscriber missed.
    pub(crate) missed: metrics::Counter,
    /// Changes the shard's journal could not hold (each time, subscribers are told to start
    /// over and sent the state).
    pub(crate) lost: metrics::Counter,
    /// Replay requests served.
    pub(crate) replays: metrics::Counter,
    /// Connections refused (over the cap, a failed greeting, a wrong socket type).
    pub(crate) refused: metrics::Counter,
    /// Subscribers connected now.
    pub(crate) subscribers: metrics::Gauge,
}

impl EventCounters {
    /// The node's series (registered at 0 whether or not the node publishes events).
    pub(crate) fn register(node: &NodeId) -> EventCounters {
        use crate::observe::series as s;
        let n = || node.to_string();
        EventCounters {
            batches: metrics::counter!(s::KV_EVENT_BATCHES, "node" => n()),
            missed: metrics::counter!(s::KV_EVENT_MISSED, "node" => n()),
            lost: metrics::counter!(s::KV_EVENT_LOST, "node" => n()),
            replays: metrics::counter!(s::KV_EVENT_REPLAYS, "node" => n()),
            refused: metrics::counter!(s::KV_EVENT_REFUSED, "node" => n()),
            subscribers: metrics::gauge!(s::KV_EVENT_SUBSCRIBERS, "node" => n()),
        }
    }
}

/// Subscribers served at once on the `PUB` port.
pub(crate) const MAX_SUBSCRIBERS: usize = 64;
/// Replay connections served at once.
pub(crate) const MAX_REPLAYS: usize = 8;
/// Longest greeting, and longest wait for one write to a peer.
pub(crate) const PEER_DEADLINE: Duration = Duration::from_secs(5);
/// Most changes the shard's journal holds between two collections.
pub(crate) const JOURNAL_CAP: usize = 1 << 20;
/// How often the shard's changes are collected into batches.
pub(crate) const INTERVAL: Duration = Duration::from_millis(20);

/// A node's KV-event publisher: its ports, its thread and runtime.
pub(crate) struct KvEvents {
    /// The `PUB` port's bound address.
    pub(crate) addr: SocketAddr,
    /// The replay port's bound address.
    pub(crate) replay_addr: Option<SocketAddr>,
    thread: ServerThread,
}

impl KvEvents {
    /// Binds the ports, starts recording the shard's changes and publishes them every
    /// `cfg.interval` until shut down.
    pub(crate) fn start(
        cfg: KvEventsConfig,
        dir: Arc<DirectoryService>,
        counters: EventCounters,
    ) -> std::io::Result<KvEvents> {
        let pub_listener = std::net::TcpListener::bind(cfg.bind)?;
        let addr = pub_listener.local_addr()?;
        let replay_listener = match cfg.replay_bind {
            Some(b) => Some(std::net::TcpListener::bind(b)?),
            None => None,
        };
        let replay_addr = match &replay_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        dir.with_shard(|sh, _| sh.record_changes(JOURNAL_CAP));
        let log = Arc::new(EventLog::new(cfg.node.clone(), cfg.block_size));
        let thread = ServerThread::spawn("pc-kv-events", move |stop| async move {
            let mut tasks = tokio::task::JoinSet::new();
            tasks.spawn(stream::serve(
                pub_listener,
                log.clone(),
                counters.clone(),
                stop.clone(),
            ));
            if let Some(l) = replay_listener {
                tasks.spawn(replay::serve(
                    l,
                    log.clone(),
                    dir.clone(),
                    counters.clone(),
                    stop.clone(),
                ));
            }
            pump(log, dir, cfg.interval, counters, stop).await;
            tasks.shutdown().await;
        })?;
        Ok(KvEvents {
            addr,
            replay_addr,
            thread,
        })
    }

    /// Stops publishing and closes every subscriber.
    pub(crate) fn shutdown(&mut self) {
        self.thread.shutdown();
    }
}

/// Collects the shard's changes every `interval` and publishes them.
async fn pump(
    log: Arc<EventLog>,
    dir: Arc<DirectoryService>,
    interval: Duration,
    counters: EventCounters,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut changes = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let lost = dir.with_shard(|sh, _| sh.take_changes(&mut changes));
        if lost > 0 {
            counters.lost.increment(lost);
            tracing::warn!(
                lost,
                "KV events: the shard changed faster than it was published; subscribers are told to start over"
            );
            // What was collected is in the state the subscribers are sent now.
            changes.clear();
            let n = log.publish_state(&dir);
            counters.batches.increment(n);
        } else if !changes.is_empty() {
            let n = log.publish_changes(&changes);
            counters.batches.increment(n);
            changes.clear();
        }
    }
}

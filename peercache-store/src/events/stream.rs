//! The `PUB` port: at most [`MAX_SUBSCRIBERS`] subscribers, each greeted within
//! [`PEER_DEADLINE`]; a subscriber gets each batch whose topic starts with one of its
//! subscriptions (ZeroMQ's prefix rule: the empty subscription takes all). One that falls
//! [`SUBSCRIBER_QUEUE`](super::log) batches behind misses the oldest (counted; the sequence
//! numbers show the gap) and one whose socket takes no byte for [`PEER_DEADLINE`] is closed.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::sync::broadcast::error::RecvError;

use super::log::EventLog;
use super::zmtp::{self, Subscription};
use super::{EventCounters, MAX_SUBSCRIBERS, PEER_DEADLINE};
use crate::serve::listener::{Accepting, accept_loop};

/// Most subscriptions one subscriber holds, and the longest topic it may subscribe to.
const MAX_SUBSCRIPTIONS: usize = 64;
const MAX_TOPIC: usize = 256;

pub(super) async fn serve(
    listener: std::net::TcpListener,
    log: Arc<EventLog>,
    counters: EventCounters,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let accepting = Accepting {
        max: MAX_SUBSCRIBERS,
        what: "KV-event port",
        refused: counters.refused.clone(),
    };
    accept_loop(listener, accepting, stop, move |sock| {
        // Subscribed before the greeting: nothing published after the connection is missed.
        let rx = log.subscribe();
        let counters = counters.clone();
        async move {
            counters.subscribers.increment(1.0);
            if let Err(e) = subscriber(sock, rx, &counters).await {
                tracing::debug!(error = %e, "KV-event subscriber closed");
            }
            counters.subscribers.decrement(1.0);
        }
    })
    .await;
}

async fn subscriber(
    mut sock: tokio::net::TcpStream,
    mut rx: tokio::sync::broadcast::Receiver<Arc<super::log::Published>>,
    counters: &EventCounters,
) -> Result<(), zmtp::ZmtpError> {
    let _ = sock.set_nodelay(true);
    let kind = match zmtp::accept(&mut sock, "PUB", PEER_DEADLINE).await {
        Ok(k) => k,
        Err(e) => {
            counters.refused.increment(1);
            return Err(e);
        }
    };
    if kind != "SUB" && kind != "XSUB" {
        counters.refused.increment(1);
        return Err(zmtp::ZmtpError::Protocol(format!(
            "a {kind} socket on the PUB port (SUB or XSUB expected)"
        )));
    }
    let (mut rd, mut wr) = sock.into_split();
    let mut subs: Vec<Vec<u8>> = Vec::new();
    loop {
        tokio::select! {
            f = zmtp::read_frame(&mut rd, MAX_TOPIC + 16) => {
                match zmtp::subscription(f?) {
                    Some(Subscription::Subscribe(t)) => {
                        if subs.len() >= MAX_SUBSCRIPTIONS {
                            return Err(zmtp::ZmtpError::Protocol("too many subscriptions".into()));
                        }
                        subs.push(t);
                    }
                    Some(Subscription::Cancel(t)) => {
                        if let Some(i) = subs.iter().position(|s| *s == t) {
                            subs.swap_remove(i);
                        }
                    }
                    None => {}
                }
            }
            m = rx.recv() => match m {
                Ok(p) => {
                    let topic = p.topic.as_str().as_bytes();
                    if subs.iter().any(|s| topic.starts_with(s)) {
                        tokio::time::timeout(PEER_DEADLINE, wr.write_all(&p.framed))
                            .await
                            .map_err(|_| zmtp::ZmtpError::Deadline(PEER_DEADLINE))??;
                    }
                }
                Err(RecvError::Lagged(n)) => counters.missed.increment(n),
                Err(RecvError::Closed) => return Ok(()),
            },
        }
    }
}

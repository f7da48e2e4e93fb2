//! The replay port (`ROUTER`, vLLM's replay protocol): a request is one message whose last
//! frame is an 8-byte big-endian sequence number; the answer is the batches numbered from it
//! on, if the log still holds them all, else the shard's whole current state (an
//! `AllBlocksCleared` batch, then `BlockStored` batches), every batch numbered with the
//! sequence number the state is current as of (0 before anything was published); then the end
//! marker (an empty topic, sequence number -1, an empty payload). A request from a `REQ`
//! socket starts with an empty delimiter frame and so does every answer to it.

use std::sync::Arc;
use std::time::Duration;

use peercache_directory::DirectoryService;
use tokio::io::AsyncWriteExt;

use super::log::EventLog;
use super::zmtp;
use super::{EventCounters, MAX_REPLAYS, PEER_DEADLINE};
use crate::serve::listener::{Accepting, accept_loop};

/// A replay connection that asks nothing for this long is closed.
const IDLE: Duration = Duration::from_secs(30);
/// The sequence number that ends an answer.
const END: i64 = -1;

pub(super) async fn serve(
    listener: std::net::TcpListener,
    log: Arc<EventLog>,
    dir: Arc<DirectoryService>,
    counters: EventCounters,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let accepting = Accepting {
        max: MAX_REPLAYS,
        what: "KV-event replay port",
        refused: counters.refused.clone(),
    };
    let states = Arc::new(tokio::sync::Semaphore::new(1));
    accept_loop(listener, accepting, stop, move |sock| {
        let (log, dir, counters) = (log.clone(), dir.clone(), counters.clone());
        let states = states.clone();
        async move {
            if let Err(e) = requester(sock, &log, &dir, &counters, &states).await {
                tracing::debug!(error = %e, "KV-event replay connection closed");
            }
        }
    })
    .await;
}

async fn requester(
    mut sock: tokio::net::TcpStream,
    log: &EventLog,
    dir: &DirectoryService,
    counters: &EventCounters,
    states: &tokio::sync::Semaphore,
) -> Result<(), zmtp::ZmtpError> {
    let kind = match zmtp::accept(&mut sock, "ROUTER", PEER_DEADLINE).await {
        Ok(k) => k,
        Err(e) => {
            counters.refused.increment(1);
            return Err(e);
        }
    };
    if kind != "REQ" && kind != "DEALER" {
        counters.refused.increment(1);
        return Err(zmtp::ZmtpError::Protocol(format!(
            "a {kind} socket on the replay port (REQ or DEALER expected)"
        )));
    }
    loop {
        let request = tokio::time::timeout(IDLE, read_request(&mut sock))
            .await
            .map_err(|_| zmtp::ZmtpError::Deadline(IDLE))??;
        let Some((delimited, start)) = request else {
            continue;
        };
        counters.replays.increment(1);
        let mut out = Vec::new();
        let message = |out: &mut Vec<u8>, topic: &[u8], seq: i64, payload: &[u8]| {
            let seq = seq.to_be_bytes();
            if delimited {
                zmtp::put_message(out, &[b"", topic, &seq, payload]);
            } else {
                zmtp::put_message(out, &[topic, &seq, payload]);
            }
        };
        match u64::try_from(start).ok().and_then(|s| log.since(s)) {
            Some(batches) => {
                for p in batches {
                    message(
                        &mut out,
                        p.topic.as_str().as_bytes(),
                        p.seq as i64,
                        &p.payload,
                    );
                    flush_if_large(&mut sock, &mut out).await?;
                }
            }
            None => {
                // One state at a time per node, read a chunk per hold of the shard's lock and
                // sent as it is read: a requester costs neither the shard's lock nor memory
                // beyond a chunk.
                let _one = states
                    .acquire()
                    .await
                    .map_err(|_| zmtp::ZmtpError::Protocol("the node is stopping".into()))?;
                let as_of = log.as_of() as i64;
                let cleared = log.cleared();
                message(
                    &mut out,
                    cleared.holder.as_str().as_bytes(),
                    as_of,
                    &cleared.payload,
                );
                let mut from = Some(0);
                while let Some(f) = from {
                    let (batches, next) = log.state_chunk(dir, f);
                    for b in batches {
                        message(&mut out, b.holder.as_str().as_bytes(), as_of, &b.payload);
                        flush_if_large(&mut sock, &mut out).await?;
                    }
                    from = next;
                    tokio::task::yield_now().await;
                }
            }
        }
        message(&mut out, b"", END, b"");
        write(&mut sock, &out).await?;
    }
}

/// Reads one request: whether it came with an empty delimiter frame (a `REQ` socket), and the
/// sequence number asked for; `None` for a message that is not a request (ignored).
async fn read_request(
    sock: &mut tokio::net::TcpStream,
) -> Result<Option<(bool, i64)>, zmtp::ZmtpError> {
    let mut frames = Vec::new();
    loop {
        let f = zmtp::read_frame(sock, 64).await?;
        if f.command {
            // PING and the like: not part of a message.
            continue;
        }
        let more = f.more;
        if frames.len() < 4 {
            frames.push(f.body);
        } else {
            return Err(zmtp::ZmtpError::Protocol(
                "a replay request of over 4 frames".into(),
            ));
        }
        if !more {
            break;
        }
    }
    let delimited = frames.len() > 1 && frames[0].is_empty();
    let Some(last) = frames.last() else {
        return Ok(None);
    };
    let Ok(seq) = <[u8; 8]>::try_from(&last[..]) else {
        return Ok(None);
    };
    Ok(Some((delimited, i64::from_be_bytes(seq))))
}

async fn flush_if_large(
    sock: &mut tokio::net::TcpStream,
    out: &mut Vec<u8>,
) -> Result<(), zmtp::ZmtpError> {
    if out.len() >= 1 << 20 {
        write(sock, out).await?;
        out.clear();
    }
    Ok(())
}

async fn write(sock: &mut tokio::net::TcpStream, bytes: &[u8]) -> Result<(), zmtp::ZmtpError> {
    tokio::time::timeout(PEER_DEADLINE, sock.write_all(bytes))
        .await
        .map_err(|_| zmtp::ZmtpError::Deadline(PEER_DEADLINE))??;
    Ok(())
}

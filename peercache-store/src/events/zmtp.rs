//! The part of ZMTP 3.0 (ZeroMQ's wire protocol, RFC 23) a publisher needs: the greeting with
//! the NULL mechanism, the `READY` command, and frames, so that libzmq's `SUB`, `REQ` and
//! `DEALER` sockets (pyzmq, vLLM's subscribers, routers) talk to a node without a ZeroMQ
//! library in the node. Every read is bounded by the caller's size limit and deadline.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What went wrong with a peer; the connection is closed on any of them.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ZmtpError {
    /// The socket failed or closed.
    #[error("zmtp: {0}")]
    Io(#[from] std::io::Error),
    /// The peer did not finish in time.
    #[error("zmtp: the peer did not answer within {0:?}")]
    Deadline(Duration),
    /// The peer is not a ZMTP 3 peer with the NULL mechanism, or sent a malformed frame.
    #[error("zmtp: {0}")]
    Protocol(String),
}

/// A frame flag: more frames of this message follow.
const MORE: u8 = 0x01;
/// A frame flag: the size is 8 bytes.
const LONG: u8 = 0x02;
/// A frame flag: a command, not a message frame.
const COMMAND: u8 = 0x04;

/// One frame read from a peer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    /// More frames of this message follow.
    pub(crate) more: bool,
    /// A command (`READY`, `SUBSCRIBE`, …) rather than message data.
    pub(crate) command: bool,
    pub(crate) body: Vec<u8>,
}

/// Our greeting: ZMTP 3.0, NULL mechanism, as server.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3;
    g[11] = 0;
    g[12..16].copy_from_slice(b"NULL");
    g[32] = 1;
    g
}

/// The `READY` command body announcing `socket_type`.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    b.push(5);
    b.extend_from_slice(b"READY");
    b.push(11);
    b.extend_from_slice(b"Socket-Type");
    b.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    b.extend_from_slice(socket_type.as_bytes());
    b
}

/// Reads the `Socket-Type` property of a `READY` command body.
fn socket_type_of(body: &[u8]) -> Result<String, ZmtpError> {
    let bad = |why: &str| ZmtpError::Protocol(format!("malformed READY: {why}"));
    let name_len = *body.first().ok_or_else(|| bad("empty"))? as usize;
    let name = body.get(1..1 + name_len).ok_or_else(|| bad("short name"))?;
    if name != b"READY" {
        return Err(ZmtpError::Protocol(format!(
            "expected READY, got the command {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    let mut rest = &body[1 + name_len..];
    while !rest.is_empty() {
        let n = rest[0] as usize;
        let key = rest
            .get(1..1 + n)
            .ok_or_else(|| bad("short property name"))?;
        let len_at = 1 + n;
        let len = rest
            .get(len_at..len_at + 4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| bad("short property length"))?;
        let value = rest
            .get(len_at + 4..len_at + 4 + len)
            .ok_or_else(|| bad("short property value"))?;
        if key.eq_ignore_ascii_case(b"Socket-Type") {
            return Ok(String::from_utf8_lossy(value).into_owned());
        }
        rest = &rest[len_at + 4 + len..];
    }
    Err(bad("no Socket-Type"))
}

/// Appends one frame to `out`.
pub(crate) fn put_frame(out: &mut Vec<u8>, body: &[u8], more: bool, command: bool) {
    let mut flags = 0;
    if more {
        flags |= MORE;
    }
    if command {
        flags |= COMMAND;
    }
    if body.len() <= 0xff {
        out.push(flags);
        out.push(body.len() as u8);
    } else {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
}

/// Appends a whole message (its frames in order) to `out`.
pub(crate) fn put_message(out: &mut Vec<u8>, frames: &[&[u8]]) {
    for (i, f) in frames.iter().enumerate() {
        put_frame(out, f, i + 1 < frames.len(), false);
    }
}

/// Reads one frame of at most `max` bytes.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Frame, ZmtpError> {
    let flags = r.read_u8().await?;
    if flags & !(MORE | LONG | COMMAND) != 0 {
        return Err(ZmtpError::Protocol(format!("bad frame flags {flags:#x}")));
    }
    let len = if flags & LONG != 0 {
        r.read_u64().await?
    } else {
        u64::from(r.read_u8().await?)
    };
    if len > max as u64 {
        return Err(ZmtpError::Protocol(format!(
            "a frame of {len} bytes (at most {max} here)"
        )));
    }
    let mut body = vec![0; len as usize];
    r.read_exact(&mut body).await?;
    Ok(Frame {
        more: flags & MORE != 0,
        command: flags & COMMAND != 0,
        body,
    })
}

/// Greets a peer that connected to us and exchanges `READY`: returns the peer's socket type.
/// The whole exchange must finish within `deadline`.
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    socket_type: &str,
    deadline: Duration,
) -> Result<String, ZmtpError> {
    let exchange = async {
        s.write_all(&greeting()).await?;
        let mut theirs = [0u8; 64];
        s.read_exact(&mut theirs).await?;
        if theirs[0] != 0xff || theirs[9] & 1 != 1 {
            return Err(ZmtpError::Protocol("not a ZMTP peer".into()));
        }
        if theirs[10] < 3 {
            return Err(ZmtpError::Protocol(format!(
                "ZMTP {}.{} (3.0 or later needed)",
                theirs[10], theirs[11]
            )));
        }
        let mechanism = &theirs[12..32];
        if !mechanism.starts_with(b"NULL") || mechanism[4..].iter().any(|b| *b != 0) {
            return Err(ZmtpError::Protocol(format!(
                "security mechanism {:?} (only NULL is served)",
                String::from_utf8_lossy(mechanism).trim_end_matches('\0')
            )));
        }
        let mut out = Vec::with_capacity(40);
        put_frame(&mut out, &ready(socket_type), false, true);
        s.write_all(&out).await?;
        let f = read_frame(s, 4096).await?;
        if !f.command {
            return Err(ZmtpError::Protocol("expected the READY command".into()));
        }
        socket_type_of(&f.body)
    };
    tokio::time::timeout(deadline, exchange)
        .await
        .map_err(|_| ZmtpError::Deadline(deadline))?
}

/// A subscription change sent by a `SUB` peer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Subscription {
    Subscribe(Vec<u8>),
    Cancel(Vec<u8>),
}

/// Reads a subscription change from a frame a `SUB` peer sent (ZMTP 3.0 sends it as a message
/// whose first byte is 1 or 0; 3.1 as a `SUBSCRIBE` or `CANCEL` command); anything else is
/// `None`.
pub(crate) fn subscription(f: Frame) -> Option<Subscription> {
    let mut body = f.body;
    if f.command {
        let n = *body.first()? as usize;
        let name = body.get(1..1 + n)?.to_vec();
        let topic = body.split_off(1 + n);
        return match &name[..] {
            b"SUBSCRIBE" => Some(Subscription::Subscribe(topic)),
            b"CANCEL" => Some(Subscription::Cancel(topic)),
            _ => None,
        };
    }
    match body.first()? {
        1 => Some(Subscription::Subscribe(body.split_off(1))),
        0 => Some(Subscription::Cancel(body.split_off(1))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_greeting_and_ready_are_what_rfc_23_lays_out() {
        let g = greeting();
        assert_eq!(&g[..10], &[0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f]);
        assert_eq!(&g[10..12], &[3, 0]);
        assert_eq!(&g[12..17], b"NULL\0");
        assert_eq!(g[32], 1);
        let r = ready("PUB");
        assert_eq!(&r[..6], b"\x05READY");
        assert_eq!(socket_type_of(&r).unwrap(), "PUB");
        assert!(socket_type_of(b"\x05READY\x0bSocket-Type\x00\x00\x00\x09SU").is_err());
        assert!(socket_type_of(b"\x05ERROR").is_err());
    }

    #[test]
    fn frames_round_trip_short_and_long_and_a_frame_past_the_limit_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut out = Vec::new();
        put_message(&mut out, &[b"topic", &[7u8; 300]]);
        assert_eq!(&out[..2], &[MORE, 5]);
        assert_eq!(out[7], LONG);
        rt.block_on(async {
            let mut r = &out[..];
            let a = read_frame(&mut r, 1024).await.unwrap();
            assert!(a.more && !a.command && a.body == b"topic");
            let b = read_frame(&mut r, 1024).await.unwrap();
            assert!(!b.more && b.body.len() == 300);
            let mut r = &out[7..];
            assert!(matches!(
                read_frame(&mut r, 100).await,
                Err(ZmtpError::Protocol(_))
            ));
            let mut r: &[u8] = &[0x80, 0];
            assert!(read_frame(&mut r, 100).await.is_err());
        });
    }

    #[test]
    fn subscriptions_are_read_in_both_zmtp_forms() {
        let msg = |b: &[u8]| Frame {
            more: false,
            command: false,
            body: b.to_vec(),
        };
        assert_eq!(
            subscription(msg(b"\x01ab")),
            Some(Subscription::Subscribe(b"ab".to_vec()))
        );
        assert_eq!(
            subscription(msg(b"\x00")),
            Some(Subscription::Cancel(Vec::new()))
        );
        assert_eq!(subscription(msg(b"\x05x")), None);
        let cmd = Frame {
            more: false,
            command: true,
            body: b"\x09SUBSCRIBEab".to_vec(),
        };
        assert_eq!(
            subscription(cmd),
            Some(Subscription::Subscribe(b"ab".to_vec()))
        );
    }
}

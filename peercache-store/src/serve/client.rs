//! The node side of the client API ([`crate::client`]): each request checked for shape,
//! then served as one batch of the node's own API.

use std::sync::Arc;

use peercache_directory::msg::LayoutRuns;
use peercache_wire::auth::Grant;
use peercache_wire::envelope::{self, Envelope, Message};
use peercache_wire::rpc::{Reply, RpcError};
use serde_bytes::ByteBuf;

use crate::StoreError;
use crate::client::{ClientReply, ClientRequest, MAX_CLIENT_BYTES, MAX_CLIENT_KEYS};
use crate::node::core::Core;
use crate::read::dest::PageDest;
use crate::read::scratch::RawSeg;

/// Checks a request's shape before any work is done.
fn check(keys: usize, page_bytes: u32, data: Option<usize>) -> Result<(), String> {
    if keys > MAX_CLIENT_KEYS {
        return Err(format!(
            "{keys} keys in one request (limit {MAX_CLIENT_KEYS})"
        ));
    }
    if page_bytes == 0 {
        return Err("page_bytes is 0".into());
    }
    let total = keys as u64 * page_bytes as u64;
    if total > MAX_CLIENT_BYTES as u64 {
        return Err(format!(
            "{total} page bytes in one request (limit {MAX_CLIENT_BYTES})"
        ));
    }
    if let Some(d) = data
        && d as u64 != total
    {
        return Err(format!(
            "{d} data bytes for {keys} pages of {page_bytes} bytes"
        ));
    }
    Ok(())
}

/// Serves one client request on the node `core` (`None`: starting or stopping) for a client
/// whose proof granted it `grant`: a read-only client token's `Put` is refused (forbidden).
pub(crate) fn serve(core: Option<Arc<Core>>, grant: Grant, env: Envelope<'_>) -> Reply {
    let refuse = |code, message: String, close| Reply::Error {
        error: RpcError { code, message },
        close,
    };
    if env.kind != ClientRequest::KIND {
        return refuse(
            RpcError::CODE_UNKNOWN_KIND,
            format!("kind {:#06x} is not served on the client port", env.kind),
            true,
        );
    }
    let req: ClientRequest = match env.decode() {
        Ok(r) => r,
        Err(e) => return refuse(RpcError::CODE_MALFORMED, e.to_string(), true),
    };
    if grant == Grant::ReadOnly && matches!(req, ClientRequest::Put { .. }) {
        return refuse(
            RpcError::CODE_FORBIDDEN,
            "this client proved the read-only client token: it may read, look up and locate, \
             not write"
                .into(),
            false,
        );
    }
    let Some(core) = core else {
        return refuse(
            RpcError::CODE_SHUTDOWN,
            "node is starting or stopping".into(),
            false,
        );
    };
    let result = match req {
        ClientRequest::Put {
            keys,
            page_bytes,
            data,
        } => check(keys.len(), page_bytes, Some(data.len()))
            .map_err(StoreError::BadRequest)
            .and_then(|()| put(&core, &keys, page_bytes as usize, &data)),
        ClientRequest::Get { keys, page_bytes } => check(keys.len(), page_bytes, None)
            .map_err(StoreError::BadRequest)
            .and_then(|()| get(&core, &keys, page_bytes as usize)),
        ClientRequest::Exists { keys } if keys.len() > MAX_CLIENT_KEYS => Err(
            StoreError::BadRequest(format!("{} keys (limit {MAX_CLIENT_KEYS})", keys.len())),
        ),
        ClientRequest::Exists { keys } => core
            .read_wing()
            .contains(&core.page_keys(&keys))
            .map(ClientReply::Present),
        ClientRequest::Locate { keys } if keys.len() > MAX_CLIENT_KEYS => Err(
            StoreError::BadRequest(format!("{} keys (limit {MAX_CLIENT_KEYS})", keys.len())),
        ),
        ClientRequest::Prefix { keys } if keys.len() > MAX_CLIENT_KEYS => Err(
            StoreError::BadRequest(format!("{} keys (limit {MAX_CLIENT_KEYS})", keys.len())),
        ),
        ClientRequest::Prefix { keys } => core
            .read_wing()
            .prefix_locations(&core.page_keys(&keys))
            .map(ClientReply::Prefix),
        ClientRequest::Locate { keys } => {
            core.read_wing()
                .locate(&core.page_keys(&keys))
                .map(|owners| {
                    ClientReply::Located(
                        owners
                            .into_iter()
                            .map(|o| o.map(|o| o.into_vec()).unwrap_or_default())
                            .collect(),
                    )
                })
        }
    };
    let encoded = result.and_then(|r| {
        // Each location's layout fingerprint rides beside the reply, as on directory answers.
        let ext = match &r {
            ClientReply::Located(l) => LayoutRuns::extension_of(l.iter().flatten())?,
            _ => None,
        };
        envelope::encode(&r, ext.as_slice()).map_err(StoreError::from)
    });
    match encoded {
        Ok(f) => Reply::Frame(f),
        Err(StoreError::Shutdown) => {
            refuse(RpcError::CODE_SHUTDOWN, "node is stopping".into(), false)
        }
        Err(e) => refuse(RpcError::CODE_REFUSED, e.to_string(), false),
    }
}

/// Stores a batch, except pages another node already lists under the same key with other
/// bytes: a client must not replace another owner's page (readers would get either copy), so
/// each such page gets a false flag, is counted in
/// `peercache_client_overwrites_refused_total` and logged (one line per 10 s). The same bytes
/// again are stored (a second copy of one page). One directory lookup per batch.
fn put(
    core: &Core,
    keys: &[String],
    page_bytes: usize,
    data: &[u8],
) -> Result<ClientReply, StoreError> {
    let page_keys = core.page_keys(keys);
    let pages: Vec<&[u8]> = data.chunks_exact(page_bytes).collect();
    let owners = core.read_wing().locate(&page_keys)?;
    let foreign: Vec<bool> = owners
        .iter()
        .zip(&pages)
        .map(|(owners, page)| {
            let mut others = owners
                .iter()
                .flatten()
                .filter(|l| l.node != core.id.me)
                .peekable();
            if others.peek().is_none() {
                return false;
            }
            let sum = peercache_pool::header::checksum(page);
            others.any(|l| l.len as usize != page.len() || l.checksum != sum)
        })
        .collect();
    let refused = foreign.iter().filter(|f| **f).count();
    if refused == 0 {
        let counts = vec![1; pages.len()];
        return core
            .write_wing()
            .set_pages(&page_keys, &pages, &counts)
            .map(ClientReply::Stored);
    }
    core.metrics.overwrites_refused.add(refused as u64);
    if let Some(held) = core.servers.client_refusals.admit() {
        let first = foreign
            .iter()
            .position(|f| *f)
            .map_or("", |i| keys[i].as_str());
        tracing::warn!(
            refused,
            first = %first,
            held_back = held,
            "client put refused for keys another node holds with other bytes"
        );
    }
    let keep: Vec<usize> = (0..pages.len()).filter(|&i| !foreign[i]).collect();
    let mut flags = vec![false; pages.len()];
    if !keep.is_empty() {
        let kk: Vec<_> = keep.iter().map(|&i| page_keys[i]).collect();
        let kp: Vec<&[u8]> = keep.iter().map(|&i| pages[i]).collect();
        let stored = core.write_wing().set_pages(&kk, &kp, &vec![1; kp.len()])?;
        for (&i, ok) in keep.iter().zip(stored) {
            flags[i] = ok;
        }
    }
    Ok(ClientReply::Stored(flags))
}

/// Reads a batch and packs the found pages.
fn get(core: &Core, keys: &[String], page_bytes: usize) -> Result<ClientReply, StoreError> {
    let mut buf = vec![0u8; keys.len() * page_bytes];
    let raw: Vec<RawSeg> = buf
        .chunks_exact_mut(page_bytes)
        .map(|s| RawSeg {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        })
        .collect();
    let counts = vec![1; raw.len()];
    // SAFETY: `buf` is owned here, and each segment is a distinct chunk of it, unused while
    // `dest` lives.
    let mut dest = unsafe { PageDest::new(raw.len(), &raw, &counts) }?;
    let valid = core
        .read_wing()
        .get_pages(&core.page_keys(keys), &mut dest)?;
    drop(dest);
    // Close the gaps the misses left (in place, front to back).
    let mut end = 0;
    for (i, v) in valid.iter().enumerate() {
        if v.is_some() {
            if end != i * page_bytes {
                buf.copy_within(i * page_bytes..(i + 1) * page_bytes, end);
            }
            end += page_bytes;
        }
    }
    buf.truncate(end);
    Ok(ClientReply::Pages {
        valid,
        data: ByteBuf::from(buf),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_checks_name_the_problem() {
        assert!(check(4, 4096, Some(4 * 4096)).is_ok());
        assert!(check(4, 0, None).unwrap_err().contains("page_bytes is 0"));
        assert!(
            check(4, 4096, Some(4095))
                .unwrap_err()
                .contains("4095 data bytes")
        );
        assert!(
            check(MAX_CLIENT_KEYS + 1, 1, None)
                .unwrap_err()
                .contains("limit")
        );
        assert!(
            check(2, (MAX_CLIENT_BYTES / 2 + 1) as u32, None)
                .unwrap_err()
                .contains("page bytes")
        );
    }

    #[test]
    fn requests_of_another_kind_or_malformed_are_refused_with_a_code() {
        let other = envelope::encode(
            &RpcError {
                code: 9,
                message: "x".into(),
            },
            &[],
        )
        .unwrap();
        match serve(None, Grant::Full, Envelope::parse(&other).unwrap()) {
            Reply::Error { error, close } => {
                assert_eq!(error.code, RpcError::CODE_UNKNOWN_KIND);
                assert!(close);
            }
            Reply::Frame(_) => panic!("served a foreign kind"),
        }
        let req = envelope::encode(
            &ClientRequest::Exists {
                keys: vec!["k".into()],
            },
            &[],
        )
        .unwrap();
        match serve(None, Grant::ReadOnly, Envelope::parse(&req).unwrap()) {
            Reply::Error { error, .. } => assert_eq!(error.code, RpcError::CODE_SHUTDOWN),
            Reply::Frame(_) => panic!("served without a node"),
        }
    }

    #[test]
    fn a_read_only_client_s_put_is_forbidden_before_anything_else() {
        let put = envelope::encode(
            &ClientRequest::Put {
                keys: vec!["k".into()],
                page_bytes: 4,
                data: ByteBuf::from(vec![1, 2, 3, 4]),
            },
            &[],
        )
        .unwrap();
        match serve(None, Grant::ReadOnly, Envelope::parse(&put).unwrap()) {
            Reply::Error { error, close } => {
                assert_eq!(error.code, RpcError::CODE_FORBIDDEN);
                assert!(error.message.contains("read-only"), "{}", error.message);
                assert!(!close, "the connection keeps serving reads");
            }
            Reply::Frame(_) => panic!("a read-only put was served"),
        }
    }
}

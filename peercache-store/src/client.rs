//! The client API: processes that do not embed a node (a driver, an admin tool, a service
//! written against a running `peercache-node`) put, get and check pages through one node.
//!
//! Off by default (`client_enabled = true` turns it on). A node serves it on its own listener
//! (`client_port`, on the control bind host), with its own threads, so a slow client never
//! holds up the directory; the node advertises the address in discovery (attribute
//! `client`). Connections run the same handshake as every other PeerCache connection,
//! including the cluster secret. Each request is one batch of the node's own API: a put is
//! `batch_set` (the pages land in *that* node's pool, or wherever its mode writes), a get is
//! `batch_get_valid` (local pool or any peer, verified), an exists is `batch_contains`, a locate
//! is a directory lookup (which owners list the key; nothing is read).
//!
//! This path copies every page through a frame: it exists for tools and for processes that
//! cannot share memory with a node. An inference engine embeds [`crate::Store`] (or the
//! Python `PeerCacheStore`) and reads into registered memory instead.
//!
//! Kinds `0x0303` (request) and `0x0304` (reply).

use std::net::SocketAddr;
use std::time::Duration;

use peercache_directory::msg::{EXT_LAYOUTS, LayoutRuns};
use peercache_wire::envelope::{self, Envelope, Message};
use peercache_wire::handshake::{Hello, Plane};
use peercache_wire::rpc::{self, RpcClient, RpcError};
use peercache_wire::{Auth, Incarnation};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::StoreError;

/// Most keys in one client request.
pub const MAX_CLIENT_KEYS: usize = 4096;
/// Most page bytes in one client request or reply (the [`Client`] splits larger batches).
pub const MAX_CLIENT_BYTES: usize = 32 << 20;
/// Largest frame the client port accepts: a batch of [`MAX_CLIENT_BYTES`] and its keys.
pub const MAX_CLIENT_FRAME: usize = MAX_CLIENT_BYTES + (1 << 20);
/// Page bytes the [`Client`] puts in one frame.
const CHUNK_BYTES: usize = 8 << 20;
/// Discovery attribute holding a node's client endpoint.
pub const CLIENT_ATTR: &str = "client";

/// A request to a node's client listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Publish pages of `page_bytes` each: `data` holds `keys.len()` pages back to back.
    Put {
        /// Page keys (the node applies its own `prefix`).
        keys: Vec<String>,
        /// Size of every page of the batch.
        page_bytes: u32,
        /// The pages, concatenated.
        data: ByteBuf,
    },
    /// Read pages of `page_bytes` each.
    Get {
        /// Page keys.
        keys: Vec<String>,
        /// Size of every page of the batch.
        page_bytes: u32,
    },
    /// Which keys are stored anywhere in the cluster.
    Exists {
        /// Page keys.
        keys: Vec<String>,
    },
    /// Where the directory says each key lives (diagnostics: nothing is read).
    Locate {
        /// Page keys.
        keys: Vec<String>,
    },
    /// Where one request's prefix is: the page keys of the request, in order (at most
    /// [`MAX_CLIENT_KEYS`]).
    Prefix {
        /// Page keys, in request order.
        keys: Vec<String>,
    },
}

impl Message for ClientRequest {
    const KIND: u16 = 0x0303;
    const NAME: &'static str = "ClientRequest";
}

/// A node's answer to a [`ClientRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientReply {
    /// One flag per put page: stored (or already stored).
    Stored(Vec<bool>),
    /// One entry per requested key: the page's valid length, or None (a miss). `data` holds
    /// the found pages only, in request order, `page_bytes` each.
    Pages {
        /// Valid length per key.
        valid: Vec<Option<u32>>,
        /// The found pages, concatenated.
        data: ByteBuf,
    },
    /// One flag per key.
    Present(Vec<bool>),
    /// Per key, every owner the directory lists (empty: not in the directory).
    Located(Vec<Vec<peercache_directory::Location>>),
    /// Every node holding the first key with its leading run, longest first
    /// ([`crate::Store::prefix_locations`]).
    Prefix(Vec<crate::PrefixRun>),
}

impl Message for ClientReply {
    const KIND: u16 = 0x0304;
    const NAME: &'static str = "ClientReply";
}

/// A page read through the client API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientPage {
    /// The whole page (`page_bytes` long).
    pub bytes: Vec<u8>,
    /// Leading bytes that hold data (the page's size unless it was a partial tail page).
    pub valid: u32,
}

/// A connection to one node's client listener (blocking; pooled connections; every call has
/// a deadline). Batches larger than one frame are split.
pub struct Client {
    rpc: RpcClient,
    node: SocketAddr,
    timeout: Duration,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("node", &self.node).finish()
    }
}

impl Client {
    /// A client of the node whose client listener is `node`; `timeout` bounds each call.
    pub fn new(node: SocketAddr, auth: Auth, timeout: Duration) -> Client {
        Client {
            rpc: RpcClient::new(rpc::ClientConfig {
                hello: Hello::new(Plane::Control, None, Incarnation::fresh()),
                max_idle_per_peer: 1,
                max_frame: MAX_CLIENT_FRAME,
                auth,
            }),
            node,
            timeout,
        }
    }

    /// The node this client talks to.
    pub fn node(&self) -> SocketAddr {
        self.node
    }

    fn call(&self, req: &ClientRequest) -> Result<ClientReply, StoreError> {
        let frame = envelope::encode(req, &[])?;
        let reply = self.rpc.call(self.node, &frame, self.timeout)?;
        let env = Envelope::parse(&reply)?;
        if env.kind == RpcError::KIND {
            let e: RpcError = env.decode()?;
            return Err(StoreError::Remote {
                code: e.code,
                message: e.message,
            });
        }
        let mut reply: ClientReply = env.decode()?;
        if let ClientReply::Located(l) = &mut reply
            && let Some(runs) = env.extension_value::<LayoutRuns>(EXT_LAYOUTS)?
        {
            runs.apply(l.iter_mut().flatten())?;
        }
        Ok(reply)
    }

    /// Keys per request for pages of `page_bytes`.
    fn per_call(page_bytes: usize) -> usize {
        (CHUNK_BYTES / page_bytes.max(1)).clamp(1, MAX_CLIENT_KEYS)
    }

    /// Publishes `pages` (all the same size) on the node. `true` = stored.
    pub fn put<K: AsRef<str>>(&self, keys: &[K], pages: &[&[u8]]) -> Result<Vec<bool>, StoreError> {
        if keys.len() != pages.len() {
            return Err(StoreError::BadRequest(format!(
                "{} keys for {} pages",
                keys.len(),
                pages.len()
            )));
        }
        let Some(first) = pages.first() else {
            return Ok(Vec::new());
        };
        let page_bytes = first.len();
        if pages.iter().any(|p| p.len() != page_bytes) || page_bytes == 0 {
            return Err(StoreError::BadRequest(
                "every page of a put must have the same, non-zero size".into(),
            ));
        }
        if page_bytes > MAX_CLIENT_BYTES {
            return Err(StoreError::BadRequest(format!(
                "a {page_bytes}-byte page exceeds one request ({MAX_CLIENT_BYTES})"
            )));
        }
        let n = Self::per_call(page_bytes);
        let mut out = Vec::with_capacity(keys.len());
        for (ks, ps) in keys.chunks(n).zip(pages.chunks(n)) {
            let mut data = Vec::with_capacity(ps.len() * page_bytes);
            for p in ps {
                data.extend_from_slice(p);
            }
            let req = ClientRequest::Put {
                keys: ks.iter().map(|k| k.as_ref().to_string()).collect(),
                page_bytes: page_bytes as u32,
                data: ByteBuf::from(data),
            };
            match self.call(&req)? {
                ClientReply::Stored(s) if s.len() == ks.len() => out.extend(s),
                other => return Err(unexpected("put", &other)),
            }
        }
        Ok(out)
    }

    /// Where a request's prefix is (see [`crate::Store::prefix_locations`]): one `Prefix`
    /// request, which the node answers from its directory fan-out with the runs alone. More
    /// than [`MAX_CLIENT_KEYS`] keys, or a node of a release before `Prefix` (it refuses the
    /// request as malformed), are asked with `Locate` and the owners folded here.
    pub fn prefix_locations<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> Result<Vec<crate::PrefixRun>, StoreError> {
        if keys.len() > MAX_CLIENT_KEYS {
            return Ok(crate::prefix_runs(&self.locate(keys)?));
        }
        let req = ClientRequest::Prefix {
            keys: keys.iter().map(|k| k.as_ref().to_string()).collect(),
        };
        match self.call(&req) {
            Ok(ClientReply::Prefix(runs)) => {
                match runs
                    .iter()
                    .find(|r| r.leading > keys.len() || r.resident > r.leading)
                {
                    Some(r) => Err(malformed(
                        "prefix",
                        format!(
                            "{} holds {} leading keys ({} resident) of {}",
                            r.node,
                            r.leading,
                            r.resident,
                            keys.len()
                        ),
                    )),
                    None => Ok(runs),
                }
            }
            Ok(other) => Err(unexpected("prefix", &other)),
            Err(StoreError::Remote { code, .. }) if code == RpcError::CODE_MALFORMED => {
                Ok(crate::prefix_runs(&self.locate(keys)?))
            }
            Err(e) => Err(e),
        }
    }

    /// Reads pages of `page_bytes` each: one entry per key, None = a miss.
    pub fn get<K: AsRef<str>>(
        &self,
        keys: &[K],
        page_bytes: usize,
    ) -> Result<Vec<Option<ClientPage>>, StoreError> {
        if page_bytes == 0 || page_bytes > MAX_CLIENT_BYTES {
            return Err(StoreError::BadRequest(format!(
                "page_bytes {page_bytes} outside 1..={MAX_CLIENT_BYTES}"
            )));
        }
        let mut out = Vec::with_capacity(keys.len());
        for ks in keys.chunks(Self::per_call(page_bytes)) {
            let req = ClientRequest::Get {
                keys: ks.iter().map(|k| k.as_ref().to_string()).collect(),
                page_bytes: page_bytes as u32,
            };
            let reply = self.call(&req)?;
            let ClientReply::Pages { valid, data } = &reply else {
                return Err(unexpected("get", &reply));
            };
            let found = valid.iter().filter(|v| v.is_some()).count();
            if valid.len() != ks.len() || data.len() != found * page_bytes {
                return Err(unexpected("get", &reply));
            }
            let mut pages = data.chunks_exact(page_bytes);
            for v in valid {
                out.push(v.map(|valid| ClientPage {
                    bytes: pages.next().map(<[u8]>::to_vec).unwrap_or_default(),
                    valid,
                }));
            }
        }
        Ok(out)
    }

    /// Which keys are stored anywhere in the cluster.
    pub fn exists<K: AsRef<str>>(&self, keys: &[K]) -> Result<Vec<bool>, StoreError> {
        self.per_key(
            keys,
            "exists",
            |keys| ClientRequest::Exists { keys },
            |r| match r {
                ClientReply::Present(p) => Ok(p),
                other => Err(other),
            },
        )
    }

    /// Where the directory says each key lives: every owner's location (empty: not listed).
    pub fn locate<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> Result<Vec<Vec<peercache_directory::Location>>, StoreError> {
        self.per_key(
            keys,
            "locate",
            |keys| ClientRequest::Locate { keys },
            |r| match r {
                ClientReply::Located(l) => Ok(l),
                other => Err(other),
            },
        )
    }

    /// A per-key request in chunks of [`MAX_CLIENT_KEYS`]: one answer per key, in order.
    fn per_key<K: AsRef<str>, T>(
        &self,
        keys: &[K],
        op: &str,
        request: impl Fn(Vec<String>) -> ClientRequest,
        answers: impl Fn(ClientReply) -> Result<Vec<T>, ClientReply>,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for ks in keys.chunks(MAX_CLIENT_KEYS) {
            let req = request(ks.iter().map(|k| k.as_ref().to_string()).collect());
            match answers(self.call(&req)?) {
                Ok(a) if a.len() == ks.len() => out.extend(a),
                Ok(a) => {
                    return Err(malformed(
                        op,
                        format!("{} answers for {} keys", a.len(), ks.len()),
                    ));
                }
                Err(other) => return Err(unexpected(op, &other)),
            }
        }
        Ok(out)
    }
}

fn malformed(op: &str, detail: String) -> StoreError {
    StoreError::Wire(peercache_wire::WireError::Malformed {
        what: "client reply",
        detail: format!("{op}: {detail}"),
    })
}

fn unexpected(op: &str, reply: &ClientReply) -> StoreError {
    let what = match reply {
        ClientReply::Stored(s) => format!("Stored with {} flags", s.len()),
        ClientReply::Pages { valid, data } => {
            format!(
                "Pages with {} entries and {} bytes",
                valid.len(),
                data.len()
            )
        }
        ClientReply::Present(p) => format!("Present with {} flags", p.len()),
        ClientReply::Located(l) => format!("Located with {} entries", l.len()),
        ClientReply::Prefix(r) => format!("Prefix with {} runs", r.len()),
    };
    malformed(op, format!("unexpected {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_hostile_bytes_never_panic() {
        let req = ClientRequest::Put {
            keys: vec!["a".into(), "b".into()],
            page_bytes: 3,
            data: ByteBuf::from(vec![1, 2, 3, 4, 5, 6]),
        };
        let bytes = envelope::encode(&req, &[]).unwrap();
        assert_eq!(envelope::decode::<ClientRequest>(&bytes).unwrap(), req);
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for cut in 0..bytes.len() {
            let _ = envelope::decode::<ClientRequest>(&bytes[..cut]);
        }
        for _ in 0..20_000 {
            let mut b = bytes.clone();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % b.len();
            b[i] = (x >> 32) as u8;
            let _ = envelope::decode::<ClientRequest>(&b);
            let _ = envelope::decode::<ClientReply>(&b);
        }
    }
}

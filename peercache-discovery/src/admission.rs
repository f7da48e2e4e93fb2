//! What a discovery server admits: a member speaks only for itself, and no member can grow the
//! table (or the reply that carries it) past fixed bounds.

use peercache_wire::rpc::Peer;
use peercache_wire::{Incarnation, NodeId};
use thiserror::Error;

use crate::info::NodeInfo;
use crate::msg::DiscRequest;

/// Largest discovery frame either side accepts (requests and replies).
pub const MAX_FRAME: usize = 8 << 20;

/// Bounds on what members may announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Members one table holds.
    pub max_members: usize,
    /// Encoded bytes of one announcement.
    pub max_info_bytes: usize,
    /// Attributes of one announcement.
    pub max_attrs: usize,
    /// Data endpoints (rails) of one announcement.
    pub max_data_endpoints: usize,
    /// Encoded bytes of the whole table: the members reply must fit in [`MAX_FRAME`].
    pub max_table_bytes: usize,
    /// Refuse a registration that announces an address on another host than the connection's
    /// source ([`check_sources`]).
    pub check_sources: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_members: 4096,
            max_info_bytes: 16 << 10,
            max_attrs: 64,
            max_data_endpoints: 64,
            max_table_bytes: MAX_FRAME - (64 << 10),
            check_sources: true,
        }
    }
}

/// Why a discovery server refused a request.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// The request acts for another node (or another life of it) than the connection's own.
    #[error(
        "{action} for {target} refused: this connection belongs to {caller}, and a member may \
         act only for itself"
    )]
    NotYours {
        /// `register`, `heartbeat` or `deregister`.
        action: &'static str,
        /// The node (and incarnation) the request named.
        target: String,
        /// Who the connection belongs to.
        caller: String,
    },
    /// The table holds `max` members already.
    #[error(
        "the membership table is full ({max} members); raise the limit or check for a registration storm"
    )]
    TooManyMembers {
        /// The limit.
        max: usize,
    },
    /// One announcement is out of bounds.
    #[error("announcement of {node} has {n} {what}, at most {max} are accepted")]
    Oversized {
        /// The announcing node.
        node: NodeId,
        /// What is too large (`bytes`, `attributes`, `data endpoints`).
        what: &'static str,
        /// How many.
        n: usize,
        /// The limit.
        max: usize,
    },
    /// The announcement names an address on another host than the connection comes from.
    #[error(
        "registration of {node} announces {address}, not an address of the host it comes from \
         ({source_ip}); a member announces only its own addresses (a multi-homed or NATed \
         member: announce the address it connects from, or turn the meta server's source \
         check off)"
    )]
    ForeignAddress {
        /// The announcing node.
        node: NodeId,
        /// The foreign address, as announced.
        address: String,
        /// The connection's source address.
        source_ip: std::net::IpAddr,
    },
    /// Admitting the announcement would make the members reply larger than a frame.
    #[error("the membership table would exceed {max} bytes, the largest members reply")]
    TableFull {
        /// The limit.
        max: usize,
    },
}

impl Refusal {
    /// True when the request acted for someone else (counted as an identity refusal).
    pub fn is_identity(&self) -> bool {
        matches!(self, Refusal::NotYours { .. })
    }

    /// A short label for the refusal counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NotYours { .. } => "not_yours",
            Refusal::TooManyMembers { .. } => "too_many_members",
            Refusal::Oversized { .. } => "oversized",
            Refusal::TableFull { .. } => "table_full",
            Refusal::ForeignAddress { .. } => "foreign_address",
        }
    }
}

/// Checks that `from` may send `req`: registrations, heartbeats and deregistrations only for
/// the node and incarnation the connection's handshake announced.
pub fn check_identity(from: &Peer, req: &DiscRequest) -> Result<(), Refusal> {
    let (action, node, incarnation): (&'static str, &NodeId, Incarnation) = match req {
        DiscRequest::Register(info) => ("register", &info.node, info.incarnation),
        DiscRequest::Heartbeat {
            node, incarnation, ..
        }
        | DiscRequest::Sync {
            node, incarnation, ..
        } => ("heartbeat", node, *incarnation),
        DiscRequest::Deregister { node, incarnation } => ("deregister", node, *incarnation),
        DiscRequest::Members => return Ok(()),
    };
    if from.is_life(node, incarnation) {
        return Ok(());
    }
    Err(Refusal::NotYours {
        action,
        target: format!("{node} (incarnation {:#x})", incarnation.0),
        caller: match &from.node {
            Some(n) => format!("{n} (incarnation {:#x})", from.incarnation.0),
            None => from.label(),
        },
    })
}

/// Checks that every address `info` announces (its host, control, meta and data endpoints,
/// and any attribute that is a socket address, such as the client endpoint) is on the host
/// the registration comes from: the connection's source address, or, when the source is an
/// address of this server's own host (`local`: loopback, or one this host can bind), any
/// address of this host — a member on this host may connect from one of its addresses and
/// announce another. A secret holder cannot point a member's entry at a third host.
pub fn check_sources(
    from: &Peer,
    info: &NodeInfo,
    local: &dyn Fn(std::net::IpAddr) -> bool,
) -> Result<(), Refusal> {
    let source = from.addr.ip().to_canonical();
    let same_host = local(source);
    let ours = |ip: std::net::IpAddr| {
        let ip = ip.to_canonical();
        ip == source || (same_host && local(ip))
    };
    let attrs = info
        .attrs
        .iter()
        .filter_map(|(_, v)| v.parse::<std::net::SocketAddr>().ok());
    let announced = std::iter::once(std::net::SocketAddr::new(info.host, 0))
        .chain(std::iter::once(info.control))
        .chain(info.meta)
        .chain(info.data.iter().copied())
        .chain(attrs);
    for addr in announced {
        if !ours(addr.ip()) {
            return Err(Refusal::ForeignAddress {
                node: info.node.clone(),
                address: if addr.port() == 0 {
                    addr.ip().to_string()
                } else {
                    addr.to_string()
                },
                source_ip: source,
            });
        }
    }
    Ok(())
}

/// Whether `ip` is an address of this host: loopback, or one a socket here can bind (one
/// syscall; registrations only, never heartbeats).
pub fn local_address(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Checks one announcement against `limits`; returns its encoded size.
pub fn check_info(info: &NodeInfo, limits: &Limits) -> Result<usize, Refusal> {
    let oversized = |what, n, max| Refusal::Oversized {
        node: info.node.clone(),
        what,
        n,
        max,
    };
    if info.attrs.len() > limits.max_attrs {
        return Err(oversized("attributes", info.attrs.len(), limits.max_attrs));
    }
    if info.data.len() > limits.max_data_endpoints {
        return Err(oversized(
            "data endpoints",
            info.data.len(),
            limits.max_data_endpoints,
        ));
    }
    let bytes = postcard::to_allocvec(info).map_or(usize::MAX, |v| v.len());
    if bytes > limits.max_info_bytes {
        return Err(oversized("bytes", bytes, limits.max_info_bytes));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(addr: &str) -> Peer {
        Peer {
            node: None,
            incarnation: Incarnation(1),
            addr: addr.parse().unwrap(),
            authenticated: true,
            grant: peercache_wire::auth::Grant::Full,
            verified: false,
        }
    }

    fn at(host: &str) -> NodeInfo {
        NodeInfo {
            node: NodeId::new("n").unwrap(),
            incarnation: Incarnation(1),
            host: host.parse().unwrap(),
            meta: Some(format!("{host}:31998").parse().unwrap()),
            control: format!("{host}:1").parse().unwrap(),
            data: vec![format!("{host}:2").parse().unwrap()],
            role: "inference".into(),
            attrs: vec![
                ("client".into(), format!("{host}:3")),
                ("rank".into(), "0".into()),
            ],
        }
    }

    /// This test's host: loopback and 10.0.0.1–10.0.0.3.
    fn local(ip: std::net::IpAddr) -> bool {
        ip.is_loopback()
            || matches!(ip, std::net::IpAddr::V4(v) if v.octets()[..3] == [10, 0, 0] && (1..=3).contains(&v.octets()[3]))
    }

    fn check(src: &str, info: &NodeInfo) -> Result<(), Refusal> {
        check_sources(&from(src), info, &local)
    }

    #[test]
    fn a_member_announces_only_addresses_of_the_host_it_comes_from() {
        assert_eq!(check("192.0.2.1:5000", &at("192.0.2.1")), Ok(()));
        // An IPv4 source seen through an IPv6 socket is the same host.
        assert_eq!(check("[::ffff:192.0.2.1]:5000", &at("192.0.2.1")), Ok(()));
        // From this host, any address of this host: loopback, or another local interface.
        assert_eq!(check("127.0.0.1:5000", &at("127.0.0.5")), Ok(()));
        assert_eq!(check("10.0.0.1:5000", &at("10.0.0.2")), Ok(()));
        assert_eq!(check("127.0.0.1:5000", &at("10.0.0.3")), Ok(()));
        let refused = |info: &NodeInfo, src| match check(src, info) {
            Err(Refusal::ForeignAddress { address, .. }) => address,
            other => panic!("{other:?}"),
        };
        // From another host, only that host's own address.
        assert_eq!(refused(&at("192.0.2.2"), "192.0.2.1:5000"), "192.0.2.2");
        assert_eq!(refused(&at("10.0.0.1"), "192.0.2.1:5000"), "10.0.0.1");
        // From this host, not a third host's.
        assert_eq!(refused(&at("192.0.2.2"), "10.0.0.1:5000"), "192.0.2.2");
        let mut one_rail = at("192.0.2.1");
        one_rail.data.push("192.0.2.9:2".parse().unwrap());
        assert_eq!(refused(&one_rail, "192.0.2.1:5000"), "192.0.2.9:2");
        let mut meta = at("192.0.2.1");
        meta.meta = Some("192.0.2.9:31998".parse().unwrap());
        assert_eq!(refused(&meta, "192.0.2.1:5000"), "192.0.2.9:31998");
        let mut client = at("192.0.2.1");
        client.attrs[0].1 = "192.0.2.9:3".into();
        assert_eq!(refused(&client, "192.0.2.1:5000"), "192.0.2.9:3");
    }

    #[test]
    fn this_hosts_addresses_are_local_and_a_documentation_address_is_not() {
        assert!(local_address("127.0.0.1".parse().unwrap()));
        assert!(local_address("127.0.0.77".parse().unwrap()));
        assert!(!local_address("192.0.2.77".parse().unwrap()));
    }
}

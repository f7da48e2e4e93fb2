//! The etcd membership as data, without I/O: where a member's key lives, what its value holds,
//! which values are refused, and how a snapshot or a watch event changes the view.
//!
//! A member writes one key, `<prefix>/members/<node id>`, holding its [`NodeInfo`] as JSON
//! (readable with `etcdctl get --prefix <prefix>/members/`), attached to its lease. A value is
//! admitted only if it decodes, names the node its key names, and stays inside the same
//! [`Limits`] a discovery server applies; anything else is refused and counted, never half
//! applied.

use std::collections::BTreeMap;

use peercache_wire::NodeId;

use crate::admission::{Limits, Refusal, check_info};
use crate::client_core::Event;
use crate::info::NodeInfo;

/// Why a key or value under the members prefix was not admitted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The key is not `<prefix>/members/<valid node id>`.
    #[error("key {0:?} is not a member key")]
    Key(String),
    /// The value is not a member announcement.
    #[error("value of {key:?} is not a member announcement: {why}")]
    Malformed {
        /// The key.
        key: String,
        /// The decoder's complaint.
        why: String,
    },
    /// The announcement names another node than its key.
    #[error("key {key:?} holds the announcement of {node}: a member may write only its own key")]
    NotYours {
        /// The key.
        key: String,
        /// The node the value names.
        node: NodeId,
    },
    /// Past the bounds a discovery server applies too.
    #[error(transparent)]
    Limits(#[from] Refusal),
}

impl Refused {
    /// The `reason` label of `peercache_discovery_refused_total`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refused::Key(_) | Refused::Malformed { .. } => "malformed",
            Refused::NotYours { .. } => "not_yours",
            Refused::Limits(r) => r.reason(),
        }
    }
}

/// `<prefix>/members/`: the range every member key lives in.
pub(crate) fn members_prefix(clean_prefix: &str) -> String {
    format!("{clean_prefix}/members/")
}

/// The key `node` writes.
pub(crate) fn member_key(clean_prefix: &str, node: &NodeId) -> String {
    format!("{}{}", members_prefix(clean_prefix), node.as_str())
}

/// The value a member writes.
pub(crate) fn encode(info: &NodeInfo) -> Vec<u8> {
    // A NodeInfo is plain data (strings, numbers, addresses): it always serializes.
    serde_json::to_vec(info).unwrap_or_default()
}

/// The node a member key names.
pub(crate) fn node_of(members_prefix: &str, key: &[u8]) -> Result<NodeId, Refused> {
    let text = String::from_utf8_lossy(key);
    let bad = || Refused::Key(text.chars().take(200).collect());
    let id = text.strip_prefix(members_prefix).ok_or_else(bad)?;
    NodeId::new(id).map_err(|_| bad())
}

/// Decodes and admits one member's key and value.
pub(crate) fn decode(
    members_prefix: &str,
    key: &[u8],
    value: &[u8],
    limits: &Limits,
) -> Result<NodeInfo, Refused> {
    let node = node_of(members_prefix, key)?;
    let key_text = || String::from_utf8_lossy(key).into_owned();
    // Bound the work before parsing: JSON is a little larger than the postcard bound.
    if value.len() > limits.max_info_bytes * 4 {
        return Err(Refusal::Oversized {
            node,
            what: "bytes",
            n: value.len(),
            max: limits.max_info_bytes * 4,
        }
        .into());
    }
    let info: NodeInfo = serde_json::from_slice(value).map_err(|e| Refused::Malformed {
        key: key_text(),
        why: e.to_string(),
    })?;
    if info.node != node {
        return Err(Refused::NotYours {
            key: key_text(),
            node: info.node,
        });
    }
    check_info(&info, limits)?;
    Ok(info)
}

/// The members as etcd last told them, and the events each change makes.
#[derive(Debug, Default)]
pub(crate) struct View {
    members: BTreeMap<NodeId, NodeInfo>,
    limits: Limits,
}

impl View {
    /// An empty view admitting up to `limits`.
    pub(crate) fn new(limits: Limits) -> Self {
        View {
            members: BTreeMap::new(),
            limits,
        }
    }

    /// The admission limits.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Members, in id order.
    pub(crate) fn members(&self) -> Vec<NodeInfo> {
        self.members.values().cloned().collect()
    }

    /// Replaces the view with a full listing; returns what changed.
    pub(crate) fn replace(&mut self, listing: Vec<NodeInfo>) -> Vec<Event> {
        let mut next: BTreeMap<NodeId, NodeInfo> = BTreeMap::new();
        for info in listing.into_iter().take(self.limits.max_members) {
            next.insert(info.node.clone(), info);
        }
        let mut events = Vec::new();
        for (id, old) in &self.members {
            if next
                .get(id)
                .is_none_or(|n| n.incarnation != old.incarnation)
            {
                events.push(Event::Left(old.clone()));
            }
        }
        for (id, new) in &next {
            if self
                .members
                .get(id)
                .is_none_or(|o| o.incarnation != new.incarnation)
            {
                events.push(Event::Joined(new.clone()));
            }
        }
        self.members = next;
        events
    }

    /// A member's key was written. A new incarnation replaces the old one (it left); a new
    /// member past `max_members` is refused.
    pub(crate) fn put(&mut self, info: NodeInfo) -> Result<Vec<Event>, Refused> {
        match self.members.get(&info.node) {
            Some(old) if old.incarnation == info.incarnation => {
                self.members.insert(info.node.clone(), info);
                Ok(Vec::new())
            }
            Some(old) => {
                let left = Event::Left(old.clone());
                self.members.insert(info.node.clone(), info.clone());
                Ok(vec![left, Event::Joined(info)])
            }
            None if self.members.len() >= self.limits.max_members => Err(Refusal::TooManyMembers {
                max: self.limits.max_members,
            }
            .into()),
            None => {
                self.members.insert(info.node.clone(), info.clone());
                Ok(vec![Event::Joined(info)])
            }
        }
    }

    /// A member's key was deleted (revoked at a clean stop, or its lease expired).
    pub(crate) fn delete(&mut self, node: &NodeId) -> Vec<Event> {
        self.members
            .remove(node)
            .map(Event::Left)
            .into_iter()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};

    use peercache_wire::Incarnation;

    use super::*;

    fn info(name: &str, life: u64) -> NodeInfo {
        let host = IpAddr::from([127, 0, 0, 1]);
        NodeInfo {
            node: NodeId::new(name).unwrap(),
            incarnation: Incarnation(life),
            host,
            meta: None,
            control: SocketAddr::new(host, 7000),
            data: vec![SocketAddr::new(host, 7001)],
            role: "inference".into(),
            attrs: vec![("tp_rank".into(), "0".into())],
        }
    }

    const P: &str = "/pc/members/";

    #[test]
    fn a_member_value_round_trips_under_its_own_key() {
        let a = info("node-a", 7);
        let key = member_key("/pc", &a.node);
        assert_eq!(key, "/pc/members/node-a");
        let got = decode(P, key.as_bytes(), &encode(&a), &Limits::default()).unwrap();
        assert_eq!(got, a);
    }

    #[test]
    fn a_value_under_another_members_key_is_refused() {
        let a = info("node-a", 7);
        let err = decode(P, b"/pc/members/node-b", &encode(&a), &Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "not_yours");
        assert!(err.to_string().contains("only its own key"), "{err}");
    }

    #[test]
    fn garbage_keys_and_values_are_refused_as_malformed() {
        let l = Limits::default();
        for (k, v) in [
            (&b"/pc/other/node-a"[..], &b"{}"[..]),
            (b"/pc/members/", b"{}"),
            (b"/pc/members/node-a", b"not json"),
            (b"/pc/members/node-a", b"{\"node\": 5}"),
            (b"/pc/members/node-a", &[0xff, 0xfe, 0x00][..]),
        ] {
            let err = decode(P, k, v, &l).unwrap_err();
            assert_eq!(err.reason(), "malformed", "{err}");
        }
    }

    #[test]
    fn announcements_past_the_servers_limits_are_refused() {
        let mut a = info("node-a", 1);
        a.attrs = (0..100).map(|i| (format!("k{i}"), "v".into())).collect();
        let err = decode(P, b"/pc/members/node-a", &encode(&a), &Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "oversized");
        let huge = vec![b' '; Limits::default().max_info_bytes * 4 + 1];
        let err = decode(P, b"/pc/members/node-a", &huge, &Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "oversized");
    }

    #[test]
    fn puts_deletes_and_listings_make_the_events_a_master_would() {
        let mut v = View::new(Limits::default());
        assert_eq!(
            v.put(info("a", 1)).unwrap(),
            vec![Event::Joined(info("a", 1))]
        );
        // The same life written again (a re-put after a reconnect) changes nothing.
        assert!(v.put(info("a", 1)).unwrap().is_empty());
        // A restarted process: the old life left, the new one joined.
        assert_eq!(
            v.put(info("a", 2)).unwrap(),
            vec![Event::Left(info("a", 1)), Event::Joined(info("a", 2))]
        );
        v.put(info("b", 1)).unwrap();
        assert_eq!(
            v.delete(&NodeId::new("b").unwrap()),
            vec![Event::Left(info("b", 1))]
        );
        assert!(v.delete(&NodeId::new("b").unwrap()).is_empty());
        // A listing after a reconnect: c appeared, a restarted, nothing else.
        let ev = v.replace(vec![info("a", 3), info("c", 1)]);
        assert_eq!(
            ev,
            vec![
                Event::Left(info("a", 2)),
                Event::Joined(info("a", 3)),
                Event::Joined(info("c", 1))
            ]
        );
        assert_eq!(v.members(), vec![info("a", 3), info("c", 1)]);
    }

    #[test]
    fn the_view_never_grows_past_max_members() {
        let mut v = View::new(Limits {
            max_members: 2,
            ..Limits::default()
        });
        v.put(info("a", 1)).unwrap();
        v.put(info("b", 1)).unwrap();
        let err = v.put(info("c", 1)).unwrap_err();
        assert_eq!(err.reason(), "too_many_members");
        v.replace(vec![info("a", 1), info("b", 1), info("c", 1)]);
        assert_eq!(v.members().len(), 2);
    }
}

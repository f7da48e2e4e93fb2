//! What a member announces about itself, and how a stable identity is derived.

use std::net::{IpAddr, SocketAddr};

use peercache_wire::{Incarnation, NodeId, WireError};
use serde::{Deserialize, Serialize};

/// A member's announcement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Stable id.
    pub node: NodeId,
    /// This life of the process.
    pub incarnation: Incarnation,
    /// The host address (master order compares these as addresses).
    pub host: IpAddr,
    /// The discovery server this node hosts, if it won the meta port.
    pub meta: Option<SocketAddr>,
    /// Control endpoint (directory and store RPCs).
    pub control: SocketAddr,
    /// Data endpoints, one per rail.
    pub data: Vec<SocketAddr>,
    /// `inference` or `storage`.
    pub role: String,
    /// Free-form attributes later versions add (old readers keep them).
    pub attrs: Vec<(String, String)>,
}

/// Derives a stable node id from where and what the node is: never from ephemeral ports or
/// randomness, so a restarted node finds its disk-tier data again.
pub fn derive_node_id(
    host: &str,
    meta_port: u16,
    tp: u32,
    pp: u32,
    dp: u32,
    prefix: &str,
) -> Result<NodeId, WireError> {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    let mut id = String::new();
    if !prefix.is_empty() {
        id.push_str(&clean(prefix));
        id.push('@');
    }
    id.push_str(&clean(host));
    id.push_str(&format!(":{meta_port}:tp{tp}pp{pp}dp{dp}"));
    NodeId::new(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_rank_specific() {
        let a = derive_node_id("10.0.0.2", 31998, 0, 0, 0, "").unwrap();
        assert_eq!(a.as_str(), "10.0.0.2:31998:tp0pp0dp0");
        assert_eq!(a, derive_node_id("10.0.0.2", 31998, 0, 0, 0, "").unwrap());
        assert_ne!(a, derive_node_id("10.0.0.2", 31998, 1, 0, 0, "").unwrap());
        let p = derive_node_id("gpu node/7", 31998, 0, 1, 0, "tenant a").unwrap();
        assert_eq!(p.as_str(), "tenant-a@gpu-node-7:31998:tp0pp1dp0");
    }
}

//! Slotmap mode's directory-free placement data: the slot region each member announces in
//! discovery (its [`Layout`]), encoded as one attribute.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use peercache_pool::slotmap::Geometry;
use peercache_wire::NodeId;

pub(crate) const LAYOUT_ATTR: &str = "slotmap";

/// Where a peer's slotmap region is.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    pub(crate) data: SocketAddr,
    pub(crate) control: SocketAddr,
    pub(crate) region: u64,
    pub(crate) base: u64,
    pub(crate) geo: Geometry,
}

/// `region:base:max_page:ways:buckets`.
pub(crate) fn encode_layout(region: u64, base: u64, g: &Geometry) -> String {
    format!("{region}:{base}:{}:{}:{}", g.max_page, g.ways, g.buckets)
}

fn decode_layout(s: &str) -> Option<(u64, u64, Geometry)> {
    let p: Vec<u64> = s
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let [region, base, max_page, ways, buckets] = p[..] else {
        return None;
    };
    // The announced geometry, checked the way the owner built it.
    let mut g = Geometry::new(
        u32::try_from(max_page).ok()?,
        u32::try_from(ways).ok()?,
        0,
        u64::MAX / 2,
    )
    .ok()?;
    if buckets == 0 {
        return None;
    }
    g.buckets = buckets;
    Some((region, base, g))
}

/// The layouts of the members that announce one.
pub(crate) fn layouts(members: &[peercache_discovery::NodeInfo]) -> HashMap<NodeId, Layout> {
    members
        .iter()
        .filter_map(|m| {
            let attr = m.attrs.iter().find(|(k, _)| k == LAYOUT_ATTR)?;
            let (region, base, geo) = decode_layout(&attr.1)?;
            Some((
                m.node.clone(),
                Layout {
                    data: *m.data.first()?,
                    control: m.control,
                    region,
                    base,
                    geo,
                },
            ))
        })
        .collect()
}

/// A shared handle to the layouts (swapped whole on membership changes).
pub(crate) type Layouts = Arc<HashMap<NodeId, Layout>>;

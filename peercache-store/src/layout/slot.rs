//! Slotmap mode's directory-free placement data: the slot region each member announces in
//! discovery (its layout), encoded as one attribute, and the bounds a reader holds an announced
//! layout to before it sizes anything by it ([`decode_layout`]).

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

/// Largest associativity a layout may announce (what `slot_ways` accepts).
pub const MAX_WAYS: u32 = 64;
/// Smallest and largest slot payload a layout may announce (what `slot_max_page_bytes`
/// accepts).
pub const PAGE_BYTES: std::ops::RangeInclusive<u32> = 64..=(1 << 30);
/// Largest slot region a layout may announce: more memory than any host has.
pub const MAX_REGION_BYTES: u64 = 1 << 48;

/// Why an announced layout was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// Not `region:base:max_page:ways:buckets` in decimal.
    #[error("slotmap layout {0:?} is not region:base:max_page:ways:buckets")]
    Syntax(String),
    /// A field outside what this node's own configuration would accept.
    #[error("slotmap layout field {field} = {value} is outside {allowed}")]
    OutOfBounds {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What is accepted.
        allowed: String,
    },
}

/// Decodes an announced layout into `(region, base, geometry)`, refusing one this node's own
/// configuration could not have produced: ways in `1..=MAX_WAYS`, payload in [`PAGE_BYTES`],
/// at least one bucket, a region of at most [`MAX_REGION_BYTES`] that does not wrap the address
/// space. Everything a reader sizes by a layout (header blocks, scratch, op lengths) is then
/// bounded: a header block is at most `MAX_WAYS × 64` bytes.
///
/// ```
/// use peercache_store::layout::slot::{decode_layout, LayoutError};
/// let (region, base, geo) = decode_layout("7:4096:65536:4:1024").unwrap();
/// assert_eq!((region, base, geo.ways, geo.buckets), (7, 4096, 4, 1024));
/// assert!(matches!(decode_layout("7:0:65536:100000:1"), Err(LayoutError::OutOfBounds { field: "ways", .. })));
/// assert!(matches!(decode_layout("7:0:65536:4"), Err(LayoutError::Syntax(_))));
/// ```
pub fn decode_layout(s: &str) -> Result<(u64, u64, Geometry), LayoutError> {
    let syntax = || LayoutError::Syntax(s.chars().take(64).collect());
    let p: Vec<u64> = s
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()
        .ok_or_else(syntax)?;
    let [region, base, max_page, ways, buckets] = p[..] else {
        return Err(syntax());
    };
    let out = |field, value, allowed: String| LayoutError::OutOfBounds {
        field,
        value,
        allowed,
    };
    if !(1..=u64::from(MAX_WAYS)).contains(&ways) {
        return Err(out("ways", ways, format!("1..={MAX_WAYS}")));
    }
    if !(u64::from(*PAGE_BYTES.start())..=u64::from(*PAGE_BYTES.end())).contains(&max_page) {
        return Err(out("max_page", max_page, format!("{PAGE_BYTES:?}")));
    }
    if buckets == 0 {
        return Err(out("buckets", 0, "at least 1".into()));
    }
    // The announced geometry, built the way the owner built it (the region bound checked
    // below, without overflow).
    let mut g = Geometry::new(max_page as u32, ways as u32, 0, u64::MAX / 2)
        .map_err(|_| out("max_page", max_page, format!("{PAGE_BYTES:?}")))?;
    let region_len = buckets
        .checked_mul(g.bucket_stride())
        .filter(|l| *l <= MAX_REGION_BYTES)
        .ok_or_else(|| {
            out(
                "buckets",
                buckets,
                format!("a region of at most {MAX_REGION_BYTES} bytes"),
            )
        })?;
    if base.checked_add(region_len).is_none() {
        return Err(out(
            "base",
            base,
            "an address the region does not wrap past".into(),
        ));
    }
    g.buckets = buckets;
    Ok((region, base, g))
}

/// A member whose announced layout was refused.
#[derive(Clone, Debug)]
pub(crate) struct Refused {
    pub(crate) node: NodeId,
    pub(crate) error: LayoutError,
}

/// The layouts of the members that announce a valid one, and the members whose layout was
/// refused (their keys are misses).
pub(crate) fn layouts(
    members: &[peercache_discovery::NodeInfo],
) -> (HashMap<NodeId, Layout>, Vec<Refused>) {
    let mut refused = Vec::new();
    let good = members
        .iter()
        .filter_map(|m| {
            let attr = m.attrs.iter().find(|(k, _)| k == LAYOUT_ATTR)?;
            let (region, base, geo) = match decode_layout(&attr.1) {
                Ok(l) => l,
                Err(error) => {
                    refused.push(Refused {
                        node: m.node.clone(),
                        error,
                    });
                    return None;
                }
            };
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
        .collect();
    (good, refused)
}

/// A shared handle to the layouts (swapped whole on membership changes).
pub(crate) type Layouts = Arc<HashMap<NodeId, Layout>>;

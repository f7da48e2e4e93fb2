//! Directory messages on the wire (kinds `0x02xx`). Version-1 fixtures live in
//! `tests/fixtures/v1/`.

use std::borrow::Cow;

use peercache_wire::envelope::{Envelope, Extension, Message};
use peercache_wire::{Layout, NodeId, PageKey, WireError};
use serde::{Deserialize, Serialize};

use crate::holding::KeyHolders;
use crate::location::{Location, Owners};
use crate::shard::InsertOutcome;

/// Identifies one owner's copy for removal or demotion to disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRef {
    /// Page key.
    pub key: PageKey,
    /// Owner.
    pub node: NodeId,
    /// Only this generation (None: any).
    pub generation: Option<u64>,
}

/// A request to a directory shard. Borrowed on the sending side, owned when decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirRequest<'a> {
    /// Record locations.
    Insert(Cow<'a, [(PageKey, Location)]>),
    /// Owners of keys.
    Lookup(Cow<'a, [PageKey]>),
    /// Presence of keys.
    Exists(Cow<'a, [PageKey]>),
    /// Remove owners' copies.
    Remove(Cow<'a, [OwnerRef]>),
    /// Mark owners' copies disk-only.
    MarkNonResident(Cow<'a, [OwnerRef]>),
    /// Entries handed off after a ring change.
    Handoff(Cow<'a, [(PageKey, Owners)]>),
}

impl Message for DirRequest<'_> {
    const KIND: u16 = 0x0201;
    const NAME: &'static str = "DirRequest";
}

/// A shard's reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirReply {
    /// One outcome per inserted entry.
    Inserted(Vec<InsertOutcome>),
    /// One owner list per looked-up key.
    Found(Vec<Option<Owners>>),
    /// One flag per key.
    Exists(Vec<bool>),
    /// How many items changed something.
    Applied(u32),
    /// Which nodes hold each looked-up key (the answer to a [`DirRequest::Lookup`] that
    /// carries [`EXT_HOLDERS_ONLY`]).
    Holders(KeyHolders),
}

impl Message for DirReply {
    const KIND: u16 = 0x0202;
    const NAME: &'static str = "DirReply";
}

/// Extension of a [`DirReply::Found`] or [`DirReply::Exists`] reply (not critical: a reader
/// that does not know it sees plain misses): keys this shard gained in the last ring change and
/// is still receiving by hand-off, each with the member that held it before and keeps it until
/// the hand-off is done — ask that one. Payload: a postcard [`Moving`].
pub const EXT_MOVING: u16 = 0x0201;

/// Extension of a [`DirRequest::Handoff`] (not critical: an older shard ignores it): how many
/// more entries the sender will hand this shard after this request, for the ring change it is
/// handing off. A shard keeps answering [`EXT_MOVING`] until every sender reached 0. Payload:
/// a postcard `u64`.
pub const EXT_HANDOFF_MORE: u16 = 0x0202;

/// Extension of a [`DirRequest::Lookup`] (not critical): answer [`DirReply::Holders`] — each
/// key's holders and whether their copies are in memory, without the locations — instead of
/// [`DirReply::Found`]. A shard of a release before it ignores the extension and answers
/// `Found`, which the asker folds into holders itself. Payload: a postcard `u8` (1).
pub const EXT_HOLDERS_ONLY: u16 = 0x0204;

/// The payload of [`EXT_MOVING`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moving {
    /// (index of the key in the request, member that held it before the ring change).
    pub keys: Vec<(u32, NodeId)>,
}

/// Extension of a [`DirRequest::Insert`], a [`DirRequest::Handoff`] and a [`DirReply::Found`]
/// (not critical): the layout fingerprint ([`Location::layout`]) of every location the message
/// carries, in order — a hand-off's and a reply's owners flattened key by key — run-length
/// coded. Sent only when some location has a layout. A member of a release before layouts
/// skips it and sees [`Layout::NONE`] everywhere, which a reader that declared a layout treats
/// as another layout (a miss, never bytes). Payload: a postcard [`LayoutRuns`].
pub const EXT_LAYOUTS: u16 = 0x0203;

/// The payload of [`EXT_LAYOUTS`]: `(count, layout)` runs covering a message's locations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRuns {
    /// Consecutive locations sharing one layout.
    pub runs: Vec<(u32, Layout)>,
}

impl LayoutRuns {
    /// The runs of `locs`' layouts.
    pub fn of<'a>(locs: impl IntoIterator<Item = &'a Location>) -> LayoutRuns {
        let mut runs: Vec<(u32, Layout)> = Vec::new();
        for l in locs {
            match runs.last_mut() {
                Some((n, layout)) if *layout == l.layout && *n < u32::MAX => *n += 1,
                _ => runs.push((1, l.layout)),
            }
        }
        LayoutRuns { runs }
    }

    /// True when every location has [`Layout::NONE`] (nothing worth sending).
    pub fn all_none(&self) -> bool {
        self.runs.iter().all(|(_, l)| l.is_none())
    }

    /// Sets each of `locs`' layouts from the runs; refused (and nothing set) unless the runs
    /// cover exactly as many locations as there are.
    pub fn apply<'a>(
        &self,
        locs: impl IntoIterator<Item = &'a mut Location>,
    ) -> Result<(), WireError> {
        let locs: Vec<&mut Location> = locs.into_iter().collect();
        let covered: u64 = self.runs.iter().map(|(n, _)| u64::from(*n)).sum();
        if covered != locs.len() as u64 {
            return Err(WireError::Malformed {
                what: "layout runs",
                detail: format!("cover {covered} locations of {}", locs.len()),
            });
        }
        let each = self
            .runs
            .iter()
            .flat_map(|&(n, l)| std::iter::repeat_n(l, n as usize));
        for (loc, l) in locs.into_iter().zip(each) {
            loc.layout = l;
        }
        Ok(())
    }

    /// The [`EXT_LAYOUTS`] extension for `locs`, or none when no location has a layout (for
    /// a message that lists locations in its own way).
    pub fn extension_of<'a>(
        locs: impl IntoIterator<Item = &'a Location>,
    ) -> Result<Option<Extension>, WireError> {
        let runs = LayoutRuns::of(locs);
        if runs.all_none() {
            return Ok(None);
        }
        Extension::of(EXT_LAYOUTS, &runs).map(Some)
    }

    /// The [`EXT_LAYOUTS`] extension for `msg`'s locations, or none when no location has a
    /// layout.
    pub fn extension(msg: &impl Locations) -> Result<Option<Extension>, WireError> {
        if !msg.any_layout() {
            return Ok(None);
        }
        Self::extension_of(msg.locations())
    }

    /// Sets `msg`'s layouts from `env`'s [`EXT_LAYOUTS`], if it has one.
    pub fn read(env: &Envelope<'_>, msg: &mut impl Locations) -> Result<(), WireError> {
        match env.extension_value::<LayoutRuns>(EXT_LAYOUTS)? {
            Some(runs) => runs.apply(msg.locations_mut()),
            None => Ok(()),
        }
    }
}

/// Every location a message carries, in [`EXT_LAYOUTS`] order.
pub trait Locations {
    /// The locations, in order.
    fn locations(&self) -> Vec<&Location>;
    /// Whether some location has a layout (no allocation: the common case of none sends
    /// nothing).
    fn any_layout(&self) -> bool;
    /// The locations, in order, to set their layouts.
    fn locations_mut(&mut self) -> Vec<&mut Location>;
}

impl Locations for DirRequest<'_> {
    fn any_layout(&self) -> bool {
        match self {
            DirRequest::Insert(e) => e.iter().any(|(_, l)| !l.layout.is_none()),
            DirRequest::Handoff(e) => e.iter().any(|(_, o)| o.iter().any(|l| !l.layout.is_none())),
            _ => false,
        }
    }

    fn locations(&self) -> Vec<&Location> {
        match self {
            DirRequest::Insert(e) => e.iter().map(|(_, l)| l).collect(),
            DirRequest::Handoff(e) => e.iter().flat_map(|(_, o)| o.iter()).collect(),
            _ => Vec::new(),
        }
    }

    fn locations_mut(&mut self) -> Vec<&mut Location> {
        match self {
            DirRequest::Insert(e) => e.to_mut().iter_mut().map(|(_, l)| l).collect(),
            DirRequest::Handoff(e) => e
                .to_mut()
                .iter_mut()
                .flat_map(|(_, o)| o.iter_mut())
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl Locations for DirReply {
    fn any_layout(&self) -> bool {
        match self {
            DirReply::Found(v) => v
                .iter()
                .flatten()
                .any(|o| o.iter().any(|l| !l.layout.is_none())),
            _ => false,
        }
    }

    fn locations(&self) -> Vec<&Location> {
        match self {
            DirReply::Found(v) => v.iter().flatten().flat_map(|o| o.iter()).collect(),
            _ => Vec::new(),
        }
    }

    fn locations_mut(&mut self) -> Vec<&mut Location> {
        match self {
            DirReply::Found(v) => v.iter_mut().flatten().flat_map(|o| o.iter_mut()).collect(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(layout: u64) -> Location {
        Location {
            layout: Layout(layout),
            ..crate::location::sample("n", 1, 1)
        }
    }

    #[test]
    fn runs_round_trip_and_refuse_a_wrong_count() {
        let locs = [at(5), at(5), at(0), at(7), at(7), at(7)];
        let runs = LayoutRuns::of(&locs);
        assert_eq!(
            runs.runs,
            vec![(2, Layout(5)), (1, Layout::NONE), (3, Layout(7))]
        );
        let mut copy: Vec<Location> = locs
            .iter()
            .map(|l| Location {
                layout: Layout::NONE,
                ..l.clone()
            })
            .collect();
        runs.apply(copy.iter_mut()).unwrap();
        assert_eq!(copy, locs);
        // Too few or too many covered: refused, nothing set.
        let mut short = vec![at(0); 5];
        assert!(matches!(
            runs.apply(short.iter_mut()),
            Err(WireError::Malformed { .. })
        ));
        assert!(short.iter().all(|l| l.layout.is_none()));
        let mut long = vec![at(0); 7];
        assert!(runs.apply(long.iter_mut()).is_err());
        // Counts summed in 64 bits: runs claiming u32::MAX twice do not wrap to a small total.
        let huge = LayoutRuns {
            runs: vec![(u32::MAX, Layout(1)), (2, Layout(1))],
        };
        let mut one = [at(0)];
        assert!(huge.apply(one.iter_mut()).is_err());
        assert!(LayoutRuns::of(&[at(0), at(0)]).all_none());
        let k = PageKey::from_key("k");
        let plain = DirRequest::Insert(vec![(k, at(0))].into());
        assert!(LayoutRuns::extension(&plain).unwrap().is_none());
        let laid = DirRequest::Insert(vec![(k, at(3))].into());
        assert!(LayoutRuns::extension(&laid).unwrap().is_some());
    }
}

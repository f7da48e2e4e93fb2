//! Which nodes hold a batch of keys, without their locations: the compact answer a router's
//! prefix query needs. One node table per batch and, per key, its copies as indices into it —
//! a few bytes per key on the wire instead of a full [`crate::Location`] per copy.

use peercache_wire::{NodeId, WireError};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// One key's holders: every node with a live copy, and whether that copy is in memory (`false`:
/// on its disk tier only). Empty: nobody holds the key.
pub type Holding = SmallVec<[(NodeId, bool); 3]>;

/// The holders of a batch of keys, in the batch's order (the payload of
/// [`crate::DirReply::Holders`]).
///
/// ```
/// use peercache_directory::KeyHolders;
/// use peercache_wire::NodeId;
///
/// let (a, b) = (NodeId::new("a").unwrap(), NodeId::new("b").unwrap());
/// let mut h = KeyHolders::default();
/// h.push_key([(&a, true), (&b, false)]);
/// h.push_key([]);
/// h.push_key([(&b, true)]);
/// let keys = h.into_holdings(3).unwrap();
/// assert_eq!(keys[0].as_slice(), &[(a.clone(), true), (b.clone(), false)]);
/// assert!(keys[1].is_empty());
/// assert_eq!(keys[2].as_slice(), &[(b, true)]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyHolders {
    /// The distinct nodes the batch's copies name.
    pub nodes: Vec<NodeId>,
    /// Per key, where its copies end in `copies` (non-decreasing; the last is `copies.len()`).
    pub ends: Vec<u32>,
    /// Per copy: its node's index in `nodes`, shifted left once, ORed with 1 when resident.
    pub copies: Vec<u32>,
}

impl KeyHolders {
    /// Appends one key with its holders.
    pub fn push_key<'a>(&mut self, holders: impl IntoIterator<Item = (&'a NodeId, bool)>) {
        for (node, resident) in holders {
            let at = match self.nodes.iter().position(|n| n == node) {
                Some(at) => at,
                None => {
                    self.nodes.push(node.clone());
                    self.nodes.len() - 1
                }
            };
            self.copies.push(((at as u32) << 1) | u32::from(resident));
        }
        self.ends.push(self.copies.len() as u32);
    }

    /// Keys in the batch.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when the batch has no key.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// How many copies key `i` has (0 for a key past the batch).
    pub fn copies_of(&self, i: usize) -> usize {
        let start = i.checked_sub(1).and_then(|p| self.ends.get(p)).copied();
        match self.ends.get(i) {
            Some(&end) => (end as usize).saturating_sub(start.unwrap_or(0) as usize),
            None => 0,
        }
    }

    /// Checks a decoded batch of `keys` keys: the same number of keys, ends that never go
    /// backwards and cover every copy, and copies that name nodes of the table. A batch that
    /// passes can be read with [`Self::copies`] without a bounds failure.
    ///
    /// # Errors
    /// [`WireError::Malformed`] naming the first fault — a reply from a broken or hostile shard
    /// is refused whole, never read out of bounds.
    pub fn check(&self, keys: usize) -> Result<(), WireError> {
        let bad = |detail: String| WireError::Malformed {
            what: "key holders",
            detail,
        };
        if self.ends.len() != keys {
            return Err(bad(format!("{} keys answered of {keys}", self.ends.len())));
        }
        if self.ends.last().map_or(0, |&e| e as usize) != self.copies.len() {
            return Err(bad(format!(
                "ends do not cover {} copies",
                self.copies.len()
            )));
        }
        let mut start = 0usize;
        for &end in &self.ends {
            let end = end as usize;
            if end < start || end > self.copies.len() {
                return Err(bad(format!(
                    "copies {start}..{end} outside 0..{}",
                    self.copies.len()
                )));
            }
            start = end;
        }
        if let Some(&c) = self
            .copies
            .iter()
            .find(|&&c| (c >> 1) as usize >= self.nodes.len())
        {
            return Err(bad(format!(
                "copy names node {} of {}",
                c >> 1,
                self.nodes.len()
            )));
        }
        Ok(())
    }

    /// Key `i`'s copies, each its node's index in [`Self::nodes`] shifted left once, ORed with
    /// 1 when resident (empty for a key past the batch or of a batch [`Self::check`] refuses).
    pub fn copies(&self, i: usize) -> &[u32] {
        let start = i
            .checked_sub(1)
            .and_then(|p| self.ends.get(p))
            .map_or(0, |&s| s as usize);
        let end = self.ends.get(i).map_or(start, |&e| e as usize);
        self.copies.get(start..end).unwrap_or(&[])
    }

    /// Checks a decoded batch of `keys` keys ([`Self::check`]) and splits it into one
    /// [`Holding`] per key.
    ///
    /// # Errors
    /// [`WireError::Malformed`], as [`Self::check`].
    pub fn into_holdings(self, keys: usize) -> Result<Vec<Holding>, WireError> {
        self.check(keys)?;
        Ok((0..keys)
            .map(|i| {
                self.copies(i)
                    .iter()
                    .map(|&c| (self.nodes[(c >> 1) as usize].clone(), c & 1 == 1))
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn a_batch_round_trips_through_the_wire() {
        let (a, b, c) = (id("a"), id("b"), id("c"));
        let mut h = KeyHolders::default();
        h.push_key([(&a, true)]);
        h.push_key([(&c, false), (&a, true), (&b, true)]);
        h.push_key([]);
        assert_eq!(h.nodes.len(), 3, "each node once in the table");
        assert_eq!(
            (
                h.copies_of(0),
                h.copies_of(1),
                h.copies_of(2),
                h.copies_of(3)
            ),
            (1, 3, 0, 0)
        );
        let frame = peercache_wire::envelope::encode(&crate::DirReply::Holders(h), &[]).unwrap();
        let env = peercache_wire::envelope::Envelope::parse(&frame).unwrap();
        let crate::DirReply::Holders(back) = env.decode().unwrap() else {
            panic!("not a holders reply");
        };
        let keys = back.into_holdings(3).unwrap();
        assert_eq!(keys[0].as_slice(), &[(a.clone(), true)]);
        assert_eq!(keys[1].as_slice(), &[(c, false), (a, true), (b, true)]);
        assert!(keys[2].is_empty());
    }

    proptest::proptest! {
        /// Whatever a peer sends, reading it is an answer or a typed error — never a panic.
        #[test]
        fn any_decoded_batch_is_read_or_refused(
            nodes in 0usize..4,
            ends in proptest::collection::vec(0u32..12, 0..8),
            copies in proptest::collection::vec(0u32..12, 0..12),
            keys in 0usize..8,
        ) {
            let h = KeyHolders {
                nodes: (0..nodes).map(|i| id(&format!("n{i}"))).collect(),
                ends,
                copies,
            };
            if let Ok(out) = h.into_holdings(keys) {
                proptest::prop_assert_eq!(out.len(), keys);
            }
        }
    }

    #[test]
    fn malformed_batches_are_refused_with_the_reason() {
        let a = id("a");
        let mut good = KeyHolders::default();
        good.push_key([(&a, true)]);
        good.push_key([(&a, false)]);
        let wrong_count = good.clone().into_holdings(3).unwrap_err();
        assert!(
            wrong_count.to_string().contains("2 keys answered of 3"),
            "{wrong_count}"
        );
        let mut backwards = good.clone();
        backwards.ends = vec![2, 1];
        backwards.copies.truncate(1);
        assert!(backwards.into_holdings(2).is_err());
        let mut short = good.clone();
        short.copies.pop();
        assert!(
            short
                .into_holdings(2)
                .unwrap_err()
                .to_string()
                .contains("cover")
        );
        let mut stranger = good;
        stranger.copies[1] = 7 << 1;
        let e = stranger.into_holdings(2).unwrap_err();
        assert!(e.to_string().contains("node 7 of 1"), "{e}");
    }
}

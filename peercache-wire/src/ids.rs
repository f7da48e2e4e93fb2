//! Identifiers shared by every plane.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::WireError;

/// Longest node id accepted, in bytes.
pub const MAX_NODE_ID_LEN: usize = 128;

/// A node's stable identity on the ring: configured, or derived from host, ports and ranks.
///
/// Grammar: 1 to [`MAX_NODE_ID_LEN`] bytes of `[A-Za-z0-9._:@-]`. The id is stable across
/// restarts (it names the disk-tier folder); [`Incarnation`] tells two lives of one id apart.
/// Cloning is cheap (shared string).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

impl NodeId {
    /// Validates and wraps `id`.
    pub fn new(id: impl AsRef<str>) -> Result<Self, WireError> {
        let id = id.as_ref();
        let bad = |reason| WireError::InvalidNodeId {
            id: id.chars().take(64).collect(),
            reason,
        };
        if id.is_empty() {
            return Err(bad("empty"));
        }
        if id.len() > MAX_NODE_ID_LEN {
            return Err(bad("longer than 128 bytes"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
        {
            return Err(bad("only [A-Za-z0-9._:@-] are allowed"));
        }
        // The disk tier keeps a node's files under `<disk_path>/<node id>/`: `.` and `..`
        // would name the folder itself or its parent.
        if id == "." || id == ".." {
            return Err(bad("`.` and `..` name folders, not nodes"));
        }
        Ok(NodeId(Arc::from(id)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id's bytes (what the ring hashes).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({})", &self.0)
    }
}

impl Serialize for NodeId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        NodeId::new(s.as_ref()).map_err(serde::de::Error::custom)
    }
}

/// One life of a node process: a restarted node with the same [`NodeId`] gets a new
/// incarnation, so peers drop state that belonged to the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Incarnation(pub u64);

impl Incarnation {
    /// A fresh incarnation: start time in microseconds mixed with the pid and a per-process
    /// counter, so two processes starting in the same microsecond, or two calls in one
    /// process, never get the same value.
    pub fn fresh() -> Self {
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let pid = std::process::id() as u64;
        let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Incarnation(
            (micros ^ (pid << 48) ^ pid.rotate_left(17))
                .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
        )
    }
}

/// The identity of a cached page: the 128-bit xxh3 hash of its full key string (after the
/// store applied `prefix`, model and rank parts).
///
/// Fixed width, so directories, pools and slot headers store keys without a heap allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PageKey(pub u128);

impl PageKey {
    /// Hashes a full key string.
    pub fn from_key(key: &str) -> Self {
        PageKey::from_bytes(key.as_bytes())
    }

    /// Hashes raw key bytes.
    pub fn from_bytes(key: &[u8]) -> Self {
        PageKey(xxhash_rust::xxh3::xxh3_128(key))
    }

    /// The high 64 bits (used where a 64-bit digest suffices, e.g. bucket choice).
    pub fn hi(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The low 64 bits.
    pub fn lo(self) -> u64 {
        self.0 as u64
    }
}

/// The layout fingerprint of a page: a 64-bit digest of the shape its bytes have (model, KV
/// dtype, pool, tokens per page, host layout, ranks, bytes per page), kept in every slot
/// header and checked by every reader exactly like the key.
///
/// [`Layout::NONE`] (0) is what pages written without a layout carry, including every page of
/// a release before layouts existed: a reader that expects a layout treats them as misses.
///
/// ```
/// use peercache_wire::Layout;
/// let bf16 = Layout::from_canonical(b"model=m;dtype=bfloat16");
/// let fp8 = Layout::from_canonical(b"model=m;dtype=float8_e4m3fn");
/// assert_ne!(bf16, fp8);
/// assert!(!bf16.is_none());
/// assert_eq!(bf16, Layout::from_canonical(b"model=m;dtype=bfloat16"));
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Layout(pub u64);

impl Layout {
    /// No layout: pages written by a caller that declared none, and every older page.
    pub const NONE: Layout = Layout(0);

    /// The fingerprint of a layout's canonical description (xxh3-64; never [`Layout::NONE`]).
    pub fn from_canonical(bytes: &[u8]) -> Layout {
        match xxhash_rust::xxh3::xxh3_64(bytes) {
            0 => Layout(1),
            h => Layout(h),
        }
    }

    /// Whether this is [`Layout::NONE`].
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Layout({:016x})", self.0)
    }
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageKey({:032x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_grammar_is_enforced() {
        assert!(NodeId::new("host-1:31998@tp0").is_ok());
        assert!(matches!(
            NodeId::new(""),
            Err(WireError::InvalidNodeId { .. })
        ));
        assert!(NodeId::new("a b").is_err());
        assert!(NodeId::new("x".repeat(129)).is_err());
        assert!(NodeId::new("x".repeat(128)).is_ok());
        // Folder names, not node names: the disk tier would use `disk_path` or its parent.
        assert!(NodeId::new("..").is_err() && NodeId::new(".").is_err());
        assert!(NodeId::new("...").is_ok() && NodeId::new(".a").is_ok());
    }

    #[test]
    fn node_id_deserialize_validates() {
        let bytes = postcard::to_allocvec(&"bad id").unwrap();
        assert!(postcard::from_bytes::<NodeId>(&bytes).is_err());
        let good = postcard::to_allocvec(&NodeId::new("n1").unwrap()).unwrap();
        assert_eq!(
            postcard::from_bytes::<NodeId>(&good).unwrap().as_str(),
            "n1"
        );
    }

    #[test]
    fn page_key_is_stable() {
        // Test vector: must never change, every node and language relies on it.
        assert_eq!(
            PageKey::from_key("hello").to_string(),
            format!("{:032x}", xxhash_rust::xxh3::xxh3_128(b"hello"))
        );
        assert_eq!(PageKey::from_key("a"), PageKey::from_bytes(b"a"));
        assert_ne!(PageKey::from_key("a"), PageKey::from_key("b"));
    }

    #[test]
    fn incarnations_differ() {
        let a = Incarnation::fresh();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = Incarnation::fresh();
        assert_ne!(
            a, b,
            "two starts 2 ms apart must get different incarnations"
        );
    }
}

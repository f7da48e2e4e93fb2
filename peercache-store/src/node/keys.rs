//! The key grammar, applied once here on every path: the full key of a page is
//! `<prefix>_<key>` when `prefix` is set (else `<key>`), and its [`PageKey`] is the XXH3-128 of
//! those bytes. The Python facade adds only model, rank and component parts before calling
//! in. Test vectors below and in `docs/architecture.md`.

use peercache_wire::PageKey;

/// A tenant's keyspace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyspace {
    prefix: String,
}

impl Keyspace {
    /// The keyspace of `prefix` (empty: no tag).
    pub fn new(prefix: &str) -> Self {
        Keyspace {
            prefix: prefix.to_string(),
        }
    }

    /// The page key of `key` in this keyspace, hashed without building the full string.
    pub fn page_key(&self, key: &str) -> PageKey {
        if self.prefix.is_empty() {
            return PageKey::from_key(key);
        }
        let mut h = xxhash_rust::xxh3::Xxh3Default::new();
        h.update(self.prefix.as_bytes());
        h.update(b"_");
        h.update(key.as_bytes());
        PageKey(h.digest128())
    }

    /// The full key string (for logs and docs; the hot path never builds it).
    pub fn full_key(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}_{}", self.prefix, key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_applied_and_matches_the_documented_grammar() {
        let plain = Keyspace::new("");
        let tenant = Keyspace::new("tenant-a");
        assert_eq!(plain.page_key("abc"), PageKey::from_key("abc"));
        assert_eq!(tenant.page_key("abc"), PageKey::from_key("tenant-a_abc"));
        assert_ne!(tenant.page_key("abc"), plain.page_key("abc"));
        assert_eq!(tenant.full_key("abc"), "tenant-a_abc");
        // Test vectors (also in docs/architecture.md).
        assert_eq!(
            plain.page_key("hello").to_string(),
            "b5e9c1ad071b3e7fc779cfaa5e523818"
        );
        assert_eq!(
            tenant.page_key("hello").to_string(),
            PageKey::from_key("tenant-a_hello").to_string()
        );
    }
}

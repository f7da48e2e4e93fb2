//! Per-node credentials: which member a connection is, not only that it is one.
//!
//! The operator keeps a **cluster signing key** (Ed25519) offline and issues each node a key pair
//! of its own and a [`NodeCert`]: "the holder of this public key may speak for `subject` until
//! `not_after`", signed by the cluster key. `subject` is an exact node id, or an id prefix ending
//! in `*` (all ranks of one host). In the handshake a member presents its certificate and signs
//! the exchange (both fresh nonces and the Hello, and the server also its acceptance) with its
//! node key; the other side checks the certificate against the cluster's public key, its expiry,
//! that it covers the node id the Hello (or acceptance) names, and the signature. With
//! `require_node_certificates`, a Hello that names a node without proving it is refused, so a
//! member holding the cluster secret can no longer speak for another member.
//!
//! Keys and certificates are one line of text each (`peercache-…-v1 <hex>`), so they travel
//! through secret stores and config maps as files.
//!
//! ```
//! use peercache_wire::identity::SigningKey;
//! use peercache_wire::NodeId;
//!
//! let cluster = SigningKey::generate()?;
//! let node = SigningKey::generate()?;
//! let cert = cluster.issue("gpu-7-*", node.public_key(), u64::MAX)?;
//! cert.verify(&cluster.public_key(), 0)?;
//! assert!(cert.covers(&NodeId::new("gpu-7-r3").unwrap()));
//! assert!(!cert.covers(&NodeId::new("gpu-8-r0").unwrap()));
//! # Ok::<(), peercache_wire::WireError>(())
//! ```

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use serde::{Deserialize, Serialize};

use crate::{NodeId, WireError};

/// Bytes of an Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// Bytes of an Ed25519 signature.
pub const SIGNATURE_LEN: usize = 64;

const CERT_LABEL: &[u8] = b"peercache node certificate v1";
const KEY_TEXT: &str = "peercache-key-v1";
const PUBLIC_TEXT: &str = "peercache-public-key-v1";
const CERT_TEXT: &str = "peercache-cert-v1";
/// Longest certificate subject.
const MAX_SUBJECT: usize = 256;

fn bad(what: &'static str, detail: impl Into<String>) -> WireError {
    WireError::Malformed {
        what,
        detail: detail.into(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// `<tag> <hex>` → the bytes, or a typed error naming what was expected.
fn from_text(text: &str, tag: &'static str, what: &'static str) -> Result<Vec<u8>, WireError> {
    let mut parts = text.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(t), Some(h), None) if t == tag => {
            unhex(h).ok_or_else(|| bad(what, "the hex part is not hex"))
        }
        _ => Err(bad(what, format!("expected one line `{tag} <hex>`"))),
    }
}

/// An Ed25519 signing key: the cluster's (issues certificates) or a node's (signs handshakes).
pub struct SigningKey {
    pair: Ed25519KeyPair,
    seed: [u8; 32],
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SigningKey(public {})", hex(&self.public_key()[..8]))
    }
}

impl SigningKey {
    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<Self, WireError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed)
            .map_err(|e| WireError::Io(std::io::Error::other(e.to_string())))?;
        Self::from_seed(seed)
    }

    fn from_seed(seed: [u8; 32]) -> Result<Self, WireError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|_| bad("signing key", "not an Ed25519 seed"))?;
        Ok(SigningKey { pair, seed })
    }

    /// The public half.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        let mut k = [0u8; PUBLIC_KEY_LEN];
        k.copy_from_slice(self.pair.public_key().as_ref());
        k
    }

    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut s = [0u8; SIGNATURE_LEN];
        s.copy_from_slice(self.pair.sign(msg).as_ref());
        s
    }

    /// The key as one line of text (keep the file private: it is the key).
    pub fn to_text(&self) -> String {
        format!("{KEY_TEXT} {}\n", hex(&self.seed))
    }

    /// A key written by [`Self::to_text`].
    pub fn from_text(text: &str) -> Result<Self, WireError> {
        let bytes = from_text(text, KEY_TEXT, "signing key")?;
        let seed: [u8; 32] = bytes
            .try_into()
            .map_err(|_| bad("signing key", "a key is 32 bytes"))?;
        Self::from_seed(seed)
    }

    /// Issues a certificate: the holder of `node_key` may speak for `subject` (an exact node id,
    /// or a prefix ending in `*`) until `not_after` (Unix seconds).
    pub fn issue(
        &self,
        subject: &str,
        node_key: [u8; PUBLIC_KEY_LEN],
        not_after: u64,
    ) -> Result<NodeCert, WireError> {
        check_subject(subject)?;
        let msg = NodeCert::signed_bytes(subject, &node_key, not_after);
        Ok(NodeCert {
            subject: subject.to_string(),
            public_key: node_key,
            not_after,
            signature: self.sign(&msg).to_vec(),
        })
    }
}

fn check_subject(subject: &str) -> Result<(), WireError> {
    let id = subject.strip_suffix('*').unwrap_or(subject);
    if subject.is_empty() || subject.len() > MAX_SUBJECT || id.contains('*') {
        return Err(bad(
            "certificate subject",
            format!("{subject:?}: a node id, or a prefix ending in one `*`"),
        ));
    }
    Ok(())
}

/// A public key as one line of text (the cluster's, given to every node as `cluster_ca_file`).
pub fn public_key_to_text(key: &[u8; PUBLIC_KEY_LEN]) -> String {
    format!("{PUBLIC_TEXT} {}\n", hex(key))
}

/// A public key written by [`public_key_to_text`].
pub fn public_key_from_text(text: &str) -> Result<[u8; PUBLIC_KEY_LEN], WireError> {
    from_text(text, PUBLIC_TEXT, "public key")?
        .try_into()
        .map_err(|_| bad("public key", "a public key is 32 bytes"))
}

/// "The holder of `public_key` may speak for `subject` until `not_after`", signed by the
/// cluster signing key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeCert {
    /// An exact node id, or an id prefix ending in `*`.
    pub subject: String,
    /// The node's Ed25519 public key.
    pub public_key: [u8; PUBLIC_KEY_LEN],
    /// Expiry, Unix seconds.
    pub not_after: u64,
    /// The cluster key's signature over the fields above.
    pub signature: Vec<u8>,
}

impl NodeCert {
    fn signed_bytes(subject: &str, key: &[u8; PUBLIC_KEY_LEN], not_after: u64) -> Vec<u8> {
        let mut m = Vec::with_capacity(CERT_LABEL.len() + subject.len() + 56);
        m.extend_from_slice(CERT_LABEL);
        m.extend_from_slice(&(subject.len() as u64).to_be_bytes());
        m.extend_from_slice(subject.as_bytes());
        m.extend_from_slice(key);
        m.extend_from_slice(&not_after.to_be_bytes());
        m
    }

    /// Whether this certificate speaks for `node`.
    pub fn covers(&self, node: &NodeId) -> bool {
        match self.subject.strip_suffix('*') {
            Some(prefix) => node.as_str().starts_with(prefix),
            None => node.as_str() == self.subject,
        }
    }

    /// Checks the cluster key's signature and the expiry against `now` (Unix seconds).
    pub fn verify(&self, cluster: &[u8; PUBLIC_KEY_LEN], now: u64) -> Result<(), WireError> {
        check_subject(&self.subject)?;
        let msg = Self::signed_bytes(&self.subject, &self.public_key, self.not_after);
        UnparsedPublicKey::new(&ED25519, cluster)
            .verify(&msg, &self.signature)
            .map_err(|_| {
                WireError::Unauthenticated(format!(
                    "the certificate for {:?} is not signed by this cluster's key",
                    self.subject
                ))
            })?;
        if now > self.not_after {
            return Err(WireError::Unauthenticated(format!(
                "the certificate for {:?} expired at {} (now {now})",
                self.subject, self.not_after
            )));
        }
        Ok(())
    }

    /// Checks `signature` over `msg` by this certificate's key.
    pub fn verify_signature(&self, msg: &[u8], signature: &[u8]) -> Result<(), WireError> {
        UnparsedPublicKey::new(&ED25519, &self.public_key)
            .verify(msg, signature)
            .map_err(|_| {
                WireError::Unauthenticated(format!(
                    "the signature does not match the certificate for {:?}",
                    self.subject
                ))
            })
    }

    /// The wire form (postcard), carried in a handshake extension.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    /// The wire form back; anything else is a typed error.
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        postcard::from_bytes(bytes).map_err(|e| bad("node certificate", e.to_string()))
    }

    /// The certificate as one line of text.
    pub fn to_text(&self) -> String {
        format!("{CERT_TEXT} {}\n", hex(&self.encode()))
    }

    /// A certificate written by [`Self::to_text`].
    pub fn from_text(text: &str) -> Result<Self, WireError> {
        Self::decode(&from_text(text, CERT_TEXT, "node certificate")?)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What one endpoint proves and checks about node identities.
#[derive(Debug)]
pub struct Identity {
    /// This endpoint's key and certificate (None: it checks others but proves nothing).
    own: Option<(SigningKey, NodeCert, Vec<u8>)>,
    /// The cluster's public key certificates are checked against.
    cluster: [u8; PUBLIC_KEY_LEN],
    /// A Hello or acceptance that names a node must prove it.
    require: bool,
}

impl Identity {
    /// An identity checking certificates against `cluster`, proving `own` (a node key and its
    /// certificate, which must be signed by `cluster`) when given.
    pub fn new(
        own: Option<(SigningKey, NodeCert)>,
        cluster: [u8; PUBLIC_KEY_LEN],
        require: bool,
    ) -> Result<Self, WireError> {
        let own = match own {
            None => None,
            Some((key, cert)) => {
                cert.verify(&cluster, unix_now())?;
                if cert.public_key != key.public_key() {
                    return Err(WireError::Unauthenticated(
                        "the node key does not match its certificate".into(),
                    ));
                }
                let bytes = cert.encode();
                Some((key, cert, bytes))
            }
        };
        Ok(Identity {
            own,
            cluster,
            require,
        })
    }

    /// Whether a named node must prove its id.
    pub fn requires(&self) -> bool {
        self.require
    }

    /// This endpoint's certificate, if it has one.
    pub fn cert(&self) -> Option<&NodeCert> {
        self.own.as_ref().map(|(_, c, _)| c)
    }

    pub(crate) fn cert_bytes(&self) -> Option<&[u8]> {
        self.own.as_ref().map(|(_, _, b)| b.as_slice())
    }

    pub(crate) fn sign(&self, msg: &[u8]) -> Option<[u8; SIGNATURE_LEN]> {
        self.own.as_ref().map(|(k, _, _)| k.sign(msg))
    }

    /// Checks that `cert_bytes` is a certificate of this cluster, in force, covering `node`,
    /// and that `signature` over `msg` is by its key.
    pub(crate) fn check(
        &self,
        node: &NodeId,
        cert_bytes: &[u8],
        msg: &[u8],
        signature: &[u8],
    ) -> Result<(), WireError> {
        let cert = NodeCert::decode(cert_bytes)?;
        cert.verify(&self.cluster, unix_now())?;
        if !cert.covers(node) {
            return Err(WireError::Unauthenticated(format!(
                "the certificate for {:?} does not cover node {node}",
                cert.subject
            )));
        }
        cert.verify_signature(msg, signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).unwrap()
    }

    #[test]
    fn a_certificate_verifies_only_under_its_cluster_key_and_until_it_expires() {
        let cluster = SigningKey::generate().unwrap();
        let other = SigningKey::generate().unwrap();
        let node = SigningKey::generate().unwrap();
        let cert = cluster.issue("node-a", node.public_key(), 1000).unwrap();
        cert.verify(&cluster.public_key(), 999).unwrap();
        assert!(cert.verify(&cluster.public_key(), 1001).is_err());
        assert!(cert.verify(&other.public_key(), 0).is_err());
        // Any field changed breaks the signature.
        let mut forged = cert.clone();
        forged.subject = "node-*".into();
        assert!(forged.verify(&cluster.public_key(), 0).is_err());
        let mut forged = cert.clone();
        forged.not_after = u64::MAX;
        assert!(forged.verify(&cluster.public_key(), 0).is_err());
        let mut forged = cert.clone();
        forged.public_key = other.public_key();
        assert!(forged.verify(&cluster.public_key(), 0).is_err());
    }

    #[test]
    fn subjects_cover_an_exact_id_or_a_prefix() {
        let cluster = SigningKey::generate().unwrap();
        let k = SigningKey::generate().unwrap().public_key();
        let exact = cluster.issue("host-1-r0", k, u64::MAX).unwrap();
        assert!(exact.covers(&id("host-1-r0")));
        assert!(!exact.covers(&id("host-1-r01")));
        let prefix = cluster.issue("host-1-*", k, u64::MAX).unwrap();
        assert!(prefix.covers(&id("host-1-r7")));
        assert!(!prefix.covers(&id("host-10-r0")));
        for bad in ["", "a*b*", "*x"] {
            assert!(cluster.issue(bad, k, 1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn keys_and_certificates_round_trip_as_text_and_garbage_is_typed() {
        let cluster = SigningKey::generate().unwrap();
        let again = SigningKey::from_text(&cluster.to_text()).unwrap();
        assert_eq!(again.public_key(), cluster.public_key());
        let pk = public_key_from_text(&public_key_to_text(&cluster.public_key())).unwrap();
        assert_eq!(pk, cluster.public_key());
        let cert = cluster.issue("n", pk, 5).unwrap();
        assert_eq!(NodeCert::from_text(&cert.to_text()).unwrap(), cert);
        for garbage in [
            "",
            "peercache-cert-v1",
            "peercache-cert-v1 zz",
            "other 00",
            "peercache-cert-v1 00 00",
        ] {
            assert!(NodeCert::from_text(garbage).is_err(), "{garbage:?}");
        }
        assert!(SigningKey::from_text("peercache-key-v1 0011").is_err());
        assert!(NodeCert::decode(&[0xff; 7]).is_err());
    }

    #[test]
    fn an_identity_checks_the_cert_the_node_and_the_signature() {
        let cluster = SigningKey::generate().unwrap();
        let node = SigningKey::generate().unwrap();
        let cert = cluster
            .issue("node-a", node.public_key(), u64::MAX)
            .unwrap();
        let me = Identity::new(Some((node, cert.clone())), cluster.public_key(), true).unwrap();
        let msg = b"transcript";
        let sig = me.sign(msg).unwrap();
        let bytes = cert.encode();
        me.check(&id("node-a"), &bytes, msg, &sig).unwrap();
        assert!(me.check(&id("node-b"), &bytes, msg, &sig).is_err());
        assert!(me.check(&id("node-a"), &bytes, b"other", &sig).is_err());
        // A key that does not match its certificate is refused at setup.
        let stranger = SigningKey::generate().unwrap();
        assert!(Identity::new(Some((stranger, cert)), cluster.public_key(), true).is_err());
    }
}

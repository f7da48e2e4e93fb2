//! Cluster authentication: a shared `cluster_secret` proven in the handshake.
//!
//! Both sides prove knowledge of the secret without sending it, with HMAC-SHA256 over the
//! connection's transcript, **the client first** (handshake version 2):
//!
//! ```text
//! client → server   Hello + EXT_HANDSHAKE_VERSION = 2 + EXT_AUTH_NONCE = Nc   (32 random bytes)
//! server → client   AuthChallenge { nonce: Ns }                              (nothing else)
//! client → server   AuthProof { proof: MAC("client", Nc, Ns, hello) }
//! server → client   HelloReply::Accept + EXT_SERVER_PROOF = MAC("server", Nc, Ns, hello, accept)
//!                   or HelloReply::Reject
//! ```
//!
//! A peer that has not proven the secret receives only a random nonce and a refusal: nothing
//! it could use to test guesses of the secret offline. Each side contributes a fresh nonce, so
//! a recorded exchange replayed on a new connection fails on the side that chose a new nonce;
//! the MACs cover the exact Hello bytes (plane, node id, incarnation, versions) and the
//! server's acceptance, so a proof cannot be moved to another request. The key used is derived
//! from the secret; the secret itself never leaves the process and is never logged.
//!
//! What a proof shows is **membership**: the peer holds the cluster secret. It does not show
//! which member the peer is — every member holds the same secret, so the node id in a Hello is
//! the member's claim. Services bind each connection to that claim (a member may register,
//! publish and remove only as the node it said it is), which stops mistakes and
//! mis-configuration from one member overwriting another, but a member that lies in its Hello
//! is not stopped by the secret; per-node keys (docs/security.md) would be.
//!
//! A **read-only client token** ([`read_only_token`]) is derived from the secret. An endpoint
//! that accepts it ([`Auth::accepting_read_only`], the client API port) learns from the
//! handshake which credential the client proved ([`Grant`]), and answers with its proof under
//! that same key. Holding the token does not reveal the secret, and no other port accepts it.
//!
//! Traffic after the handshake is sealed (encrypted and integrity-protected, [`crate::seal`])
//! when both sides have a secret and one of them requires it ([`Auth::requiring_encryption`]);
//! otherwise it is neither encrypted nor integrity-protected, which keeps strangers out of a
//! trusted fabric but does not defend against an on-path attacker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tally::Tally;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::WireError;

type HmacSha256 = Hmac<Sha256>;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Length of nonces and proofs.
pub const TAG_LEN: usize = 32;
/// Metric counting handshakes refused for failed or missing authentication.
pub use crate::metrics::AUTH_REJECTED_TOTAL as REJECTED_TOTAL;

const KDF_LABEL: &[u8] = b"peercache cluster_secret v1";
const READ_ONLY_LABEL: &[u8] = b"peercache read-only client token v1";
const SERVER_LABEL: &[u8] = b"peercache auth v2 server";
const CLIENT_LABEL: &[u8] = b"peercache auth v2 client";

/// Which side produced a proof.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The accepting side.
    Server,
    /// The connecting side.
    Client,
}

/// What a peer's proof grants it: the cluster secret (everything), or the read-only client
/// token (reads and lookups on the client API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The cluster secret (or an open cluster).
    Full,
    /// The read-only client token.
    ReadOnly,
}

struct Inner {
    /// Proves with `keys[0]` unless answering a peer that proved another; accepts proofs made
    /// with any of them.
    keys: Vec<[u8; 32]>,
    /// Keys from this index on are read-only client tokens.
    read_only_from: usize,
    rejected: Tally,
    last_warn_s: AtomicU64,
    /// What this endpoint asks of its connections' sealing ([`crate::seal`]).
    sealing: crate::seal::Sealing,
    /// Per-node credentials this endpoint proves and checks ([`crate::identity`]).
    identity: Option<Arc<crate::identity::Identity>>,
}

/// The authentication settings of one endpoint: no secret (open cluster), or a key derived
/// from the shared secret. Cheap to clone; `Debug` never shows the key.
#[derive(Clone, Default)]
pub struct Auth {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.inner.is_some() {
            "Auth(cluster secret set)"
        } else {
            "Auth(none)"
        })
    }
}

impl Auth {
    /// No authentication: every peer that speaks the protocol is served.
    pub fn none() -> Self {
        Auth { inner: None }
    }

    /// Authentication with `secret` (at least [`MIN_SECRET_LEN`] bytes). Registers the
    /// rejection counter with the current metrics recorder.
    pub fn from_secret(secret: &[u8]) -> Result<Self, WireError> {
        Self::rotating(secret, &[])
    }

    /// Authentication that proves itself with `secret` and also accepts peers proving any of
    /// `also_accepted` — the middle phases of a rolling secret rotation.
    pub fn rotating(secret: &[u8], also_accepted: &[&[u8]]) -> Result<Self, WireError> {
        let keys = std::iter::once(secret)
            .chain(also_accepted.iter().copied())
            .map(derive_key)
            .collect::<Result<Vec<_>, _>>()?;
        let read_only_from = keys.len();
        Ok(Auth {
            inner: Some(Arc::new(Inner {
                keys,
                read_only_from,
                rejected: Tally::new(metrics::counter!(REJECTED_TOTAL)),
                last_warn_s: AtomicU64::new(0),
                sealing: crate::seal::Sealing::Offer,
                identity: None,
            })),
        })
    }

    /// This endpoint's authentication that also accepts the read-only client token of
    /// `secret` (see [`read_only_token`]); a peer that proves it is granted
    /// [`Grant::ReadOnly`]. Without a secret configured, the endpoint stays open.
    ///
    /// ```
    /// use peercache_wire::auth::{Auth, read_only_token};
    ///
    /// let secret = b"a cluster secret of 32 bytes ok!";
    /// let client_port = Auth::from_secret(secret)?.accepting_read_only(secret)?;
    /// let token = read_only_token(secret)?;
    /// assert_eq!(token.len(), 64);
    /// # Ok::<(), peercache_wire::WireError>(())
    /// ```
    pub fn accepting_read_only(&self, secret: &[u8]) -> Result<Auth, WireError> {
        let Some(inner) = self.inner.as_ref() else {
            return Ok(self.clone());
        };
        let token = derive_key(read_only_token(secret)?.as_bytes())?;
        let full = inner.keys.len();
        Ok(self.changed(|i| {
            i.keys.push(token);
            i.read_only_from = full;
        }))
    }

    /// This endpoint's authentication, requiring (`true`) encryption in transit on the
    /// sealing planes or only offering it (`false`, the default: a connection is sealed when
    /// the other side prefers or requires it). See [`Auth::with_sealing`].
    ///
    /// ```
    /// use peercache_wire::Auth;
    ///
    /// let auth = Auth::from_secret(b"a cluster secret of 32 bytes ok!")?.requiring_encryption(true);
    /// assert!(auth.seals());
    /// # Ok::<(), peercache_wire::WireError>(())
    /// ```
    pub fn requiring_encryption(&self, required: bool) -> Auth {
        self.with_sealing(if required {
            crate::seal::Sealing::Require
        } else {
            crate::seal::Sealing::Offer
        })
    }

    /// This endpoint's authentication with `sealing` for its connections on the sealing planes.
    /// Without a secret nothing can be sealed and this is a no-op; the store refuses
    /// [`Sealing::Require`](crate::seal::Sealing::Require) without one in its configuration.
    pub fn with_sealing(&self, sealing: crate::seal::Sealing) -> Auth {
        self.changed(|i| i.sealing = sealing)
    }

    /// This endpoint's authentication with `change` applied to a copy of its settings (the
    /// keys and the rejection counter shared). Without a secret, the open endpoint as is.
    fn changed(&self, change: impl FnOnce(&mut Inner)) -> Auth {
        let Some(inner) = self.inner.as_ref() else {
            return self.clone();
        };
        let mut next = Inner {
            keys: inner.keys.clone(),
            read_only_from: inner.read_only_from,
            rejected: inner.rejected.clone(),
            last_warn_s: AtomicU64::new(0),
            sealing: inner.sealing,
            identity: inner.identity.clone(),
        };
        change(&mut next);
        Auth {
            inner: Some(Arc::new(next)),
        }
    }

    /// Whether this endpoint requires its connections sealed.
    pub fn seals(&self) -> bool {
        self.sealing() == crate::seal::Sealing::Require
    }

    /// What this endpoint asks of its connections' sealing (`Offer` without a secret).
    pub fn sealing(&self) -> crate::seal::Sealing {
        self.inner
            .as_ref()
            .map_or(crate::seal::Sealing::Offer, |i| i.sealing)
    }

    /// The sealing feature bits this endpoint announces in a handshake.
    pub(crate) fn seal_features(&self) -> u64 {
        match self.inner.as_ref() {
            None => 0,
            Some(i) => i.sealing.features(),
        }
    }

    /// This endpoint's authentication, also proving and checking node identities with
    /// `identity` ([`crate::identity`]). Without a secret this is a no-op; the store refuses
    /// that combination in its configuration.
    pub fn with_identity(&self, identity: crate::identity::Identity) -> Auth {
        let identity = Arc::new(identity);
        self.changed(|i| i.identity = Some(identity))
    }

    /// The node identity this endpoint proves and checks, if any.
    pub fn identity(&self) -> Option<&crate::identity::Identity> {
        self.inner.as_ref().and_then(|i| i.identity.as_deref())
    }

    /// The keys of a sealed connection whose handshake proved key `key` (see
    /// [`Auth::verify_key`]; the client proves with key 0) over the given nonces and messages.
    pub(crate) fn channel_keys(
        &self,
        key: usize,
        client_nonce: &[u8; TAG_LEN],
        server_nonce: &[u8; TAG_LEN],
        transcript: &[&[u8]],
    ) -> Option<crate::seal::ChannelKeys> {
        let inner = self.inner.as_ref()?;
        let key = inner.keys.get(key).unwrap_or(&inner.keys[0]);
        let mut all =
            Vec::with_capacity(2 * TAG_LEN + transcript.iter().map(|p| p.len() + 8).sum::<usize>());
        all.extend_from_slice(client_nonce);
        all.extend_from_slice(server_nonce);
        for part in transcript {
            all.extend_from_slice(&(part.len() as u64).to_le_bytes());
            all.extend_from_slice(part);
        }
        Some(crate::seal::ChannelKeys::from_secret_material(key, &all))
    }

    /// Whether a secret is configured.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Handshakes this endpoint refused for authentication.
    pub fn rejected(&self) -> u64 {
        self.inner.as_ref().map_or(0, |i| i.rejected.get())
    }

    /// The proof `side` sends for the exchange whose messages are `transcript` (each part
    /// length-prefixed into the MAC), or None without a secret.
    pub fn proof(
        &self,
        side: Side,
        client_nonce: &[u8; TAG_LEN],
        server_nonce: &[u8; TAG_LEN],
        transcript: &[&[u8]],
    ) -> Option<[u8; TAG_LEN]> {
        self.proof_with(0, side, client_nonce, server_nonce, transcript)
    }

    /// [`Auth::proof`] with key `key` (the one [`Auth::verify_key`] matched), so a peer that
    /// proved a read-only token can check the answer with that token.
    pub fn proof_with(
        &self,
        key: usize,
        side: Side,
        client_nonce: &[u8; TAG_LEN],
        server_nonce: &[u8; TAG_LEN],
        transcript: &[&[u8]],
    ) -> Option<[u8; TAG_LEN]> {
        let inner = self.inner.as_ref()?;
        let key = inner.keys.get(key).unwrap_or(&inner.keys[0]);
        Some(
            transcript_mac(key, side, client_nonce, server_nonce, transcript)
                .finalize()
                .into_bytes()
                .into(),
        )
    }

    /// What the proof made with key `key` grants.
    pub fn grant_of(&self, key: usize) -> Grant {
        match self.inner.as_ref() {
            Some(i) if key >= i.read_only_from => Grant::ReadOnly,
            _ => Grant::Full,
        }
    }

    /// Checks `proof` from `side` in constant time. False without a secret.
    pub fn verify(
        &self,
        side: Side,
        client_nonce: &[u8; TAG_LEN],
        server_nonce: &[u8; TAG_LEN],
        transcript: &[&[u8]],
        proof: &[u8; TAG_LEN],
    ) -> bool {
        self.verify_key(side, client_nonce, server_nonce, transcript, proof)
            .is_some()
    }

    /// [`Auth::verify`], naming the key that matched (None: none did, or no secret).
    pub fn verify_key(
        &self,
        side: Side,
        client_nonce: &[u8; TAG_LEN],
        server_nonce: &[u8; TAG_LEN],
        transcript: &[&[u8]],
        proof: &[u8; TAG_LEN],
    ) -> Option<usize> {
        let inner = self.inner.as_ref()?;
        // Every key is checked (constant time each), so timing does not reveal which matched.
        inner.keys.iter().enumerate().fold(None, |found, (i, key)| {
            let this = transcript_mac(key, side, client_nonce, server_nonce, transcript)
                .verify_slice(proof)
                .is_ok();
            found.or(this.then_some(i))
        })
    }

    /// Counts a refused stranger and logs it, at most one warning per 10 s per endpoint.
    pub(crate) fn count_rejection(&self, why: &str) {
        let Some(inner) = self.inner.as_ref() else {
            return;
        };
        let n = inner.rejected.bump();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = inner.last_warn_s.load(Ordering::Relaxed);
        if now >= last + 10
            && inner
                .last_warn_s
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                rejected_total = n,
                why,
                "refused an unauthenticated connection"
            );
        } else {
            tracing::debug!(why, "refused an unauthenticated connection");
        }
    }
}

/// The read-only client token of the cluster `secret`: 64 hex digits, an HMAC of the secret's
/// derived key, so the token does not reveal the secret. Give it to routers and tools that only
/// read: the client API port accepts it for reads, lookups and prefix queries, and refuses its
/// writes. No other port accepts it.
pub fn read_only_token(secret: &[u8]) -> Result<String, WireError> {
    let key = derive_key(secret)?;
    let mut mac = HmacSha256::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(READ_ONLY_LABEL);
    Ok(mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn derive_key(secret: &[u8]) -> Result<[u8; 32], WireError> {
    if secret.len() < MIN_SECRET_LEN {
        return Err(WireError::WeakSecret {
            len: secret.len(),
            min: MIN_SECRET_LEN,
        });
    }
    let mut mac = HmacSha256::new_from_slice(KDF_LABEL).expect("HMAC takes any key length");
    mac.update(secret);
    Ok(mac.finalize().into_bytes().into())
}

fn transcript_mac(
    key: &[u8; 32],
    side: Side,
    client_nonce: &[u8; TAG_LEN],
    server_nonce: &[u8; TAG_LEN],
    transcript: &[&[u8]],
) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(match side {
        Side::Server => SERVER_LABEL,
        Side::Client => CLIENT_LABEL,
    });
    mac.update(client_nonce);
    mac.update(server_nonce);
    for part in transcript {
        mac.update(&(part.len() as u64).to_le_bytes());
        mac.update(part);
    }
    mac
}

/// A random 64-bit value from the operating system's random source (reservation tokens and
/// other values a peer must not be able to guess).
pub fn random_u64() -> Result<u64, WireError> {
    let mut n = [0u8; 8];
    getrandom::fill(&mut n).map_err(|e| WireError::Io(std::io::Error::other(e.to_string())))?;
    Ok(u64::from_le_bytes(n))
}

/// 32 bytes from the operating system's random source.
pub fn nonce() -> Result<[u8; TAG_LEN], WireError> {
    let mut n = [0u8; TAG_LEN];
    getrandom::fill(&mut n).map_err(|e| WireError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// A fresh cluster secret: 32 bytes from the operating system's random source, as 64 hex
/// characters (what `openssl rand -hex 32` prints).
///
/// ```
/// let s = peercache_wire::auth::generate_secret().unwrap();
/// assert_eq!(s.len(), 64);
/// assert!(peercache_wire::Auth::from_secret(s.as_bytes()).is_ok());
/// ```
pub fn generate_secret() -> Result<String, WireError> {
    Ok(nonce()?.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secret_is_refused() {
        assert!(matches!(
            Auth::from_secret(b"short"),
            Err(WireError::WeakSecret { len: 5, .. })
        ));
    }

    #[test]
    fn proofs_verify_only_with_the_same_secret_side_and_transcript() {
        let a = Auth::from_secret(b"0123456789abcdef-one").unwrap();
        let b = Auth::from_secret(b"0123456789abcdef-two").unwrap();
        let (nc, ns) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(nc, ns);
        let p = a.proof(Side::Client, &nc, &ns, &[b"hello"]).unwrap();
        assert!(a.verify(Side::Client, &nc, &ns, &[b"hello"], &p));
        assert!(!a.verify(Side::Server, &nc, &ns, &[b"hello"], &p));
        assert!(!a.verify(Side::Client, &ns, &nc, &[b"hello"], &p));
        assert!(!a.verify(Side::Client, &nc, &ns, &[b"hellp"], &p));
        assert!(!b.verify(Side::Client, &nc, &ns, &[b"hello"], &p));
        assert!(!Auth::none().verify(Side::Client, &nc, &ns, &[b"hello"], &p));
    }

    #[test]
    fn rotation_phases_accept_each_other() {
        let (old, new): (&[u8], &[u8]) = (b"old-cluster-secret-1", b"new-cluster-secret-2");
        let phase0 = Auth::from_secret(old).unwrap();
        let phase1 = Auth::rotating(old, &[new]).unwrap();
        let phase2 = Auth::rotating(new, &[old]).unwrap();
        let phase3 = Auth::from_secret(new).unwrap();
        let (nc, ns) = (nonce().unwrap(), nonce().unwrap());
        let ok = |prover: &Auth, verifier: &Auth| {
            let p = prover.proof(Side::Client, &nc, &ns, &[b"h"]).unwrap();
            verifier.verify(Side::Client, &nc, &ns, &[b"h"], &p)
        };
        // Neighbouring phases (the ones that coexist during a rolling restart) interoperate.
        for (a, b) in [(&phase0, &phase1), (&phase1, &phase2), (&phase2, &phase3)] {
            assert!(ok(a, b) && ok(b, a));
        }
        assert!(!ok(&phase0, &phase3) && !ok(&phase3, &phase0));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let a = Auth::from_secret(b"super-secret-value-123").unwrap();
        let s = format!("{a:?}");
        assert!(!s.contains("super"), "{s}");
    }
}

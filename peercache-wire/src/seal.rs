//! Encryption in transit: an AEAD channel keyed from the authenticated handshake.
//!
//! When both sides of a handshake on a sealing plane (discovery, control and client RPCs, the
//! TCP data plane) proved the cluster secret and at least one of them requires it, every byte
//! after the handshake travels sealed with AES-256-GCM:
//!
//! - **Keys.** One key per direction, derived with HMAC-SHA256 from the key the client proved
//!   and the whole handshake transcript (both fresh nonces, the exact Hello, the server's
//!   acceptance). Two connections never share a key, and a recorded connection cannot be
//!   replayed into a new one.
//! - **Nonces.** A 64-bit counter per direction, never sent: a record dropped, replayed or
//!   reordered by someone on the path fails the next tag check.
//! - **Failure.** A record whose tag does not verify is a typed [`WireError::Integrity`]; the
//!   connection is closed and nothing of the record is used.
//!
//! The RPC planes seal each frame whole ([`Sealer::seal_in_place`] appends the tag, the frame's
//! length prefix covers it). The data plane cuts its byte stream into records of at most
//! [`RECORD_MAX`] bytes, each `[u32 big-endian length][ciphertext][tag]`.
//!
//! ```
//! use peercache_wire::seal::ChannelKeys;
//!
//! let keys = ChannelKeys::from_secret_material(&[7; 32], b"transcript");
//! let (mut client_tx, _) = keys.client();
//! let (_, mut server_rx) = keys.server();
//! let mut frame = b"a page".to_vec();
//! client_tx.seal_in_place(&mut frame, 0)?;
//! assert_ne!(&frame[..6], b"a page");
//! let n = server_rx.open_in_place(&mut frame)?;
//! assert_eq!(&frame[..n], b"a page");
//! # Ok::<(), peercache_wire::WireError>(())
//! ```

use hmac::{Hmac, Mac};
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use sha2::Sha256;

use crate::WireError;

/// Bytes an AEAD tag adds to each sealed frame or record.
pub const TAG_BYTES: usize = 16;

/// Largest plaintext of one data-plane record.
pub const RECORD_MAX: usize = 256 << 10;

/// Hello / acceptance feature bit: this side can seal (it has a secret and this release).
pub const FEATURE_SEAL: u64 = 1 << 0;
/// Hello feature bit: this side requires the connection sealed.
pub const FEATURE_SEAL_REQUIRED: u64 = 1 << 1;
/// Hello feature bit: this side prefers the connection sealed (sealed when both can; a side
/// that cannot is still served, unsealed).
pub const FEATURE_SEAL_PREFERRED: u64 = 1 << 2;

/// What an endpoint asks of its connections' sealing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sealing {
    /// Seal only when the other side prefers or requires it.
    #[default]
    Offer,
    /// Seal whenever the other side can; serve one that cannot (a release before sealing)
    /// unsealed.
    Prefer,
    /// Seal always; refuse a side that cannot.
    Require,
}

impl Sealing {
    /// The feature bits an endpoint with a secret announces.
    pub fn features(self) -> u64 {
        match self {
            Sealing::Offer => FEATURE_SEAL,
            Sealing::Prefer => FEATURE_SEAL | FEATURE_SEAL_PREFERRED,
            Sealing::Require => FEATURE_SEAL | FEATURE_SEAL_PREFERRED | FEATURE_SEAL_REQUIRED,
        }
    }
}

const CHANNEL_LABEL: &[u8] = b"peercache channel v1";
const C2S_LABEL: &[u8] = b"peercache channel v1 client to server";
const S2C_LABEL: &[u8] = b"peercache channel v1 server to client";

type HmacSha256 = Hmac<Sha256>;

/// The two keys of one sealed connection. `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub struct ChannelKeys {
    c2s: [u8; 32],
    s2c: [u8; 32],
}

impl std::fmt::Debug for ChannelKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChannelKeys(..)")
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length; this cannot fail.
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

impl ChannelKeys {
    /// The keys of a connection whose handshake proved `key` over `transcript` (each side
    /// passes the same bytes: both nonces, the Hello frame, the acceptance's body).
    pub fn from_secret_material(key: &[u8; 32], transcript: &[u8]) -> Self {
        let master = mac(key, &[CHANNEL_LABEL, transcript]);
        ChannelKeys {
            c2s: mac(&master, &[C2S_LABEL]),
            s2c: mac(&master, &[S2C_LABEL]),
        }
    }

    /// The connecting side's sealer (client → server) and opener (server → client).
    pub fn client(&self) -> (Sealer, Opener) {
        (Sealer::new(&self.c2s), Opener::new(&self.s2c))
    }

    /// The accepting side's sealer (server → client) and opener (client → server).
    pub fn server(&self) -> (Sealer, Opener) {
        (Sealer::new(&self.s2c), Opener::new(&self.c2s))
    }
}

fn key_of(bytes: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is exactly what AES-256-GCM takes; this cannot fail.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("32-byte AES-256 key"))
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Seals what one side sends, in order.
pub struct Sealer {
    key: LessSafeKey,
    next: u64,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealer(next: {})", self.next)
    }
}

impl Sealer {
    fn new(key: &[u8; 32]) -> Self {
        Sealer {
            key: key_of(key),
            next: 0,
        }
    }

    /// Encrypts `buf[from..]` in place and appends its [`TAG_BYTES`]-byte tag.
    pub fn seal_in_place(&mut self, buf: &mut Vec<u8>, from: usize) -> Result<(), WireError> {
        let counter = self.next;
        self.next = counter.checked_add(1).ok_or_else(exhausted)?;
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(counter), Aad::empty(), &mut buf[from..])
            .map_err(|_| WireError::Integrity("sealing failed".into()))?;
        buf.extend_from_slice(tag.as_ref());
        Ok(())
    }
}

/// Opens what the other side sent, in order.
pub struct Opener {
    key: LessSafeKey,
    next: u64,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Opener(next: {})", self.next)
    }
}

impl Opener {
    fn new(key: &[u8; 32]) -> Self {
        Opener {
            key: key_of(key),
            next: 0,
        }
    }

    /// Verifies and decrypts a sealed frame or record in place; returns the plaintext's
    /// length (the first bytes of `buf`). A tag that does not verify — a byte changed, a
    /// record dropped, replayed or reordered — is [`WireError::Integrity`].
    pub fn open_in_place(&mut self, buf: &mut [u8]) -> Result<usize, WireError> {
        if buf.len() < TAG_BYTES {
            return Err(WireError::Integrity(format!(
                "sealed record of {} bytes is shorter than its tag",
                buf.len()
            )));
        }
        let counter = self.next;
        self.next = counter.checked_add(1).ok_or_else(exhausted)?;
        let plain = self
            .key
            .open_in_place(nonce(counter), Aad::empty(), buf)
            .map_err(|_| {
                WireError::Integrity(format!(
                    "record {counter} failed its integrity check (changed, dropped, replayed \
                     or reordered on the path)"
                ))
            })?;
        Ok(plain.len())
    }
}

fn exhausted() -> WireError {
    WireError::Integrity("2^64 records on one connection: reconnect".into())
}

/// What a handshake decides about sealing, from both sides' feature bits: `Ok(true)` to seal
/// (both can, and one prefers or requires it), `Ok(false)` not to, `Err(reason)` when one side
/// requires it and the other cannot.
pub fn agree(client: u64, server: u64) -> Result<bool, &'static str> {
    let both_can = client & FEATURE_SEAL != 0 && server & FEATURE_SEAL != 0;
    let required = (client | server) & FEATURE_SEAL_REQUIRED != 0;
    let wanted = (client | server) & (FEATURE_SEAL_REQUIRED | FEATURE_SEAL_PREFERRED) != 0;
    match (both_can, required) {
        (false, true) => Err(
            "encryption in transit is required on one side and the other cannot seal (no \
             cluster secret, or a release before sealing)",
        ),
        (true, _) => Ok(wanted),
        (false, false) => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> ((Sealer, Opener), (Sealer, Opener)) {
        let k = ChannelKeys::from_secret_material(&[1; 32], b"hello and accept");
        (k.client(), k.server())
    }

    #[test]
    fn each_direction_round_trips_in_order() {
        let ((mut ctx, mut crx), (mut stx, mut srx)) = pair();
        for i in 0..3u8 {
            let mut f = vec![i; 100];
            ctx.seal_in_place(&mut f, 0).unwrap();
            assert_eq!(f.len(), 100 + TAG_BYTES);
            let n = srx.open_in_place(&mut f).unwrap();
            assert_eq!(&f[..n], &[i; 100][..]);
            let mut r = vec![i + 10; 7];
            stx.seal_in_place(&mut r, 0).unwrap();
            let n = crx.open_in_place(&mut r).unwrap();
            assert_eq!(&r[..n], &[i + 10; 7][..]);
        }
    }

    #[test]
    fn a_flipped_byte_a_replay_a_reorder_and_a_short_record_are_refused() {
        let ((mut ctx, _), (_, mut srx)) = pair();
        let mut a = b"first".to_vec();
        ctx.seal_in_place(&mut a, 0).unwrap();
        let mut b = b"second".to_vec();
        ctx.seal_in_place(&mut b, 0).unwrap();
        let mut flipped = a.clone();
        flipped[2] ^= 1;
        assert!(matches!(
            srx.open_in_place(&mut flipped),
            Err(WireError::Integrity(_))
        ));
        // Reordered: record 1 where record 0 (and then 1) is expected.
        let ((mut ctx, _), (_, mut srx)) = pair();
        let mut a = b"first".to_vec();
        ctx.seal_in_place(&mut a, 0).unwrap();
        let mut b = b"second".to_vec();
        ctx.seal_in_place(&mut b, 0).unwrap();
        assert!(srx.open_in_place(&mut b.clone()).is_err());
        // Replayed: record 0 again where record 2 is expected.
        let ((mut ctx, _), (_, mut srx)) = pair();
        let mut a = b"first".to_vec();
        ctx.seal_in_place(&mut a, 0).unwrap();
        let keep = a.clone();
        assert!(srx.open_in_place(&mut a).is_ok());
        assert!(srx.open_in_place(&mut keep.clone()).is_err());
        assert!(srx.open_in_place(&mut [0u8; 5]).is_err());
    }

    #[test]
    fn keys_differ_by_direction_and_by_transcript() {
        let a = ChannelKeys::from_secret_material(&[1; 32], b"one");
        let b = ChannelKeys::from_secret_material(&[1; 32], b"two");
        assert_ne!(a, b);
        assert_ne!(a.c2s, a.s2c);
        // The server's opener cannot open what the server itself sealed.
        let (mut stx, mut srx) = a.server();
        let mut f = b"x".to_vec();
        stx.seal_in_place(&mut f, 0).unwrap();
        assert!(srx.open_in_place(&mut f).is_err());
        assert_eq!(format!("{a:?}"), "ChannelKeys(..)");
    }

    #[test]
    fn sealing_is_agreed_when_both_can_and_one_prefers_or_requires() {
        let can = Sealing::Offer.features();
        let pre = Sealing::Prefer.features();
        let req = Sealing::Require.features();
        assert_eq!(agree(can, can), Ok(false));
        for (c, s) in [(req, can), (can, req), (pre, can), (can, pre), (pre, req)] {
            assert_eq!(agree(c, s), Ok(true), "{c:#x} {s:#x}");
        }
        // A side that cannot seal (no secret, an earlier release): refused only where required.
        assert!(agree(0, req).is_err());
        assert!(agree(req, 0).is_err());
        assert_eq!(agree(0, pre), Ok(false));
        assert_eq!(agree(pre, 0), Ok(false));
        assert_eq!(agree(0, can), Ok(false));
    }
}

//! The versioned envelope every control-plane message travels in.
//!
//! Layout (little-endian), inside one length-delimited frame:
//!
//! ```text
//! 0      2        3        4      6          8          12
//! | "PC" | version | flags | kind | reserved | body_len | body (postcard) | extensions… |
//! ```
//!
//! Extensions are `tag: u16, len: u32, bytes`. A reader skips tags it does not know unless the
//! tag has [`Extension::CRITICAL`] set, in which case decoding fails with
//! [`WireError::UnknownCriticalExtension`]. This lets a later version add optional data without
//! breaking older readers.

use bytes::{BufMut, BytesMut};
use serde::{Serialize, de::DeserializeOwned};

use crate::WireError;

/// The envelope version this build writes.
pub const WIRE_VERSION: u8 = 1;
/// The oldest envelope version this build reads.
pub const MIN_WIRE_VERSION: u8 = 1;
/// Envelope magic.
pub const MAGIC: [u8; 2] = *b"PC";
/// Size of the fixed envelope header.
pub const HEADER_LEN: usize = 12;

/// A typed message that travels in an envelope.
///
/// `KIND` values are grouped by plane: `0x00xx` handshake, `0x01xx` discovery, `0x02xx`
/// directory, `0x03xx` store control, `0x04xx` transport bootstrap.
pub trait Message: Serialize + DeserializeOwned {
    /// The envelope kind of this message.
    const KIND: u16;
    /// Human-readable name (for errors and logs).
    const NAME: &'static str;
}

/// One optional trailing extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extension {
    /// Tag; bit 15 ([`Extension::CRITICAL`]) means "fail if not understood".
    pub tag: u16,
    /// Payload.
    pub data: Vec<u8>,
}

impl Extension {
    /// Tag bit: readers that do not know this tag must reject the message.
    pub const CRITICAL: u16 = 0x8000;

    /// An extension carrying `value` in postcard.
    ///
    /// # Errors
    /// [`WireError::Malformed`] when `value` cannot be serialized.
    pub fn of<T: Serialize>(tag: u16, value: &T) -> Result<Extension, WireError> {
        let data = postcard::to_allocvec(value).map_err(|e| WireError::Malformed {
            what: "extension",
            detail: e.to_string(),
        })?;
        Ok(Extension { tag, data })
    }
}

/// A decoded envelope header plus borrowed body and extension bytes.
#[derive(Debug, Clone, Copy)]
pub struct Envelope<'a> {
    /// Envelope version of the frame.
    pub version: u8,
    /// Flags (reserved for later use; 0 today).
    pub flags: u8,
    /// Message kind.
    pub kind: u16,
    /// The postcard body.
    pub body: &'a [u8],
    /// Raw extension bytes (parse with [`Envelope::extensions`]).
    pub ext: &'a [u8],
}

impl<'a> Envelope<'a> {
    /// Parses the header of `frame` and checks magic, version and lengths.
    pub fn parse(frame: &'a [u8]) -> Result<Self, WireError> {
        if frame.len() < HEADER_LEN {
            return Err(WireError::Truncated {
                need: HEADER_LEN,
                have: frame.len(),
            });
        }
        let magic = [frame[0], frame[1]];
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        let version = frame[2];
        if !(MIN_WIRE_VERSION..=WIRE_VERSION).contains(&version) {
            return Err(WireError::UnsupportedVersion {
                got: version,
                min: MIN_WIRE_VERSION,
                max: WIRE_VERSION,
            });
        }
        let flags = frame[3];
        let kind = u16::from_le_bytes([frame[4], frame[5]]);
        let body_len = u32::from_le_bytes([frame[8], frame[9], frame[10], frame[11]]) as usize;
        let rest = &frame[HEADER_LEN..];
        if body_len > rest.len() {
            return Err(WireError::Truncated {
                need: HEADER_LEN + body_len,
                have: frame.len(),
            });
        }
        let (body, ext) = rest.split_at(body_len);
        Ok(Envelope {
            version,
            flags,
            kind,
            body,
            ext,
        })
    }

    /// Decodes the body as `M`, checking the kind and every extension's criticality.
    pub fn decode<M: Message>(&self) -> Result<M, WireError> {
        if self.kind != M::KIND {
            return Err(WireError::UnexpectedKind {
                got: self.kind,
                expected: M::KIND,
            });
        }
        self.check_extensions(&[])?;
        postcard::from_bytes(self.body).map_err(|e| WireError::Malformed {
            what: M::NAME,
            detail: e.to_string(),
        })
    }

    /// Iterates the extensions; stops with an error on a malformed list.
    pub fn extensions(&self) -> ExtIter<'a> {
        ExtIter { rest: self.ext }
    }

    /// Fails on a malformed extension list or on a critical tag not in `known`.
    pub fn check_extensions(&self, known: &[u16]) -> Result<(), WireError> {
        for ext in self.extensions() {
            let (tag, _) = ext?;
            if tag & Extension::CRITICAL != 0 && !known.contains(&tag) {
                return Err(WireError::UnknownCriticalExtension { tag });
            }
        }
        Ok(())
    }

    /// Decodes the first extension with `tag` as a postcard `T` (None: absent).
    ///
    /// # Errors
    /// [`WireError::Malformed`] when the extension list or the value does not decode.
    pub fn extension_value<T: DeserializeOwned>(&self, tag: u16) -> Result<Option<T>, WireError> {
        match self.extension(tag)? {
            None => Ok(None),
            Some(data) => postcard::from_bytes(data)
                .map(Some)
                .map_err(|e| WireError::Malformed {
                    what: "extension",
                    detail: e.to_string(),
                }),
        }
    }

    /// Returns the data of the first extension with `tag`.
    pub fn extension(&self, tag: u16) -> Result<Option<&'a [u8]>, WireError> {
        for ext in self.extensions() {
            let (t, data) = ext?;
            if t == tag {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

/// Iterator over `(tag, data)` extension entries.
#[derive(Debug)]
pub struct ExtIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ExtIter<'a> {
    type Item = Result<(u16, &'a [u8]), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.len() < 6 {
            let have = self.rest.len();
            self.rest = &[];
            return Some(Err(WireError::Truncated { need: 6, have }));
        }
        let tag = u16::from_le_bytes([self.rest[0], self.rest[1]]);
        let len =
            u32::from_le_bytes([self.rest[2], self.rest[3], self.rest[4], self.rest[5]]) as usize;
        let body = &self.rest[6..];
        if len > body.len() {
            let have = body.len();
            self.rest = &[];
            return Some(Err(WireError::Truncated { need: len, have }));
        }
        let (data, rest) = body.split_at(len);
        self.rest = rest;
        Some(Ok((tag, data)))
    }
}

/// Encodes `msg` with `extensions` into `out` (appending). Returns the bytes written.
pub fn encode_into<M: Message>(
    msg: &M,
    extensions: &[Extension],
    out: &mut BytesMut,
) -> Result<usize, WireError> {
    let start = out.len();
    out.reserve(HEADER_LEN + 64);
    out.put_slice(&MAGIC);
    out.put_u8(WIRE_VERSION);
    out.put_u8(0);
    out.put_u16_le(M::KIND);
    out.put_u16_le(0);
    let len_at = out.len();
    out.put_u32_le(0);
    let body_start = out.len();
    let writer = (&mut *out).writer();
    postcard::to_io(msg, writer).map_err(|e| WireError::Malformed {
        what: M::NAME,
        detail: e.to_string(),
    })?;
    let body_len = (out.len() - body_start) as u32;
    out[len_at..len_at + 4].copy_from_slice(&body_len.to_le_bytes());
    for ext in extensions {
        out.put_u16_le(ext.tag);
        out.put_u32_le(ext.data.len() as u32);
        out.put_slice(&ext.data);
    }
    Ok(out.len() - start)
}

/// Encodes `msg` into a fresh buffer.
pub fn encode<M: Message>(msg: &M, extensions: &[Extension]) -> Result<Vec<u8>, WireError> {
    let mut out = BytesMut::new();
    encode_into(msg, extensions, &mut out)?;
    Ok(out.to_vec())
}

/// Parses and decodes one frame as `M`.
pub fn decode<M: Message>(frame: &[u8]) -> Result<M, WireError> {
    Envelope::parse(frame)?.decode::<M>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Ping {
        seq: u64,
        note: String,
    }
    impl Message for Ping {
        const KIND: u16 = 0x00f0;
        const NAME: &'static str = "Ping";
    }

    #[test]
    fn round_trip_with_extensions() {
        let msg = Ping {
            seq: 7,
            note: "hi".into(),
        };
        let ext = [Extension {
            tag: 3,
            data: vec![1, 2, 3],
        }];
        let bytes = encode(&msg, &ext).unwrap();
        let env = Envelope::parse(&bytes).unwrap();
        assert_eq!(env.kind, Ping::KIND);
        assert_eq!(env.decode::<Ping>().unwrap(), msg);
        assert_eq!(env.extension(3).unwrap(), Some(&[1u8, 2, 3][..]));
        assert_eq!(env.extension(4).unwrap(), None);
    }

    #[test]
    fn unknown_optional_extension_is_skipped_but_critical_is_rejected() {
        let msg = Ping {
            seq: 1,
            note: String::new(),
        };
        let ok = encode(
            &msg,
            &[Extension {
                tag: 0x0042,
                data: vec![9; 10],
            }],
        )
        .unwrap();
        assert_eq!(decode::<Ping>(&ok).unwrap(), msg);
        let crit = encode(
            &msg,
            &[Extension {
                tag: Extension::CRITICAL | 0x42,
                data: vec![],
            }],
        )
        .unwrap();
        assert!(matches!(
            decode::<Ping>(&crit),
            Err(WireError::UnknownCriticalExtension { tag: 0x8042 })
        ));
    }

    #[test]
    fn version_magic_kind_and_truncation_are_typed_errors() {
        let msg = Ping {
            seq: 1,
            note: "x".into(),
        };
        let good = encode(&msg, &[]).unwrap();
        let mut v = good.clone();
        v[2] = 9;
        assert!(matches!(
            decode::<Ping>(&v),
            Err(WireError::UnsupportedVersion { got: 9, .. })
        ));
        let mut m = good.clone();
        m[0] = b'X';
        assert!(matches!(
            decode::<Ping>(&m),
            Err(WireError::BadMagic { .. })
        ));
        let mut k = good.clone();
        k[4] = 0xee;
        assert!(matches!(
            decode::<Ping>(&k),
            Err(WireError::UnexpectedKind { .. })
        ));
        for cut in 0..good.len() {
            assert!(decode::<Ping>(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_ext = good.clone();
        bad_ext.extend_from_slice(&[1, 0, 0xff, 0xff, 0, 0]);
        assert!(matches!(
            decode::<Ping>(&bad_ext),
            Err(WireError::Truncated { .. })
        ));
    }
}

//! The same-host path's messages: the invitation the data port hands out, and the region
//! table sent with the descriptors. Pure encoding and decoding, fuzzed.

use crate::RegionKey;
use crate::local::error::LocalError;

pub(crate) const REPLY_MAGIC: u32 = 0x5043_484c;
pub(crate) const TABLE_MAGIC: u32 = 0x5043_4854;
pub(crate) const VERSION: u8 = 1;
pub(crate) const TOKEN_LEN: usize = 16;
/// Most regions one owner shares (one file descriptor each in one message).
pub(crate) const MAX_SHARED_REGIONS: usize = 32;
pub(crate) const TABLE_HDR: usize = 12;
pub(crate) const ENTRY_LEN: usize = 32;

/// What the data port tells a host-local client: where to attach and with which token.
#[derive(Clone, Debug)]
pub(crate) struct Invitation {
    pub(crate) name: String,
    pub(crate) token: [u8; TOKEN_LEN],
}

impl Invitation {
    /// Encodes the reply sent on the [`Plane::HostLocal`] plane.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + TOKEN_LEN + self.name.len());
        out.extend_from_slice(&REPLY_MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(self.name.len() as u8);
        out.extend_from_slice(&self.token);
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Self, LocalError> {
        if b.len() < 6 + TOKEN_LEN || b[..4] != REPLY_MAGIC.to_le_bytes() {
            return Err(LocalError::NotOurs("invitation"));
        }
        if b[4] != VERSION {
            return Err(LocalError::Version {
                got: b[4],
                ours: VERSION,
            });
        }
        let n = b[5] as usize;
        let name = b
            .get(6 + TOKEN_LEN..6 + TOKEN_LEN + n)
            .ok_or(LocalError::Truncated("invitation"))?;
        Ok(Invitation {
            name: String::from_utf8(name.to_vec()).map_err(|_| LocalError::BadName)?,
            token: b[6..6 + TOKEN_LEN].try_into().expect("16 bytes"),
        })
    }
}

/// Validates a region table header against the descriptors that came with it; the count.
pub(crate) fn table_count(hdr: &[u8], fds: usize) -> Result<usize, LocalError> {
    if hdr.len() < TABLE_HDR || hdr[..4] != TABLE_MAGIC.to_le_bytes() || hdr[4] != VERSION {
        return Err(LocalError::NotOurs("region table"));
    }
    let count = u32::from_le_bytes(hdr[8..12].try_into().expect("4 bytes")) as usize;
    if count > MAX_SHARED_REGIONS || count != fds {
        return Err(LocalError::CountMismatch { count, fds });
    }
    Ok(count)
}

/// The `count` entries of a table whose header `table_count` accepted: key, the owner's base
/// address, length, file offset.
pub(crate) fn table_entries(body: &[u8], count: usize) -> Vec<(RegionKey, u64, u64, u64)> {
    let word = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    (0..count)
        .map(|i| {
            let at = TABLE_HDR + i * ENTRY_LEN;
            (
                RegionKey(word(at)),
                word(at + 8),
                word(at + 16),
                word(at + 24),
            )
        })
        .collect()
}

/// Runs the host-local decoders (invitation, region table) on arbitrary bytes. For the fuzz
/// target: never a panic, whatever the bytes.
pub(crate) fn fuzz_decode(data: &[u8]) -> usize {
    let inv = Invitation::decode(data).map_or(0, |i| i.name.len());
    let fds = data
        .first()
        .map_or(0, |b| *b as usize % (MAX_SHARED_REGIONS + 2));
    let entries = match data.get(..TABLE_HDR).map(|h| table_count(h, fds)) {
        Some(Ok(count)) if data.len() >= TABLE_HDR + count * ENTRY_LEN => {
            table_entries(&data[..TABLE_HDR + count * ENTRY_LEN], count).len()
        }
        _ => 0,
    };
    inv + entries
}

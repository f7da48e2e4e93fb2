//! Test support (feature `testkit`, for dev-dependencies): wire-message fixtures and test
//! page contents.

pub mod etcd;
pub mod tap;

use std::fmt::Debug;
use std::path::Path;

use crate::envelope::{self, Message};

/// Checks that the committed fixture `dir/name` still decodes to `msg`: the bytes of a released
/// envelope version must keep decoding. With `PEERCACHE_BLESS` set, (re)writes the fixture first
/// — do that only when adding a message, never to make a changed encoding pass.
///
/// # Panics
/// When the fixture is missing, does not decode, or decodes to another value (it is a test).
pub fn check_fixture<M: Message + PartialEq + Debug>(dir: &Path, name: &str, msg: &M) {
    let path = dir.join(name);
    if std::env::var_os("PEERCACHE_BLESS").is_some() {
        std::fs::create_dir_all(dir).expect("creating the fixture folder");
        let bytes = envelope::encode(msg, &[]).expect("encoding the fixture");
        std::fs::write(&path, bytes).expect("writing the fixture");
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    match envelope::decode::<M>(&bytes) {
        Ok(got) => assert_eq!(&got, msg, "fixture {name} decodes to another message"),
        Err(e) => panic!("fixture {name} no longer decodes: {e}"),
    }
}

/// `len` pseudo-random bytes determined by `seed` (xorshift): recognisable test pages, the
/// same in every crate's tests.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

//! The few MessagePack forms a vLLM `KVEventBatch` needs, appended to a caller's buffer (one
//! buffer per batch: no allocation per event). The smallest form of each value is written, as
//! msgspec does, so the bytes decode with any MessagePack reader.

/// Appends `nil`.
pub(crate) fn nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

/// Appends a float64.
pub(crate) fn f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_be_bytes());
}

/// Appends a non-negative integer in its smallest form.
pub(crate) fn uint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=0x7f => out.push(v as u8),
        0x80..=0xff => out.extend_from_slice(&[0xcc, v as u8]),
        0x100..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// Appends a UTF-8 string.
pub(crate) fn str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    match n {
        0..=31 => out.push(0xa0 | n as u8),
        32..=0xff => out.extend_from_slice(&[0xd9, n as u8]),
        0x100..=0xffff => {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdb);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(s.as_bytes());
}

/// Appends a byte string (`bin`); at most 255 bytes are all this module writes.
pub(crate) fn bin8(out: &mut Vec<u8>, b: &[u8]) {
    debug_assert!(b.len() <= 0xff);
    out.extend_from_slice(&[0xc4, b.len() as u8]);
    out.extend_from_slice(b);
}

/// Appends an array header of `n` items.
pub(crate) fn array(out: &mut Vec<u8>, n: usize) {
    header(out, n, 0x90, 0xdc);
}

/// Appends a map header of `n` pairs.
pub(crate) fn map(out: &mut Vec<u8>, n: usize) {
    header(out, n, 0x80, 0xde);
}

fn header(out: &mut Vec<u8>, n: usize, fix: u8, wide16: u8) {
    if n <= 15 {
        out.push(fix | n as u8);
    } else if n <= 0xffff {
        out.push(wide16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        // array32 / map32 follow their 16-bit forms.
        out.push(wide16 + 1);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_is_the_smallest_the_spec_allows() {
        let mut o = Vec::new();
        uint(&mut o, 5);
        uint(&mut o, 200);
        uint(&mut o, 70_000);
        uint(&mut o, 1 << 40);
        assert_eq!(
            o,
            [
                &[5u8][..],
                &[0xcc, 200],
                &[0xce, 0, 1, 0x11, 0x70],
                &[0xcf, 0, 0, 1, 0, 0, 0, 0, 0]
            ]
            .concat()
        );
        let mut o = Vec::new();
        str(&mut o, "GPU");
        str(&mut o, &"x".repeat(40));
        assert_eq!(&o[..4], b"\xa3GPU");
        assert_eq!(&o[4..6], &[0xd9, 40]);
        let mut o = Vec::new();
        array(&mut o, 3);
        array(&mut o, 16);
        map(&mut o, 2);
        array(&mut o, 70_000);
        nil(&mut o);
        assert_eq!(o, [0x93, 0xdc, 0, 16, 0x82, 0xdd, 0, 1, 0x11, 0x70, 0xc0]);
        let mut o = Vec::new();
        f64(&mut o, 1.5);
        bin8(&mut o, &[1, 2]);
        assert_eq!(o, [0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0, 0xc4, 2, 1, 2]);
    }
}

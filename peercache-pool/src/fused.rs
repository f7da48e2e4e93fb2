//! Copy a page into its slot and compute its XXH3-64 checksum in the same pass.
//!
//! Publishing used to copy the page, then hash the destination a second time. Here the copy
//! runs 1 KiB at a time (one XXH3 block) and each block is hashed right after it lands, while it
//! is still in L1, with an AVX2 accumulator when the CPU has it — so the checksum costs almost
//! nothing beyond the copy. The result is the standard XXH3-64 (seed 0, default secret): every
//! reader verifies with any XXH3 implementation (tests compare against `twox-hash` at every
//! length class). Pages of 240 bytes or less use XXH3's short-input paths: those are copied,
//! then hashed with the library.

/// XXH3's default secret (the `kSecret` constant of the XXH3 specification).
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

const STRIPE: usize = 64;
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE) / 8;
const BLOCK: usize = STRIPE * STRIPES_PER_BLOCK;
const P32_1: u64 = 0x9E37_79B1;
const P32_2: u64 = 0x85EB_CA77;
const P32_3: u64 = 0xC2B2_AE3D;
const P64_1: u64 = 0x9E37_79B1_85EB_CA87;
const P64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P64_3: u64 = 0x1656_67B1_9E37_79F9;
const P64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const P64_5: u64 = 0x27D4_EB2F_1656_67C5;

fn read64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Copies `segments` back to back into `dst` and returns XXH3-64 of the copied bytes.
///
/// # Safety
/// `dst` must be valid for writes of the segments' total length and not overlap them.
pub(crate) unsafe fn copy_and_checksum(segments: &[&[u8]], dst: *mut u8) -> u64 {
    let len: usize = segments.iter().map(|s| s.len()).sum();
    if len <= 240 {
        let mut off = 0;
        for s in segments {
            // SAFETY: within the caller's `len` bytes at `dst`.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), dst.add(off), s.len()) };
            off += s.len();
        }
        // SAFETY: just written.
        return crate::header::checksum(unsafe { std::slice::from_raw_parts(dst, len) });
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the caller's contract is forwarded.
        return unsafe { long_avx2(segments, dst, len) };
    }
    // SAFETY: forwarded.
    unsafe { long_generic(segments, dst, len, &mut Scalar) }
}

/// One XXH3 accumulator implementation (the stripe and scramble steps).
trait Lanes {
    /// Folds one 64-byte stripe into `acc` with the secret at `key`.
    fn stripe(&mut self, acc: &mut [u64; 8], data: &[u8], key: usize);
    /// The end-of-block scramble.
    fn scramble(&mut self, acc: &mut [u64; 8]);
}

struct Scalar;

impl Lanes for Scalar {
    fn stripe(&mut self, acc: &mut [u64; 8], data: &[u8], key: usize) {
        for i in 0..8 {
            let v = read64(data, 8 * i);
            let k = v ^ read64(&SECRET, key + 8 * i);
            acc[i ^ 1] = acc[i ^ 1].wrapping_add(v);
            acc[i] = acc[i].wrapping_add((k & 0xFFFF_FFFF).wrapping_mul(k >> 32));
        }
    }

    fn scramble(&mut self, acc: &mut [u64; 8]) {
        for (i, a) in acc.iter_mut().enumerate() {
            let k = read64(&SECRET, SECRET.len() - STRIPE + 8 * i);
            *a = ((*a ^ (*a >> 47)) ^ k).wrapping_mul(P32_1);
        }
    }
}

/// Copies the next `n` bytes of the segments (from cursor `seg`, `at`) to `dst`.
///
/// # Safety
/// `dst` valid for `n` writes; the segments hold at least `n` more bytes.
unsafe fn copy_next(segments: &[&[u8]], seg: &mut usize, at: &mut usize, dst: *mut u8, n: usize) {
    let mut done = 0;
    while done < n {
        let s = segments[*seg];
        let take = (s.len() - *at).min(n - done);
        // SAFETY: `take` bytes remain in the segment and fit the destination range.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().add(*at), dst.add(done), take) };
        done += take;
        *at += take;
        if *at == s.len() {
            *seg += 1;
            *at = 0;
        }
    }
}

/// The long-input XXH3-64 with the copy interleaved, block by block.
///
/// # Safety
/// As [`copy_and_checksum`], and `len` > 240 is the segments' total.
#[inline(always)]
unsafe fn long_generic<L: Lanes>(segments: &[&[u8]], dst: *mut u8, len: usize, l: &mut L) -> u64 {
    let mut acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
    let (mut seg, mut at) = (0usize, 0usize);
    // Skip empty leading segments once, so `copy_next` always finds bytes.
    while segments[seg].is_empty() {
        seg += 1;
    }
    let full_blocks = (len - 1) / BLOCK;
    for b in 0..full_blocks {
        // SAFETY: block `b` lies within `len`.
        let block = unsafe {
            let p = dst.add(b * BLOCK);
            copy_next(segments, &mut seg, &mut at, p, BLOCK);
            std::slice::from_raw_parts(p, BLOCK)
        };
        for s in 0..STRIPES_PER_BLOCK {
            l.stripe(&mut acc, &block[s * STRIPE..], s * 8);
        }
        l.scramble(&mut acc);
    }
    let tail_at = full_blocks * BLOCK;
    let tail_len = len - tail_at;
    // SAFETY: the tail lies within `len`.
    unsafe { copy_next(segments, &mut seg, &mut at, dst.add(tail_at), tail_len) };
    // SAFETY: all `len` bytes are written now.
    let all = unsafe { std::slice::from_raw_parts(dst, len) };
    let stripes = (tail_len - 1) / STRIPE;
    for s in 0..stripes {
        l.stripe(&mut acc, &all[tail_at + s * STRIPE..], s * 8);
    }
    l.stripe(&mut acc, &all[len - STRIPE..], SECRET.len() - STRIPE - 7);
    merge(&acc, (len as u64).wrapping_mul(P64_1))
}

fn merge(acc: &[u64; 8], start: u64) -> u64 {
    let mut r = start;
    for i in 0..4 {
        let a = acc[2 * i] ^ read64(&SECRET, 11 + 16 * i);
        let b = acc[2 * i + 1] ^ read64(&SECRET, 11 + 16 * i + 8);
        let p = (a as u128).wrapping_mul(b as u128);
        r = r.wrapping_add((p as u64) ^ ((p >> 64) as u64));
    }
    r ^= r >> 37;
    r = r.wrapping_mul(0x1656_6791_9E37_79F9);
    r ^ (r >> 32)
}

/// The long-input XXH3-64 fused with the copy, on AVX2: each 64-byte stripe is loaded from the
/// source once, stored to the slot and folded into the eight accumulator lanes (two registers
/// for the whole page) from the same registers — the hash rides on the copy's loads. A stripe
/// that straddles two source segments is assembled in the slot first and read back from there.
///
/// # Safety
/// As [`long_generic`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn long_avx2(segments: &[&[u8]], dst: *mut u8, len: usize) -> u64 {
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn fold(acc: &mut __m256i, d: __m256i, key: *const u8) {
        // SAFETY: 32 readable bytes at `key` (inside SECRET).
        unsafe {
            let k = _mm256_loadu_si256(key as *const __m256i);
            let dk = _mm256_xor_si256(d, k);
            let prod = _mm256_mul_epu32(dk, _mm256_srli_epi64(dk, 32));
            let swapped = _mm256_shuffle_epi32(d, 0b01_00_11_10);
            *acc = _mm256_add_epi64(prod, _mm256_add_epi64(*acc, swapped));
        }
    }

    let init = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
    // SAFETY: AVX2 is enabled for this function (the caller checked the CPU). Source reads stay
    // inside the segments (a stripe is loaded from a segment only when 64 bytes remain in it);
    // writes and read-backs stay inside `dst[..len]`; key reads stay inside SECRET.
    unsafe {
        let mut a0 = _mm256_loadu_si256(init.as_ptr() as *const __m256i);
        let mut a1 = _mm256_loadu_si256(init.as_ptr().add(4) as *const __m256i);
        let secret = SECRET.as_ptr();
        let prime = _mm256_set1_epi64x(P32_1 as i64);
        let sk0 = _mm256_loadu_si256(secret.add(SECRET.len() - STRIPE) as *const __m256i);
        let sk1 = _mm256_loadu_si256(secret.add(SECRET.len() - STRIPE + 32) as *const __m256i);
        let (mut seg, mut at) = (0usize, 0usize);
        while segments[seg].is_empty() {
            seg += 1;
        }
        let mut off = 0usize;
        // One stripe from wherever the source cursor is: straight from the segment when 64
        // bytes remain in it, else assembled in the slot and read back.
        #[inline(always)]
        unsafe fn next_stripe(
            segments: &[&[u8]],
            seg: &mut usize,
            at: &mut usize,
            out: *mut u8,
        ) -> (__m256i, __m256i) {
            // SAFETY: the caller guarantees 64 more source bytes and 64 writable bytes at `out`.
            unsafe {
                let r = if segments[*seg].len() - *at >= STRIPE {
                    let src = segments[*seg].as_ptr().add(*at);
                    let d0 = _mm256_loadu_si256(src as *const __m256i);
                    let d1 = _mm256_loadu_si256(src.add(32) as *const __m256i);
                    _mm256_storeu_si256(out as *mut __m256i, d0);
                    _mm256_storeu_si256(out.add(32) as *mut __m256i, d1);
                    *at += STRIPE;
                    (d0, d1)
                } else {
                    copy_next(segments, seg, at, out, STRIPE);
                    (
                        _mm256_loadu_si256(out as *const __m256i),
                        _mm256_loadu_si256(out.add(32) as *const __m256i),
                    )
                };
                while *seg < segments.len() && *at == segments[*seg].len() {
                    *seg += 1;
                    *at = 0;
                }
                r
            }
        }
        let full_blocks = (len - 1) / BLOCK;
        for _ in 0..full_blocks {
            if seg < segments.len() && segments[seg].len() - at >= BLOCK {
                // Fast path: the whole block comes from one segment.
                let src = segments[seg].as_ptr().add(at);
                let out = dst.add(off);
                for s in 0..STRIPES_PER_BLOCK {
                    let d0 = _mm256_loadu_si256(src.add(s * STRIPE) as *const __m256i);
                    let d1 = _mm256_loadu_si256(src.add(s * STRIPE + 32) as *const __m256i);
                    _mm256_storeu_si256(out.add(s * STRIPE) as *mut __m256i, d0);
                    _mm256_storeu_si256(out.add(s * STRIPE + 32) as *mut __m256i, d1);
                    fold(&mut a0, d0, secret.add(s * 8));
                    fold(&mut a1, d1, secret.add(s * 8 + 32));
                }
                at += BLOCK;
                off += BLOCK;
                while seg < segments.len() && at == segments[seg].len() {
                    seg += 1;
                    at = 0;
                }
            } else {
                for s in 0..STRIPES_PER_BLOCK {
                    let (d0, d1) = next_stripe(segments, &mut seg, &mut at, dst.add(off));
                    fold(&mut a0, d0, secret.add(s * 8));
                    fold(&mut a1, d1, secret.add(s * 8 + 32));
                    off += STRIPE;
                }
            }
            for (acc, key) in [(&mut a0, sk0), (&mut a1, sk1)] {
                let mut v = *acc;
                v = _mm256_xor_si256(v, _mm256_srli_epi64(v, 47));
                v = _mm256_xor_si256(v, key);
                let lo = _mm256_mul_epu32(v, prime);
                let hi = _mm256_mul_epu32(_mm256_srli_epi64(v, 32), prime);
                *acc = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
            }
        }
        let tail_len = len - full_blocks * BLOCK;
        for s in 0..(tail_len - 1) / STRIPE {
            let (d0, d1) = next_stripe(segments, &mut seg, &mut at, dst.add(off));
            fold(&mut a0, d0, secret.add(s * 8));
            fold(&mut a1, d1, secret.add(s * 8 + 32));
            off += STRIPE;
        }
        // The bytes past the last whole stripe: copied, then covered by XXH3's last stripe.
        if off < len {
            copy_next(segments, &mut seg, &mut at, dst.add(off), len - off);
        }
        let last = dst.add(len - STRIPE);
        let key = secret.add(SECRET.len() - STRIPE - 7);
        fold(&mut a0, _mm256_loadu_si256(last as *const __m256i), key);
        fold(
            &mut a1,
            _mm256_loadu_si256(last.add(32) as *const __m256i),
            key.add(32),
        );
        let mut acc = [0u64; 8];
        _mm256_storeu_si256(acc.as_mut_ptr() as *mut __m256i, a0);
        _mm256_storeu_si256(acc.as_mut_ptr().add(4) as *mut __m256i, a1);
        merge(&acc, (len as u64).wrapping_mul(P64_1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u64) -> Vec<u8> {
        peercache_wire::testkit::pattern(seed, len)
    }

    /// Random lengths cut into many segments of random sizes (empty ones, one-byte ones, ones
    /// that straddle stripes and blocks): both accumulators, against the library.
    #[test]
    fn random_segmentations_match() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for round in 0..300 {
            let len = 241 + next(20_000) as usize;
            let src = pattern(len, round);
            let mut cuts = vec![0usize, len];
            for _ in 0..next(40) {
                cuts.push(next(len as u64 + 1) as usize);
            }
            cuts.sort_unstable();
            let segs: Vec<&[u8]> = cuts.windows(2).map(|w| &src[w[0]..w[1]]).collect();
            let want = twox_hash::XxHash3_64::oneshot(&src);
            let mut dst = vec![0u8; len];
            // SAFETY: `dst` holds `len` bytes, disjoint from `src`.
            assert_eq!(unsafe { copy_and_checksum(&segs, dst.as_mut_ptr()) }, want);
            assert_eq!(dst, src);
            let mut dst2 = vec![0u8; len];
            // SAFETY: as above.
            let scalar = unsafe { long_generic(&segs, dst2.as_mut_ptr(), len, &mut Scalar) };
            assert_eq!(scalar, want);
            assert_eq!(dst2, src);
        }
    }

    /// Every length class of XXH3 (short, mid, one stripe, block edges, many blocks), split
    /// into segments at awkward places, against the library — with both accumulators.
    #[test]
    fn matches_xxh3_64_and_copies_exactly() {
        let mut lens: Vec<usize> = vec![0, 1, 3, 16, 17, 128, 129, 240, 241, 255, 256, 1023];
        lens.extend([
            1024,
            1025,
            1087,
            1088,
            1089,
            2047,
            2048,
            2049,
            4096,
            65536,
            131072 + 7,
        ]);
        lens.extend((0..40).map(|i| 241 + i * 997));
        for (n, &len) in lens.iter().enumerate() {
            let src = pattern(len, n as u64 + 3);
            let want = twox_hash::XxHash3_64::oneshot(&src);
            let cuts = [
                0,
                len / 3,
                len / 3 + 1,
                len.saturating_sub(5).max(len / 3 + 1),
                len,
            ];
            let segs: Vec<&[u8]> = cuts
                .windows(2)
                .map(|w| &src[w[0].min(len)..w[1].min(len).max(w[0].min(len))])
                .collect();
            let mut dst = vec![0u8; len];
            // SAFETY: `dst` holds `len` bytes and does not overlap `src`.
            let got = unsafe { copy_and_checksum(&segs, dst.as_mut_ptr()) };
            assert_eq!(got, want, "len {len}");
            assert_eq!(dst, src, "len {len}");
            if len > 240 {
                let mut dst2 = vec![0u8; len];
                // SAFETY: as above.
                let scalar = unsafe { long_generic(&segs, dst2.as_mut_ptr(), len, &mut Scalar) };
                assert_eq!(scalar, want, "scalar, len {len}");
                assert_eq!(dst2, src);
            }
        }
    }
}

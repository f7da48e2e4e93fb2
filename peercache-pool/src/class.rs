//! Size classes: a page of `len` bytes goes into the class whose payload size is `len` rounded
//! up to 1/8 of its power of two (at least 64 bytes). Power-of-two pages, the common KV shape,
//! waste nothing; any other size wastes under 12.5%.

use crate::header::HEADER_LEN;

/// The class payload size for a page of `len` bytes (`len > 0`).
pub fn class_payload(len: u64) -> u64 {
    let p = len.next_power_of_two();
    let g = (p / 8).max(64);
    len.div_ceil(g) * g
}

/// Slot stride of a class: header plus payload, kept 64-byte aligned.
pub fn stride(payload: u64) -> u64 {
    (HEADER_LEN as u64 + payload).div_ceil(64) * 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_of_two_pages_fit_exactly_and_others_waste_little() {
        for p in [4096u64, 8192, 131072, 1 << 20] {
            assert_eq!(class_payload(p), p);
        }
        assert_eq!(class_payload(1), 64);
        assert_eq!(class_payload(100_000), 114_688);
        for len in [65u64, 1000, 5000, 77_777, 1_000_001, 3 << 19] {
            let c = class_payload(len);
            assert!(c >= len);
            assert!(
                (c - len) as f64 / (len as f64) < 0.125 + 64.0 / len as f64,
                "{len} -> {c}"
            );
        }
        assert_eq!(stride(4096), 4160);
        assert_eq!(stride(131072) % 64, 0);
    }
}

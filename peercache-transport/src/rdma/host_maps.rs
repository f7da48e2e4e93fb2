//! Whether an address range is ordinary host memory this process can read and write: the
//! software fabric moves bytes with the CPU, so a "device" address it is given must be one
//! (unified memory, a test's host buffer). A CUDA allocation's address is reserved but not
//! mapped readable on the host, and a CPU copy into it would fault; registration refuses it.

use std::ops::Range;

/// Whether every byte of `[addr, addr + len)` lies in mappings of `/proc/self/maps` that are
/// readable and writable (adjacent mappings may share the range). False where the map cannot
/// be read.
pub(crate) fn host_read_write(addr: u64, len: usize) -> bool {
    match std::fs::read_to_string("/proc/self/maps") {
        Ok(maps) => covered(&read_write_ranges(&maps), addr, len as u64),
        Err(_) => false,
    }
}

/// The `rw` mappings of a `/proc/<pid>/maps` text, in address order.
fn read_write_ranges(maps: &str) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = maps
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (span, perms) = (fields.next()?, fields.next()?);
            if !perms.starts_with("rw") {
                return None;
            }
            let (lo, hi) = span.split_once('-')?;
            Some(u64::from_str_radix(lo, 16).ok()?..u64::from_str_radix(hi, 16).ok()?)
        })
        .collect();
    out.sort_by_key(|r| r.start);
    out
}

/// Whether `ranges` (sorted) cover `[addr, addr + len)` without a gap.
fn covered(ranges: &[Range<u64>], addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut at = addr;
    for r in ranges {
        if at >= end {
            break;
        }
        if r.start <= at && at < r.end {
            at = r.end;
        }
    }
    at >= end
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/x
00652000-00653000 rw-p 00052000 08:02 173521 /usr/bin/x
7f0000000000-7f0000001000 rw-p 00000000 00:00 0
7f0000001000-7f0000003000 rw-s 00000000 00:05 12 /dev/zero
7f0000003000-7f0000004000 ---p 00000000 00:00 0
7f0000004000-7f0000005000 rw-p 00000000 00:00 0
";

    #[test]
    fn adjacent_read_write_mappings_cover_a_range_and_a_gap_or_a_reserved_range_does_not() {
        let r = read_write_ranges(MAPS);
        assert_eq!(r.len(), 4);
        assert!(covered(&r, 0x7f0000000000, 0x3000)); // across two rw mappings
        assert!(covered(&r, 0x7f0000000800, 0x100));
        assert!(!covered(&r, 0x7f0000002000, 0x2000)); // into the ---p reservation
        assert!(!covered(&r, 0x7f0000003000, 0x10)); // reserved, as a device allocation is
        assert!(!covered(&r, 0x00400000, 0x10)); // read-only text
        assert!(!covered(&r, u64::MAX - 1, 0x10)); // wraps
        assert!(covered(&r, 0x7f0000004000, 0)); // empty
    }

    #[test]
    fn this_process_heap_is_read_write_and_a_reserved_address_is_not() {
        let v = vec![7u8; 1 << 16];
        assert!(host_read_write(v.as_ptr() as u64, v.len()));
        // SAFETY: a fresh anonymous reservation with no access, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 16,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(!host_read_write(p as u64, 1 << 16));
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(p, 1 << 16) };
    }
}

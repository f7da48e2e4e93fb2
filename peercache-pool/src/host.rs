//! What the host can give: a pool is refused when it is larger than the memory the kernel says
//! is available (`MemAvailable`), so a mistyped size fails at start with the figures instead of
//! pushing the host into reclaim or the OOM killer halfway through faulting it in.

use crate::PoolError;

/// `MemAvailable` from `/proc/meminfo`, in bytes; `None` when the kernel does not say.
pub(crate) fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// Refuses `size` bytes above `MemAvailable` (passes when the kernel does not say).
pub(crate) fn check_available(size: u64) -> Result<(), PoolError> {
    match mem_available() {
        Some(available) if size > available => Err(PoolError::HostTooSmall {
            asked: size,
            available,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let m = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_mem_available(m), Some(20_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: x kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 1 MB\n"), None);
        assert!(
            mem_available().is_some(),
            "this host's kernel reports MemAvailable"
        );
    }

    #[test]
    fn a_pool_beyond_the_host_is_refused_with_the_figures() {
        let e = check_available(u64::MAX).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, PoolError::HostTooSmall { .. }), "{msg}");
        assert!(msg.contains("MemAvailable") && msg.contains("GiB"), "{msg}");
        assert!(check_available(1 << 20).is_ok());
    }
}

//! The descriptor budget of a node: the soft `RLIMIT_NOFILE` is raised to the hard limit at
//! start, and every listener's connection cap stays below what the process can open, so a
//! connection flood hits the cap (refused, counted, throttled log) rather than `EMFILE`.

/// Descriptors kept out of the connection caps: pool and disk files, outbound connections,
/// RDMA devices, the same-host listener and its leases.
const RESERVED: u64 = 256;
/// Listeners that share the budget: data, control, client API, meta, metrics HTTP.
const LISTENERS: u64 = 5;

/// Raises the soft descriptor limit to the hard one; returns the soft limit now in force.
pub(crate) fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `lim`, a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads `raised`, a valid rlimit no larger than the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            tracing::debug!(
                from = lim.rlim_cur,
                to = lim.rlim_max,
                "raised the descriptor limit"
            );
            return lim.rlim_max;
        }
    }
    lim.rlim_cur
}

/// Each listener's connection cap: the configured one, lowered so that all listeners together
/// stay inside `nofile` with room for the node's own descriptors.
pub(crate) fn connection_cap(configured: usize, nofile: u64) -> usize {
    let budget = nofile.saturating_sub(RESERVED) / LISTENERS;
    let cap = (configured as u64).min(budget.max(16)) as usize;
    if cap < configured {
        tracing::info!(
            configured,
            cap,
            nofile,
            "max_inbound_connections lowered to fit the descriptor limit (ulimit -n)"
        );
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_inside_the_descriptor_limit() {
        assert_eq!(connection_cap(4096, 1 << 20), 4096);
        assert_eq!(connection_cap(4096, 1024), (1024 - 256) / 5);
        assert!(connection_cap(4096, 1024) * 5 + 256 <= 1024);
        assert_eq!(
            connection_cap(4096, 100),
            16,
            "never below a working minimum"
        );
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let now = raise_nofile();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into `lim`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(now, lim.rlim_cur);
    }
}

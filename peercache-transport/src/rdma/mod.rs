//! RDMA availability: which devices this host has, or why RDMA cannot run here.
//!
//! Built with the `rdma` feature, this uses `sideway`, whose `rdma-mummy-sys` loads rdma-core
//! at run time: it builds with only cmake and libclang, and one binary runs on hosts without
//! RDMA libraries. (The `ibverbs` crate wraps no one-sided READ/WRITE and makes binaries fail
//! to start without `libibverbs1`; `async-rdma` is GPL-3.0 with yanked dependencies.)
//!
//! * [`engine`] — the RDMA data path's logic: rails, channel leasing, WR chaining and SGE
//!   chunking, completion deadlines with drain-before-release, counters. It drives any
//!   [`engine::Verbs`] backend through one post/poll interface.
//! * [`soft`] — a software backend of that interface (memory-to-memory, with injectable stalls
//!   and work-completion errors), so `cargo test` exercises the engine without a NIC.
//!
//! * [`bootstrap`] — the RC queue-pair exchange over a TCP connection that first passes the
//!   authenticated `peercache-wire` handshake (plane `RdmaBootstrap`): QPN, PSN, LID/GID, the
//!   negotiated path MTU; the server's queue pair lives as long as the client's socket.
//! * `verbs` (feature `rdma`) — the sideway (rdma-core) backend of the engine's interface:
//!   per-rail device contexts and protection domains, memory regions on every rail with access
//!   flags mapped from the region's access, RC queue pairs with private completion queues
//!   (INIT → RTR → RTS), posting with SGE lists, polling, moving to the error state.
//!
//! * [`mr_cache`] — the bounded cache of lazily registered caller memory (page-aligned
//!   ranges, least recently used out, pinned while a batch uses them, invalidated on request).
//! * [`path`] — puts these together behind the TCP transport's API: regions registered on every
//!   rail, the bootstrap plane served on the data port, reads carried one-sided, TCP for peers
//!   without RDMA. Callers use [`probe`] (and [`memlock_shortfall`]) to log why they run on TCP.

use std::fmt;

/// Why an RDMA step failed: a verbs call, a queue pair's setup or posting, a registration.
/// The verbs library's own message is kept in `reason`, with the call that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RdmaError {
    /// The rail index names no device.
    #[error("no rail {0}")]
    NoRail(usize),
    /// A verbs (rdma-core) call failed.
    #[error("{call} failed: {reason}")]
    Verbs {
        /// The call, e.g. `ibv_reg_mr` or `ibv_modify_qp(RTR)`.
        call: &'static str,
        /// What the library said.
        reason: String,
    },
    /// The queue-pair exchange with a peer failed.
    #[error("queue-pair bootstrap with {peer}: {reason}")]
    Bootstrap {
        /// The peer's bootstrap endpoint.
        peer: String,
        /// Why.
        reason: String,
    },
    /// More work requests than the send queue holds.
    #[error("send queue full: {wanted} work requests for a depth of {depth}")]
    QueueFull {
        /// Outstanding plus newly posted.
        wanted: usize,
        /// The send queue's depth.
        depth: usize,
    },
    /// A work request has more scatter/gather entries than the device takes.
    #[error("{sges} SGEs > max_sge {max}")]
    TooManySges {
        /// Entries in the request.
        sges: usize,
        /// The device's limit.
        max: usize,
    },
    /// Memory could not be registered; the text names the missing prerequisite.
    #[error("{0}")]
    Register(String),
    /// This backend cannot do what was asked.
    #[error("{0}")]
    Unsupported(&'static str),
}

impl RdmaError {
    /// A verbs-call failure, for `map_err`.
    pub fn verbs<E: fmt::Display>(call: &'static str) -> impl FnOnce(E) -> RdmaError {
        move |e| RdmaError::Verbs {
            call,
            reason: e.to_string(),
        }
    }

    /// A bootstrap failure with `peer`, for `map_err`.
    pub fn bootstrap<E: fmt::Display>(peer: &str) -> impl FnOnce(E) -> RdmaError + '_ {
        move |e| RdmaError::Bootstrap {
            peer: peer.to_string(),
            reason: e.to_string(),
        }
    }
}

pub mod bootstrap;
pub mod engine;
pub mod holder;
pub(crate) mod host_maps;
pub mod mr_cache;
pub mod path;
pub(crate) mod route;
pub mod soft;
#[cfg(feature = "rdma")]
pub mod verbs;

/// Why RDMA cannot be used on this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RdmaUnavailable {
    /// This build has no RDMA support (the `rdma` feature is off).
    NotBuilt,
    /// The kernel has no RDMA support (`ENOSYS` from the device list).
    NoKernelSupport,
    /// rdma-core (`libibverbs.so.1`) is not installed (`EOPNOTSUPP`).
    NoLibrary,
    /// rdma-core found no device.
    NoDevices,
    /// A configured device does not exist.
    MissingDevice {
        /// The device asked for.
        wanted: String,
        /// The devices present.
        present: Vec<String>,
    },
    /// Pinning the memory would exceed the locked-memory limit (`ulimit -l`).
    MemlockLimit {
        /// Bytes to pin.
        bytes: u64,
        /// The limit (RLIMIT_MEMLOCK), bytes.
        limit: u64,
    },
    /// Another error from rdma-core.
    Other(String),
}

impl fmt::Display for RdmaUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RdmaUnavailable::NotBuilt => write!(
                f,
                "this build has no RDMA support (built without the `rdma` feature: rebuild with \
                 `cargo build --release -p peercache-store --features rdma`, which needs cmake \
                 and libclang-dev)"
            ),
            RdmaUnavailable::NoKernelSupport => {
                write!(f, "the kernel has no RDMA support (ENOSYS)")
            }
            RdmaUnavailable::NoLibrary => write!(
                f,
                "rdma-core is not installed (libibverbs.so.1 missing: EOPNOTSUPP)"
            ),
            RdmaUnavailable::NoDevices => write!(f, "no RDMA device found"),
            RdmaUnavailable::MissingDevice { wanted, present } => {
                write!(f, "RDMA device {wanted:?} not found (present: {present:?})")
            }
            RdmaUnavailable::MemlockLimit { bytes, limit } => write!(
                f,
                "pinning {bytes} bytes for RDMA exceeds the locked-memory limit (ulimit -l = \
                 {limit} bytes, no CAP_IPC_LOCK); raise it: `ulimit -l unlimited`, `memlock \
                 unlimited` in /etc/security/limits.conf, `LimitMEMLOCK=infinity` (systemd) or \
                 `--ulimit memlock=-1` (docker)"
            ),
            RdmaUnavailable::Other(e) => write!(f, "rdma-core failed: {e}"),
        }
    }
}

/// The RDMA devices present (all of `wanted` must be among them), or why there are none.
#[cfg(feature = "rdma")]
pub fn probe(wanted: &[String]) -> Result<Vec<String>, RdmaUnavailable> {
    use sideway::ibverbs::device::{DeviceInfo, DeviceList, GetDeviceListErrorKind};
    let list = match DeviceList::new() {
        Ok(l) => l,
        Err(e) => {
            #[allow(unreachable_patterns)] // the error kinds are #[non_exhaustive]
            let why = match &e.0 {
                GetDeviceListErrorKind::Ibverbs(io) => match io.raw_os_error() {
                    Some(libc::ENOSYS) => RdmaUnavailable::NoKernelSupport,
                    Some(libc::EOPNOTSUPP) => RdmaUnavailable::NoLibrary,
                    _ => RdmaUnavailable::Other(io.to_string()),
                },
                other => RdmaUnavailable::Other(other.to_string()),
            };
            return Err(why);
        }
    };
    let present: Vec<String> = list.iter().map(|d| d.name()).collect();
    if present.is_empty() {
        return Err(RdmaUnavailable::NoDevices);
    }
    if let Some(w) = wanted.iter().find(|w| !present.contains(w)) {
        return Err(RdmaUnavailable::MissingDevice {
            wanted: w.clone(),
            present,
        });
    }
    Ok(present)
}

/// Why pinning `bytes` more for RDMA would fail here: the locked-memory limit is lower and
/// the process lacks `CAP_IPC_LOCK` (which lifts the limit). None = it fits (or no limit).
pub fn memlock_shortfall(bytes: u64) -> Option<RdmaUnavailable> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0
        && lim.rlim_cur != libc::RLIM_INFINITY
    {
        Some(lim.rlim_cur)
    } else {
        None
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    memlock_verdict(bytes, limit, has_ipc_lock(&status))
}

/// The decision of [`memlock_shortfall`] on given facts.
fn memlock_verdict(bytes: u64, limit: Option<u64>, ipc_lock: bool) -> Option<RdmaUnavailable> {
    match limit {
        Some(limit) if !ipc_lock && bytes > limit => {
            Some(RdmaUnavailable::MemlockLimit { bytes, limit })
        }
        _ => None,
    }
}

/// Whether the effective capabilities in a `/proc/<pid>/status` text include `CAP_IPC_LOCK`.
fn has_ipc_lock(status: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Without the `rdma` feature there is nothing to probe.
#[cfg(not(feature = "rdma"))]
pub fn probe(_wanted: &[String]) -> Result<Vec<String>, RdmaUnavailable> {
    Err(RdmaUnavailable::NotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memlock_check_names_ulimit_and_respects_cap_ipc_lock() {
        let e = memlock_verdict(1 << 30, Some(8 << 20), false).unwrap();
        let text = e.to_string();
        assert!(
            text.contains("ulimit -l = 8388608") && text.contains("LimitMEMLOCK"),
            "{text}"
        );
        assert_eq!(memlock_verdict(1 << 20, Some(8 << 20), false), None);
        assert_eq!(memlock_verdict(1 << 30, None, false), None);
        assert_eq!(memlock_verdict(1 << 30, Some(8 << 20), true), None);
        assert!(has_ipc_lock("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_ipc_lock("CapEff:\t0000000000000000\n"));
        assert!(has_ipc_lock("CapEff:\t0000000000004000\n"));
        assert!(!has_ipc_lock("no capabilities line"));
        // The live check agrees with the verdict on this process's facts.
        assert_eq!(memlock_shortfall(0), None);
    }

    #[test]
    fn probe_reports_a_reason_on_a_host_without_rdma() {
        let has_nic =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        if has_nic {
            return; // a real NIC: covered by the validation procedure in docs/operations.md
        }
        let err = probe(&[]).unwrap_err();
        if cfg!(feature = "rdma") {
            assert!(
                matches!(
                    err,
                    RdmaUnavailable::NoKernelSupport
                        | RdmaUnavailable::NoLibrary
                        | RdmaUnavailable::NoDevices
                ),
                "{err:?}"
            );
        } else {
            assert_eq!(err, RdmaUnavailable::NotBuilt);
        }
        assert!(!err.to_string().is_empty());
    }
}

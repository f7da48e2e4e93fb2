//! A software RDMA backend: queue pairs that execute one-sided READ and WRITE between memory
//! regions of this process, with the completion semantics of RC queue pairs — in-order
//! execution, completions only for signaled requests and for errors, an error moving the queue
//! pair to the error state, and every outstanding request flushed (with a completion) when it
//! is in that state. Faults are injectable: stall a queue pair (nothing executes until
//! released), or fail the n-th request with a status. The engine's tests run on it.

use super::RdmaError;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::bootstrap::{self, QpInfo, Responder};
use super::engine::{Completion, MAX_RAILS, QueuePair, RdmaOp, Verbs, WcStatus, WorkRequest};
use super::path::{RailKeys, Registrar};
use crate::Access;

/// A registered remote region: its rkey maps to (base, len, writable) and the host address
/// that backs `base` (the same for host memory; the mapping of a device region's dma-buf).
#[derive(Clone, Copy, Debug)]
struct Mr {
    base: u64,
    len: u64,
    writable: bool,
    host: u64,
}

/// A local registration: (rail, base, len) by lkey, and the host address backing `base`.
#[derive(Clone, Copy, Debug)]
struct LocalMr {
    rail: usize,
    base: u64,
    len: u64,
    host: u64,
}

/// The shared "fabric": remote regions by rkey, local registrations by lkey, and fault
/// switches.
#[derive(Debug, Default)]
pub struct Fabric {
    mrs: Mutex<HashMap<u32, Mr>>,
    lmrs: Mutex<HashMap<u32, LocalMr>>,
    /// Device regions' dma-buf mappings (address, length) by their first lkey.
    dev_maps: Mutex<HashMap<u32, (usize, usize)>>,
    next_rkey: AtomicU64,
    /// While set, posted requests do not execute (a stalled peer or link).
    pub stall: AtomicBool,
    /// Fail the request with this global sequence number (0: none) with status 12
    /// (`IBV_WC_RETRY_EXC_ERR`).
    pub fail_at: AtomicU64,
    executed: AtomicU64,
    /// While set, a queue pair in error does not flush its queued requests (a device that never
    /// completes them); destroying the queue pair discards them unexecuted.
    pub never_flush: AtomicBool,
    /// Requests still queued on some queue pair (to check drain-before-release).
    pub outstanding: AtomicU64,
    /// Per rail, microseconds a posted request waits before it executes (a slow link).
    pub rail_delay_us: [AtomicU64; MAX_RAILS],
    /// While set, every post and poll is appended to `events` (which rail, in what order).
    pub record_events: AtomicBool,
    /// Posts and polls in order, while `record_events` is set.
    pub events: Mutex<Vec<RailEvent>>,
    /// Bytes moved.
    pub bytes: AtomicU64,
}

impl Fabric {
    /// A fabric with no regions.
    pub fn new() -> Arc<Fabric> {
        Arc::new(Fabric::default())
    }

    fn note(&self, e: RailEvent) {
        if self.record_events.load(Ordering::Acquire) {
            self.events.lock().push(e);
        }
    }

    /// Registers `len` bytes at `base` as a remote region; returns its rkey.
    ///
    /// # Safety
    /// The memory must stay valid while any queue pair may execute requests against it.
    pub unsafe fn register(&self, base: *mut u8, len: usize, writable: bool) -> u32 {
        self.register_at(base as u64, base as u64, len, writable)
    }

    /// Registers `len` bytes addressed as `base` and backed by host memory at `host`.
    fn register_at(&self, base: u64, host: u64, len: usize, writable: bool) -> u32 {
        let rkey = self.next_rkey.fetch_add(1, Ordering::Relaxed) as u32 + 1;
        self.mrs.lock().insert(
            rkey,
            Mr {
                base,
                len: len as u64,
                writable,
                host,
            },
        );
        rkey
    }

    /// Registers `len` bytes at `base` as local memory on each of `rails` rails; returns the
    /// local key of each rail (distinct keys, as separate devices would give).
    pub fn register_local(&self, base: *const u8, len: usize, rails: usize) -> Vec<u32> {
        self.register_local_at(base as u64, base as u64, len, rails)
    }

    /// Local registrations (one per rail) whose range starts at the page holding `addr`.
    pub fn local_registrations_at(&self, addr: u64) -> usize {
        let page = addr & !4095;
        self.lmrs.lock().values().filter(|m| m.base == page).count()
    }

    fn register_local_at(&self, base: u64, host: u64, len: usize, rails: usize) -> Vec<u32> {
        let mut lmrs = self.lmrs.lock();
        (0..rails)
            .map(|rail| {
                let lkey = self.next_rkey.fetch_add(1, Ordering::Relaxed) as u32 + 1;
                lmrs.insert(
                    lkey,
                    LocalMr {
                        rail,
                        base,
                        len: len as u64,
                        host,
                    },
                );
                lkey
            })
            .collect()
    }
}

/// A post or a poll on a rail, as the fabric saw it (`Fabric::events`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RailEvent {
    /// Requests posted on this rail.
    Post(usize),
    /// Its completion queue polled.
    Poll(usize),
}

/// How a software queue pair is connected: directly, or through a real bootstrap exchange with
/// the peer's transport (so its bootstrap plane is exercised).
#[derive(Debug, Clone)]
pub struct SoftBootstrap {
    /// This node.
    pub node: Option<peercache_wire::NodeId>,
    /// Cluster authentication.
    pub auth: peercache_wire::auth::Auth,
    /// Deadline of one exchange.
    pub timeout: std::time::Duration,
}

/// The software verbs: `rails` rails over one fabric, queue pairs of the given geometry.
#[derive(Debug, Clone)]
pub struct SoftVerbs {
    /// Connect through the peer's bootstrap plane (peer strings are then `host:port`).
    pub bootstrap: Option<SoftBootstrap>,
    /// The fabric.
    pub fabric: Arc<Fabric>,
    /// Rails.
    pub rails: usize,
    /// Most SGEs per request.
    pub max_sge: usize,
    /// Send-queue depth.
    pub sq_depth: usize,
    /// Queue pairs connected so far, per rail.
    pub connects: Arc<Mutex<Vec<u64>>>,
    /// Emulate implicit on-demand paging: local keys that cover every address.
    pub odp: Option<[u32; MAX_RAILS]>,
}

impl SoftVerbs {
    /// Software verbs over `fabric`.
    pub fn new(fabric: Arc<Fabric>, rails: usize, max_sge: usize, sq_depth: usize) -> Self {
        SoftVerbs {
            bootstrap: None,
            fabric,
            rails,
            max_sge,
            sq_depth,
            connects: Arc::new(Mutex::new(vec![0; rails])),
            odp: None,
        }
    }

    /// Turns on emulated implicit on-demand paging: one local registration per rail covering
    /// every address, as an implicit ODP region on a NIC does.
    pub fn with_implicit_odp(mut self) -> Self {
        let lkeys = self
            .fabric
            .register_local_at(0, 0, usize::MAX, self.rails.min(MAX_RAILS));
        let mut keys = [0; MAX_RAILS];
        keys[..lkeys.len()].copy_from_slice(&lkeys);
        self.odp = Some(keys);
        self
    }
}

impl Verbs for SoftVerbs {
    type Qp = SoftQp;

    fn rails(&self) -> usize {
        self.rails
    }

    fn connect(&self, peer: &str, rail: usize) -> Result<SoftQp, RdmaError> {
        if rail >= self.rails {
            return Err(RdmaError::NoRail(rail));
        }
        let keepalive = match &self.bootstrap {
            None => None,
            Some(b) => {
                let addr = peer.parse().map_err(RdmaError::bootstrap(peer))?;
                let local = QpInfo {
                    rail: rail as u8,
                    qpn: 1 + self.connects.lock().iter().sum::<u64>() as u32,
                    psn: 1,
                    lid: 0,
                    gid: [0; 16],
                    mtu: 5,
                    rd_atomic: 16,
                };
                let done = bootstrap::connect(addr, b.node.clone(), &b.auth, &local, b.timeout)
                    .map_err(RdmaError::bootstrap(peer))?;
                Some(done.keepalive)
            }
        };
        self.connects.lock()[rail] += 1;
        Ok(SoftQp {
            _keepalive: keepalive,
            fabric: self.fabric.clone(),
            rail,
            max_sge: self.max_sge,
            sq_depth: self.sq_depth,
            sq: VecDeque::new(),
            posted_at: VecDeque::new(),
            cq: VecDeque::new(),
            error: false,
        })
    }
}

/// A software queue pair with its private completion queue.
#[derive(Debug)]
pub struct SoftQp {
    _keepalive: Option<std::net::TcpStream>,
    fabric: Arc<Fabric>,
    /// The rail it was connected on.
    pub rail: usize,
    max_sge: usize,
    sq_depth: usize,
    sq: VecDeque<WorkRequest>,
    /// When each request of `sq` was posted (same order).
    posted_at: VecDeque<Instant>,
    cq: VecDeque<Completion>,
    error: bool,
}

impl Drop for SoftQp {
    /// Destroying a queue pair discards what it still holds: nothing executes afterwards.
    fn drop(&mut self) {
        let n = self.sq.len() as u64;
        self.sq.clear();
        self.posted_at.clear();
        self.fabric.outstanding.fetch_sub(n, Ordering::AcqRel);
    }
}

impl SoftQp {
    /// Executes queued requests in order (unless the fabric is stalled).
    fn progress(&mut self) {
        let delay =
            Duration::from_micros(self.fabric.rail_delay_us[self.rail].load(Ordering::Acquire));
        while !self.error && !self.fabric.stall.load(Ordering::Acquire) {
            if self.posted_at.front().is_some_and(|t| t.elapsed() < delay) {
                break; // the slow link has not delivered it yet
            }
            let Some(wr) = self.sq.pop_front() else { break };
            self.posted_at.pop_front();
            self.fabric.outstanding.fetch_sub(1, Ordering::AcqRel);
            let seq = self.fabric.executed.fetch_add(1, Ordering::AcqRel) + 1;
            let status = if self.fabric.fail_at.load(Ordering::Acquire) == seq {
                WcStatus::Error(12)
            } else {
                self.execute(&wr)
            };
            if status != WcStatus::Success {
                self.error = true;
            }
            if wr.signaled || status != WcStatus::Success {
                self.cq.push_back(Completion {
                    wr_id: wr.wr_id,
                    status,
                });
            }
        }
        if self.error {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.fabric.never_flush.load(Ordering::Acquire) {
            return;
        }
        self.posted_at.clear();
        while let Some(wr) = self.sq.pop_front() {
            self.fabric.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.cq.push_back(Completion {
                wr_id: wr.wr_id,
                status: WcStatus::Flushed,
            });
        }
    }

    fn execute(&self, wr: &WorkRequest) -> WcStatus {
        // Every local segment must lie in memory registered on this queue pair's rail, under
        // the key given (IBV_WC_LOC_PROT_ERR otherwise); each is translated to the host memory
        // that backs it.
        let mut local: SmallVec<[u64; 4]> = SmallVec::new();
        {
            let lmrs = self.fabric.lmrs.lock();
            for s in &wr.sges {
                match lmrs.get(&s.lkey) {
                    Some(m)
                        if m.rail == self.rail
                            && crate::validate::contains(
                                m.base,
                                m.len,
                                s.addr,
                                u64::from(s.len),
                            ) =>
                    {
                        local.push(m.host + (s.addr - m.base));
                    }
                    _ => return WcStatus::Error(4),
                }
            }
        }
        let total: u64 = wr.sges.iter().map(|s| s.len as u64).sum();
        let Some(mr) = self.fabric.mrs.lock().get(&wr.rkey).copied() else {
            return WcStatus::Error(10); // remote access error
        };
        let inside = crate::validate::contains(mr.base, mr.len, wr.remote_addr, total);
        if !inside || (wr.op == RdmaOp::Write && !mr.writable) {
            return WcStatus::Error(10);
        }
        let mut remote = mr.host + (wr.remote_addr - mr.base);
        for (s, &l) in wr.sges.iter().zip(&local) {
            // SAFETY: the remote range is inside a registered region (checked above) and
            // translated to the host memory backing it; local segments are the engine caller's
            // registered memory, translated likewise, valid while the request is outstanding
            // (the engine drains before returning).
            unsafe {
                match wr.op {
                    RdmaOp::Read => std::ptr::copy_nonoverlapping(
                        remote as *const u8,
                        l as *mut u8,
                        s.len as usize,
                    ),
                    RdmaOp::Write => std::ptr::copy_nonoverlapping(
                        l as *const u8,
                        remote as *mut u8,
                        s.len as usize,
                    ),
                }
            }
            remote += s.len as u64;
        }
        self.fabric.bytes.fetch_add(total, Ordering::Relaxed);
        WcStatus::Success
    }
}

impl QueuePair for SoftQp {
    fn post(&mut self, wrs: &[WorkRequest]) -> Result<(), RdmaError> {
        if self.sq.len() + wrs.len() > self.sq_depth + 1 {
            return Err(RdmaError::QueueFull {
                wanted: self.sq.len() + wrs.len(),
                depth: self.sq_depth + 1,
            });
        }
        if let Some(w) = wrs.iter().find(|w| w.sges.len() > self.max_sge) {
            return Err(RdmaError::TooManySges {
                sges: w.sges.len(),
                max: self.max_sge,
            });
        }
        self.fabric
            .outstanding
            .fetch_add(wrs.len() as u64, Ordering::AcqRel);
        self.sq.extend(wrs.iter().cloned());
        let now = Instant::now();
        self.posted_at.extend(wrs.iter().map(|_| now));
        self.fabric.note(RailEvent::Post(self.rail));
        if self.error {
            self.flush();
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        self.fabric.note(RailEvent::Poll(self.rail));
        self.progress();
        let n = max.min(self.cq.len());
        out.extend(self.cq.drain(..n));
        n
    }

    fn to_error(&mut self) {
        self.error = true;
        self.flush();
    }

    fn max_sge(&self) -> usize {
        self.max_sge
    }

    fn sq_depth(&self) -> usize {
        self.sq_depth
    }
}

impl Registrar for SoftVerbs {
    fn local_any(&self) -> Option<[u32; MAX_RAILS]> {
        self.odp
    }

    unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RailKeys, RdmaError> {
        let rkey = match access {
            Access::LocalOnly => 0,
            // SAFETY: forwarded from the caller.
            a => unsafe { self.fabric.register(ptr, len, a == Access::RemoteReadWrite) },
        };
        let mut keys = RailKeys {
            lkeys: [0; MAX_RAILS],
            rkeys: [0; MAX_RAILS],
        };
        for (rail, l) in self
            .fabric
            .register_local(ptr, len, self.rails.min(MAX_RAILS))
            .into_iter()
            .enumerate()
        {
            keys.lkeys[rail] = l;
            keys.rkeys[rail] = rkey;
        }
        Ok(keys)
    }

    /// Device memory on the software fabric: a dma-buf fd is mapped (any shareable fd, such as
    /// a memfd, stands in for a GPU driver's export) and the region is addressed by its `iova`,
    /// an address this process never dereferences — every access goes through the mapping, as
    /// a NIC's would go through the exporter. A plain device address is accessed by the CPU, so
    /// it must be host memory this process can read and write (unified memory, a test's buffer):
    /// anything else (a CUDA allocation's address) is refused, never faulted on later.
    unsafe fn register_device(
        &self,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<RailKeys, RdmaError> {
        let (host, mapped) = match *mem {
            crate::DeviceMemory::Dmabuf {
                fd, offset, len, ..
            } => {
                let off = libc::off_t::try_from(offset)
                    .map_err(|_| RdmaError::Unsupported("dma-buf offset too large"))?;
                // SAFETY: a fresh shared mapping of the caller's fd; unmapped at deregister.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        fd,
                        off,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(RdmaError::Verbs {
                        call: "mmap(dma-buf)",
                        reason: std::io::Error::last_os_error().to_string(),
                    });
                }
                (p as u64, Some((p as usize, len)))
            }
            crate::DeviceMemory::PeerMem { addr, len } => {
                if !super::host_maps::host_read_write(addr, len) {
                    return Err(RdmaError::Unsupported(
                        "the software fabric moves bytes with the CPU: this device address is not \
                         host memory it can read and write (a GPU allocation needs a NIC with \
                         nvidia-peermem or dma-buf)",
                    ));
                }
                (addr, None)
            }
        };
        let (base, len) = (mem.base(), mem.len());
        let rkey = match access {
            Access::LocalOnly => 0,
            a => self
                .fabric
                .register_at(base, host, len, a == Access::RemoteReadWrite),
        };
        let mut keys = RailKeys {
            lkeys: [0; MAX_RAILS],
            rkeys: [0; MAX_RAILS],
        };
        let lkeys = self
            .fabric
            .register_local_at(base, host, len, self.rails.min(MAX_RAILS));
        for (rail, l) in lkeys.into_iter().enumerate() {
            keys.lkeys[rail] = l;
            keys.rkeys[rail] = rkey;
        }
        if let Some(m) = mapped {
            self.fabric.dev_maps.lock().insert(keys.lkeys[0], m);
        }
        Ok(keys)
    }

    fn deregister(&self, keys: &RailKeys) {
        {
            let mut lmrs = self.fabric.lmrs.lock();
            for l in keys.lkeys.iter().filter(|l| **l != 0) {
                lmrs.remove(l);
            }
        }
        if keys.rkeys[0] != 0 {
            self.fabric.mrs.lock().remove(&keys.rkeys[0]);
        }
        if let Some((p, len)) = self.fabric.dev_maps.lock().remove(&keys.lkeys[0]) {
            // SAFETY: the mapping made in `register_device`; no key names it any more.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

impl Responder for SoftVerbs {
    type Held = ();

    fn rails(&self) -> usize {
        self.rails
    }

    fn accept(&self, remote: &QpInfo) -> Result<(QpInfo, ()), RdmaError> {
        let mine = QpInfo {
            rail: remote.rail,
            qpn: 0x100 + remote.qpn,
            psn: 1,
            lid: 0,
            gid: [0; 16],
            mtu: bootstrap::negotiate_mtu(5, remote.mtu),
            rd_atomic: 16,
        };
        Ok((mine, ()))
    }
}

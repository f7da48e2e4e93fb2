//! The rdma-core backend of the engine, on `sideway`: one device context and protection domain
//! per rail, memory regions registered on every rail, and RC queue pairs — each with a private
//! completion queue — connected through [`super::bootstrap`] over the authenticated handshake.
//!
//! Queue-pair setup: INIT with the region access the peer may use, then RTR with the peer's
//! QPN, PSN, address (GID with a GRH when `gid_index` ≥ 0, else the LID) and the negotiated
//! path MTU (the smaller active MTU), then RTS with our PSN, `timeout` 14 (≈ 67 ms × retries),
//! 7 retries, and as many outstanding RDMA READs as both devices allow.
//!
//! This backend needs an RDMA NIC; it is compiled (and linted) in CI, and validated by the
//! two-host procedure in `docs/rdma-validation.md`. The engine logic above it is tested with
//! the software backend.

use super::RdmaError;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_mummy_sys::ibv_sge;
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{ExtendedCompletionQueue, GenericCompletionQueue};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair as _, QueuePairAttribute, QueuePairState,
    SetScatterGatherEntry, WorkRequestFlags,
};

use peercache_wire::NodeId;
use peercache_wire::auth::Auth;

use super::RdmaUnavailable;
use super::bootstrap::{self, QpInfo, Responder};
use super::engine::{Completion, MAX_RAILS, QueuePair, RdmaOp, Verbs, WcStatus, WorkRequest};
use super::path::{RailKeys, Registrar};
use crate::region::Access;

/// Settings of the verbs backend.
#[derive(Clone, Debug)]
pub struct VerbsConfig {
    /// One device per rail (rails pair by index with the peer's).
    pub devices: Vec<String>,
    /// Port on each device.
    pub ib_port: u8,
    /// GID index (−1: InfiniBand LID addressing, no GRH).
    pub gid_index: i32,
    /// Send-queue depth of each queue pair.
    pub sq_depth: u32,
    /// Most SGEs per work request (capped by the device).
    pub max_sge: u32,
    /// This node (sent in the bootstrap handshake).
    pub node: Option<NodeId>,
    /// Cluster authentication for the bootstrap.
    pub auth: Auth,
    /// Deadline of one bootstrap exchange.
    pub bootstrap_timeout: Duration,
}

/// One rail: a device's context, protection domain and port facts.
struct Rail {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    gid: Gid,
    lid: u16,
    mtu: u8,
    max_sge: u32,
    rd_atomic: u8,
}

/// The sideway backend.
pub struct SidewayVerbs {
    rails: Vec<Rail>,
    cfg: VerbsConfig,
    /// Registrations made through [`Registrar`], by their rail-0 lkey.
    held: parking_lot::Mutex<std::collections::HashMap<u32, RailRegions>>,
    /// An implicit on-demand-paging registration of the whole address space on every rail,
    /// when every device supports it: unregistered caller memory then needs no registration.
    odp: Option<RailRegions>,
}

impl std::fmt::Debug for SidewayVerbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidewayVerbs")
            .field("devices", &self.cfg.devices)
            .finish()
    }
}

/// A memory region registered on every rail.
pub struct RailRegions {
    mrs: Vec<Arc<MemoryRegion>>,
}

impl RailRegions {
    /// Local key on `rail`.
    pub fn lkey(&self, rail: usize) -> u32 {
        self.mrs[rail].lkey()
    }

    /// Remote key on `rail`.
    pub fn rkey(&self, rail: usize) -> u32 {
        self.mrs[rail].rkey()
    }

    /// Rails it is registered on.
    pub fn rails(&self) -> usize {
        self.mrs.len()
    }
}

/// Registers the whole address space with on-demand paging on every rail (an *implicit* ODP
/// memory region: the NIC resolves pages through the process's page tables at access time, so
/// it stays correct across `munmap` and reuse). None when any device lacks implicit ODP.
fn implicit_odp(rails: &[Rail]) -> Option<RailRegions> {
    let flags = AccessFlags::LocalWrite | AccessFlags::OnDemand;
    let mut mrs = Vec::with_capacity(rails.len());
    for r in rails {
        // SAFETY: an implicit ODP region pins nothing and grants only local access; the NIC
        // faults pages in through the page tables, so no range has to stay mapped.
        match unsafe { r.pd.reg_mr(0, usize::MAX, flags) } {
            Ok(mr) => mrs.push(mr),
            Err(e) => {
                tracing::debug!(error = %e, "no implicit on-demand paging: unregistered memory is registered per batch");
                return None;
            }
        }
    }
    tracing::info!("implicit on-demand paging: unregistered caller memory needs no registration");
    Some(RailRegions { mrs })
}

fn other(e: impl std::fmt::Display) -> RdmaUnavailable {
    RdmaUnavailable::Other(e.to_string())
}

/// The memory-region access flags for a region's [`Access`].
pub fn access_flags(access: Access) -> AccessFlags {
    match access {
        Access::LocalOnly => AccessFlags::LocalWrite,
        Access::RemoteRead => AccessFlags::LocalWrite | AccessFlags::RemoteRead,
        Access::RemoteReadWrite => {
            AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite
        }
    }
}

impl SidewayVerbs {
    /// Opens every configured device (all must exist; [`super::probe`] explains why not).
    pub fn open(cfg: VerbsConfig) -> Result<SidewayVerbs, RdmaUnavailable> {
        let present = super::probe(&cfg.devices)?;
        let names = if cfg.devices.is_empty() {
            present.into_iter().take(1).collect()
        } else {
            cfg.devices.clone()
        };
        let list = DeviceList::new().map_err(other)?;
        let mut rails = Vec::with_capacity(names.len());
        for name in &names {
            let dev = list.iter().find(|d| d.name() == *name).ok_or_else(|| {
                RdmaUnavailable::MissingDevice {
                    wanted: name.clone(),
                    present: list.iter().map(|d| d.name()).collect(),
                }
            })?;
            let ctx = dev.open().map_err(other)?;
            let attr = ctx.query_device().map_err(other)?;
            let port = ctx.query_port(cfg.ib_port).map_err(other)?;
            let gid = if cfg.gid_index >= 0 {
                ctx.query_gid(cfg.ib_port, cfg.gid_index as u32)
                    .map_err(other)?
            } else {
                Gid::default()
            };
            let pd = ctx.alloc_pd().map_err(other)?;
            rails.push(Rail {
                pd,
                gid,
                lid: port.lid(),
                mtu: port.active_mtu() as u32 as u8,
                max_sge: (attr.max_sge().max(1) as u32).min(cfg.max_sge.max(1)),
                rd_atomic: attr.max_qp_rd_atom().clamp(1, 16) as u8,
                ctx,
            });
        }
        let odp = implicit_odp(&rails);
        Ok(SidewayVerbs {
            rails,
            cfg,
            held: parking_lot::Mutex::new(std::collections::HashMap::new()),
            odp,
        })
    }

    /// Registers `len` bytes at `ptr` on every rail with the access `access` grants.
    ///
    /// # Safety
    /// The memory must stay valid (and not be unmapped) until the returned regions are dropped,
    /// and no queue pair may target it after that.
    pub unsafe fn register_rails(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RailRegions, RdmaUnavailable> {
        let flags = access_flags(access);
        let mut mrs = Vec::with_capacity(self.rails.len());
        for r in &self.rails {
            // SAFETY: forwarded from the caller.
            let mr = unsafe { r.pd.reg_mr(ptr as usize, len, flags) };
            // A pinning failure under a low `ulimit -l` says so, not just "ENOMEM".
            mrs.push(
                mr.map_err(|e| super::memlock_shortfall(len as u64).unwrap_or_else(|| other(e)))?,
            );
        }
        Ok(RailRegions { mrs })
    }

    /// A new queue pair on `rail` in INIT, with its completion queue and our PSN.
    fn create(
        &self,
        rail: usize,
    ) -> Result<(BasicQueuePair, Arc<ExtendedCompletionQueue>, u32), RdmaError> {
        let r = self.rails.get(rail).ok_or(RdmaError::NoRail(rail))?;
        let depth = self.cfg.sq_depth.max(1);
        let cq = r
            .ctx
            .create_cq_builder()
            .setup_cqe(depth + 1)
            // The extended CQ polls without allocating (ibv_start_poll / ibv_next_poll).
            .build_ex()
            .map_err(RdmaError::verbs("ibv_create_cq_ex"))?;
        let handle = GenericCompletionQueue::from(Arc::clone(&cq));
        let mut qp =
            r.pd.create_qp_builder()
                .setup_max_send_wr(depth)
                .setup_max_recv_wr(1)
                .setup_max_send_sge(r.max_sge)
                .setup_max_recv_sge(1)
                .setup_send_cq(handle.clone())
                .setup_recv_cq(handle)
                .build()
                .map_err(RdmaError::verbs("ibv_create_qp"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(self.cfg.ib_port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteRead | AccessFlags::RemoteWrite,
            );
        qp.modify(&attr)
            .map_err(RdmaError::verbs("ibv_modify_qp(INIT)"))?;
        let psn = u32::from_le_bytes(
            peercache_wire::auth::nonce().map_err(RdmaError::verbs("getrandom(psn)"))?[..4]
                .try_into()
                .expect("4 bytes"),
        ) & 0x00ff_ffff;
        Ok((qp, cq, psn))
    }

    fn info(&self, rail: usize, qp: &BasicQueuePair, psn: u32) -> QpInfo {
        let r = &self.rails[rail];
        QpInfo {
            rail: rail as u8,
            qpn: qp.qp_number(),
            psn,
            lid: r.lid,
            gid: r.gid.raw,
            mtu: r.mtu,
            rd_atomic: r.rd_atomic,
        }
    }

    /// RTR then RTS against `remote`; returns the path MTU both ends now use (verbs code).
    fn connect_to(
        &self,
        rail: usize,
        qp: &mut BasicQueuePair,
        psn: u32,
        remote: &QpInfo,
    ) -> Result<u8, RdmaError> {
        let r = &self.rails[rail];
        let mtu = bootstrap::negotiate_mtu(r.mtu, remote.mtu);
        let rd = r.rd_atomic.min(remote.rd_atomic).max(1);
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(Mtu::from(u32::from(mtu)))
            .setup_dest_qp_num(remote.qpn)
            .setup_rq_psn(remote.psn)
            .setup_max_dest_read_atomic(rd)
            .setup_min_rnr_timer(12);
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(remote.lid)
            .setup_port(self.cfg.ib_port)
            .setup_service_level(0);
        if self.cfg.gid_index >= 0 {
            ah.setup_grh_src_gid_index(self.cfg.gid_index as u8)
                .setup_grh_dest_gid(&Gid { raw: remote.gid })
                .setup_grh_hop_limit(64);
        }
        attr.setup_address_vector(&ah);
        qp.modify(&attr)
            .map_err(RdmaError::verbs("ibv_modify_qp(RTR)"))?;
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(psn)
            .setup_timeout(14)
            .setup_retry_cnt(7)
            .setup_rnr_retry(7)
            .setup_max_read_atomic(rd);
        qp.modify(&attr)
            .map_err(RdmaError::verbs("ibv_modify_qp(RTS)"))?;
        Ok(mtu)
    }

    /// The active MTU of `rail`'s port (verbs code: 1 = 256 bytes … 5 = 4096), what this end
    /// offers when a queue pair is connected.
    pub fn active_mtu(&self, rail: usize) -> u8 {
        self.rails[rail].mtu
    }
}

/// A connected queue pair of this backend.
pub struct SidewayQp {
    qp: BasicQueuePair,
    cq: Arc<ExtendedCompletionQueue>,
    max_sge: usize,
    depth: usize,
    /// Client side: keeps the peer's queue pair alive (dropped after `qp`).
    _keepalive: Option<std::net::TcpStream>,
    /// The path MTU negotiated with the peer (verbs code).
    path_mtu: u8,
    sges: Vec<ibv_sge>,
    /// Completions of one poll (capacity fixed at creation).
    wcs: Vec<rdma_mummy_sys::ibv_wc>,
}

impl SidewayQp {
    /// The path MTU this queue pair runs with: the smaller of both ends' active MTUs (verbs
    /// code: 1 = 256 bytes … 5 = 4096; bytes = `128 << code`).
    pub fn path_mtu(&self) -> u8 {
        self.path_mtu
    }
}

impl QueuePair for SidewayQp {
    fn post(&mut self, wrs: &[WorkRequest]) -> Result<(), RdmaError> {
        let mut guard = self.qp.start_post_send();
        for wr in wrs {
            let flags = if wr.signaled {
                WorkRequestFlags::Signaled
            } else {
                WorkRequestFlags::none()
            };
            self.sges.clear();
            self.sges.extend(wr.sges.iter().map(|s| ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            }));
            let h = guard.construct_wr(wr.wr_id, flags);
            let h = match wr.op {
                RdmaOp::Read => h.setup_read(wr.rkey, wr.remote_addr),
                RdmaOp::Write => h.setup_write(wr.rkey, wr.remote_addr),
            };
            // SAFETY: the engine's callers keep every local segment registered and valid until
            // the request completes or is flushed (drain-before-release).
            unsafe { h.setup_sge_list(&self.sges) };
        }
        guard.post().map_err(RdmaError::verbs("ibv_post_send"))
    }

    fn poll(&mut self, out: &mut Vec<Completion>, _max: usize) -> usize {
        // `ibv_poll_cq` into a buffer allocated once per queue pair. (The extended CQ's
        // start/next/end poll returned one completion over and over on rxe after a poll round
        // that drained the queue, so a later batch never saw its own completions.)
        let cap = self.wcs.capacity().max(1);
        // SAFETY: the completion queue lives as long as `self.cq`; an extended CQ starts with
        // the fields of `ibv_cq` (rdma-core's `ibv_cq_ex_to_cq` is this cast), and `wcs` has
        // room for `cap` entries, which is what the call may write.
        let n = unsafe {
            let cq = sideway::ibverbs::completion::CompletionQueue::cq(&*self.cq);
            rdma_mummy_sys::ibv_poll_cq(cq.as_ptr(), cap as i32, self.wcs.as_mut_ptr())
        };
        if n < 0 {
            tracing::warn!(code = n, "polling a completion queue failed");
            return 0;
        }
        // SAFETY: the provider wrote the first `n` (≤ cap) entries.
        unsafe { self.wcs.set_len(n as usize) };
        let before = out.len();
        for wc in &self.wcs {
            let status = if wc.status == rdma_mummy_sys::ibv_wc_status::IBV_WC_SUCCESS {
                WcStatus::Success
            } else if wc.status == rdma_mummy_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                WcStatus::Flushed
            } else {
                WcStatus::Error(wc.status)
            };
            out.push(Completion {
                wr_id: wc.wr_id,
                status,
            });
        }
        self.wcs.clear();
        out.len() - before
    }

    fn to_error(&mut self) {
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Error);
        if let Err(e) = self.qp.modify(&attr) {
            tracing::warn!(error = %e, "moving a queue pair to the error state failed");
        }
    }

    fn max_sge(&self) -> usize {
        self.max_sge
    }

    fn sq_depth(&self) -> usize {
        self.depth
    }
}

impl SidewayVerbs {
    fn wrap(
        &self,
        rail: usize,
        qp: BasicQueuePair,
        cq: Arc<ExtendedCompletionQueue>,
        keepalive: Option<std::net::TcpStream>,
        path_mtu: u8,
    ) -> SidewayQp {
        SidewayQp {
            qp,
            cq,
            path_mtu,
            max_sge: self.rails[rail].max_sge as usize,
            depth: self.cfg.sq_depth.max(1) as usize,
            _keepalive: keepalive,
            sges: Vec::with_capacity(self.rails[rail].max_sge as usize),
            wcs: Vec::with_capacity(self.cfg.sq_depth.max(1) as usize + 1),
        }
    }
}

impl Verbs for SidewayVerbs {
    type Qp = SidewayQp;

    fn rails(&self) -> usize {
        self.rails.len()
    }

    /// `peer` is the peer's bootstrap endpoint (`host:port`).
    fn connect(&self, peer: &str, rail: usize) -> Result<SidewayQp, RdmaError> {
        let addr: SocketAddr = peer.parse().map_err(RdmaError::bootstrap(peer))?;
        let (mut qp, cq, psn) = self.create(rail)?;
        let local = self.info(rail, &qp, psn);
        let b = bootstrap::connect(
            addr,
            self.cfg.node.clone(),
            &self.cfg.auth,
            &local,
            self.cfg.bootstrap_timeout,
        )
        .map_err(RdmaError::bootstrap(peer))?;
        let mtu = self.connect_to(rail, &mut qp, psn, &b.remote)?;
        Ok(self.wrap(rail, qp, cq, Some(b.keepalive), mtu))
    }
}

impl SidewayVerbs {
    /// Registers device memory on every rail: a dma-buf with `ibv_reg_dmabuf_mr`, a plain
    /// device address with `ibv_reg_mr` (only while `nvidia-peermem` is loaded).
    ///
    /// # Safety
    /// The device memory and the dma-buf fd must stay valid until the regions are dropped.
    unsafe fn register_device_rails(
        &self,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<RailRegions, RdmaError> {
        let flags = access_flags(access);
        let mut mrs = Vec::with_capacity(self.rails.len());
        for (i, r) in self.rails.iter().enumerate() {
            let mr = match *mem {
                crate::DeviceMemory::Dmabuf {
                    fd,
                    offset,
                    len,
                    iova,
                } => {
                    // SAFETY: forwarded from the caller.
                    unsafe { r.pd.reg_dmabuf_mr(offset, len, iova, fd, flags) }.map_err(|e| {
                        RdmaError::Register(format!(
                            "ibv_reg_dmabuf_mr on rail {i} failed: {e} (needs Linux >= 5.12 \
                             and a NIC driver with dma-buf support, e.g. mlx5 with rdma-core \
                             >= 34; or use a device address with nvidia-peermem)"
                        ))
                    })?
                }
                crate::DeviceMemory::PeerMem { addr, len } => {
                    if !crate::peermem_loaded() {
                        return Err(RdmaError::Register(crate::device::NO_PEERMEM.into()));
                    }
                    // SAFETY: forwarded from the caller.
                    unsafe { r.pd.reg_mr(addr as usize, len, flags) }.map_err(|e| {
                        RdmaError::Register(format!(
                            "ibv_reg_mr of device memory on rail {i} failed: {e}"
                        ))
                    })?
                }
            };
            mrs.push(mr);
        }
        Ok(RailRegions { mrs })
    }

    fn keys_of(&self, regions: RailRegions, access: Access) -> RailKeys {
        let mut keys = RailKeys {
            lkeys: [0; MAX_RAILS],
            rkeys: [0; MAX_RAILS],
        };
        for rail in 0..regions.rails().min(MAX_RAILS) {
            keys.lkeys[rail] = regions.lkey(rail);
            keys.rkeys[rail] = if access == Access::LocalOnly {
                0
            } else {
                regions.rkey(rail)
            };
        }
        self.held.lock().insert(keys.lkeys[0], regions);
        keys
    }
}

impl Registrar for SidewayVerbs {
    fn local_any(&self) -> Option<[u32; MAX_RAILS]> {
        let odp = self.odp.as_ref()?;
        let mut lkeys = [0; MAX_RAILS];
        for (rail, l) in lkeys.iter_mut().enumerate().take(odp.rails()) {
            *l = odp.lkey(rail);
        }
        Some(lkeys)
    }

    unsafe fn register_device(
        &self,
        mem: &crate::DeviceMemory,
        access: Access,
    ) -> Result<RailKeys, RdmaError> {
        // SAFETY: forwarded from the caller.
        let regions = unsafe { self.register_device_rails(mem, access) }?;
        Ok(self.keys_of(regions, access))
    }

    unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RailKeys, RdmaError> {
        // SAFETY: forwarded from the caller.
        let regions = unsafe { self.register_rails(ptr, len, access) }
            .map_err(|e| RdmaError::Register(e.to_string()))?;
        Ok(self.keys_of(regions, access))
    }

    fn deregister(&self, keys: &RailKeys) {
        // Dropping the memory regions deregisters them on every rail.
        self.held.lock().remove(&keys.lkeys[0]);
    }
}

impl Responder for SidewayVerbs {
    type Held = SidewayQp;

    fn rails(&self) -> usize {
        self.rails.len()
    }

    fn accept(&self, remote: &QpInfo) -> Result<(QpInfo, SidewayQp), RdmaError> {
        let rail = usize::from(remote.rail);
        let (mut qp, cq, psn) = self.create(rail)?;
        let mine = self.info(rail, &qp, psn);
        let mtu = self.connect_to(rail, &mut qp, psn, remote)?;
        Ok((mine, self.wrap(rail, qp, cq, None, mtu)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_maps_to_the_least_memory_region_access() {
        assert_eq!(access_flags(Access::LocalOnly), AccessFlags::LocalWrite);
        let r = access_flags(Access::RemoteRead);
        assert!(r.contains(AccessFlags::RemoteRead) && !r.contains(AccessFlags::RemoteWrite));
        assert!(access_flags(Access::RemoteReadWrite).contains(AccessFlags::RemoteWrite));
    }

    #[test]
    fn opening_without_a_nic_is_a_typed_reason() {
        let has_nic =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        if has_nic {
            return; // covered by docs/rdma-validation.md on real hardware
        }
        let cfg = VerbsConfig {
            devices: vec![],
            ib_port: 1,
            gid_index: 3,
            sq_depth: 64,
            max_sge: 16,
            node: None,
            auth: Auth::none(),
            bootstrap_timeout: Duration::from_secs(1),
        };
        let e = SidewayVerbs::open(cfg).unwrap_err();
        assert!(
            matches!(
                e,
                RdmaUnavailable::NoKernelSupport
                    | RdmaUnavailable::NoLibrary
                    | RdmaUnavailable::NoDevices
            ),
            "{e:?}"
        );
    }
}

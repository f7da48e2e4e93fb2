//! Device (GPU) memory for GPUDirect RDMA: memory the CPU must not touch, reachable only
//! through an RDMA NIC.
//!
//! Two ways to hand it to the NIC, as rdma-core offers them:
//! * [`DeviceMemory::Dmabuf`] — a dma-buf file descriptor exported by the GPU driver (CUDA:
//!   `cuMemGetHandleForAddressRange` with `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`), registered with
//!   `ibv_reg_dmabuf_mr`. Needs Linux ≥ 5.12 and a NIC driver with dma-buf support (mlx5 in
//!   rdma-core ≥ 34); the preferred path.
//! * [`DeviceMemory::PeerMem`] — a plain device virtual address registered with `ibv_reg_mr`,
//!   which works only while the `nvidia-peermem` kernel module is loaded.
//!
//! A device region lives in the transport's region table like host memory (same keys, same
//! bounds checks) but is marked device-only: the TCP data plane never reads or writes it, on
//! either side, and answers ops that name it with [`crate::OpError::DeviceOnly`].

use std::os::fd::RawFd;

/// A range of device memory to register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceMemory {
    /// `len` bytes at `offset` in the dma-buf `fd`, addressed as `iova..iova+len` in batches
    /// (use the device virtual address, so segments name the memory as the GPU does).
    Dmabuf {
        /// The dma-buf file descriptor (the caller keeps it open while registered).
        fd: RawFd,
        /// Offset of the range in the dma-buf.
        offset: u64,
        /// Length in bytes.
        len: usize,
        /// The address batches use for the first byte.
        iova: u64,
    },
    /// `len` bytes at device virtual address `addr` (needs `nvidia-peermem`).
    PeerMem {
        /// Device virtual address.
        addr: u64,
        /// Length in bytes.
        len: usize,
    },
}

impl DeviceMemory {
    /// The address batches use for the first byte.
    pub fn base(&self) -> u64 {
        match *self {
            DeviceMemory::Dmabuf { iova, .. } => iova,
            DeviceMemory::PeerMem { addr, .. } => addr,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match *self {
            DeviceMemory::Dmabuf { len, .. } | DeviceMemory::PeerMem { len, .. } => len,
        }
    }

    /// True if the range is empty (registration refuses it).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Whether the `nvidia-peermem` module (or its predecessor `nv_peer_mem`) is loaded.
pub fn peermem_loaded() -> bool {
    ["/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"]
        .iter()
        .any(|p| std::path::Path::new(p).exists())
}

/// The error for a device address registered without `nvidia-peermem`.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) const NO_PEERMEM: &str = "a plain device address needs the nvidia-peermem kernel \
     module (`modprobe nvidia-peermem`; check `lsmod | grep nvidia_peermem`), or register a \
     dma-buf fd instead (DeviceMemory::Dmabuf: Linux >= 5.12, NIC driver with dma-buf support)";

//! The CUDA runtime, loaded when `drive --gpu` asks for it: device memory for readers to read
//! into over GPUDirect RDMA, and a strided copy back to the host to check what landed.
//!
//! Nothing here links against CUDA: the bench builds and runs on hosts without it, and
//! [`Cuda::load`] names every library it tried when there is none. The runtime library is
//! `PEERCACHE_CUDART` if set, else the first of `libcudart.so`, `libcudart.so.13`,
//! `libcudart.so.12` and `libcudart.so.11.0` the loader finds; the driver library
//! (`libcuda.so.1`) is optional and gives two things: the dma-buf export of an allocation
//! (`cuMemGetHandleForAddressRange`, CUDA ≥ 11.7) and synchronous memory operations on it
//! (`CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`, so a copy issued after an RDMA completion sees the
//! bytes the NIC wrote, as NVIDIA's GPUDirect RDMA guide asks).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use peercache_store::DeviceMemory;

/// `cudaError_t` / `CUresult`: 0 is success.
type Status = c_int;
/// `cudaMemcpyDeviceToHost`.
const DEVICE_TO_HOST: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_SYNC_MEMOPS`.
const SYNC_MEMOPS: c_int = 6;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const DMA_BUF_FD: c_int = 1;
/// Allocations are rounded to this (a dma-buf export wants host-page-aligned ranges; CUDA's
/// large allocations are 2 MiB-aligned).
const GRANULE: usize = 2 << 20;

type GetDeviceCount = unsafe extern "C" fn(*mut c_int) -> Status;
type SetDevice = unsafe extern "C" fn(c_int) -> Status;
type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> Status;
type Free = unsafe extern "C" fn(*mut c_void) -> Status;
type Memset = unsafe extern "C" fn(*mut c_void, c_int, usize) -> Status;
type Synchronize = unsafe extern "C" fn() -> Status;
type Memcpy2d =
    unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, usize, usize, c_int) -> Status;
type ErrorString = unsafe extern "C" fn(Status) -> *const c_char;
type PointerSetAttribute = unsafe extern "C" fn(*const c_void, c_int, u64) -> Status;
type GetHandleForAddressRange = unsafe extern "C" fn(*mut c_void, u64, usize, c_int, u64) -> Status;

/// The runtime libraries tried, in order, when `PEERCACHE_CUDART` is not set.
pub const RUNTIME_NAMES: [&str; 4] = [
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
];

/// The CUDA runtime's entry points the bench uses (and two optional driver ones).
pub struct Cuda {
    get_device_count: GetDeviceCount,
    set_device: SetDevice,
    malloc: Malloc,
    free: Free,
    memset: Memset,
    synchronize: Synchronize,
    memcpy_2d: Memcpy2d,
    error_string: ErrorString,
    pointer_set_attribute: Option<PointerSetAttribute>,
    get_handle_for_range: Option<GetHandleForAddressRange>,
    // The function pointers above stay valid while these are loaded.
    _runtime: libloading::Library,
    _driver: Option<libloading::Library>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("dmabuf_export", &self.get_handle_for_range.is_some())
            .finish_non_exhaustive()
    }
}

/// Copies a symbol's function pointer out of `lib`.
///
/// # Safety
/// `T` must be the symbol's real C signature.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
    // SAFETY: forwarded: `T` is the symbol's signature; the caller keeps `lib` loaded while
    // it uses the pointer.
    let s = unsafe { lib.get::<T>(name.as_bytes()) }
        .with_context(|| format!("the CUDA library has no {name}"))?;
    Ok(*s)
}

impl Cuda {
    /// Loads the CUDA runtime (and, if present, the driver library). The error names every
    /// library tried and why each failed.
    pub fn load() -> Result<Arc<Cuda>> {
        let names: Vec<String> = match std::env::var("PEERCACHE_CUDART") {
            Ok(p) if !p.is_empty() => vec![p],
            _ => RUNTIME_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut last = None;
        let mut runtime = None;
        for n in &names {
            // SAFETY: loading the CUDA runtime runs its initialisers, which have no
            // preconditions on this process.
            match unsafe { libloading::Library::new(n) } {
                Ok(l) => {
                    runtime = Some(l);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(runtime) = runtime else {
            bail!(
                "no CUDA runtime on this host (tried {}; the loader said: {}); set \
                 PEERCACHE_CUDART to its path",
                names.join(", "),
                last.map_or_else(String::new, |e| e.to_string())
            );
        };
        // SAFETY: as above, for the driver library.
        let driver = unsafe { libloading::Library::new("libcuda.so.1") }.ok();
        // SAFETY: each type below is the documented C signature of the symbol it names.
        unsafe {
            Ok(Arc::new(Cuda {
                get_device_count: symbol(&runtime, "cudaGetDeviceCount")?,
                set_device: symbol(&runtime, "cudaSetDevice")?,
                malloc: symbol(&runtime, "cudaMalloc")?,
                free: symbol(&runtime, "cudaFree")?,
                memset: symbol(&runtime, "cudaMemset")?,
                synchronize: symbol(&runtime, "cudaDeviceSynchronize")?,
                memcpy_2d: symbol(&runtime, "cudaMemcpy2D")?,
                error_string: symbol(&runtime, "cudaGetErrorString")?,
                pointer_set_attribute: driver
                    .as_ref()
                    .and_then(|d| symbol(d, "cuPointerSetAttribute").ok()),
                get_handle_for_range: driver
                    .as_ref()
                    .and_then(|d| symbol(d, "cuMemGetHandleForAddressRange").ok()),
                _runtime: runtime,
                _driver: driver,
            }))
        }
    }

    /// `Ok` for status 0; otherwise the runtime's own words for `status`.
    fn check(&self, status: Status, what: &str) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString takes any code and returns a static NUL-terminated string
        // (or null).
        let p = unsafe { (self.error_string)(status) };
        let text = if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null, NUL-terminated, static (see above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        bail!("{what}: CUDA error {status} ({text})")
    }

    /// GPUs this process sees.
    pub fn device_count(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        let s = unsafe { (self.get_device_count)(&mut n) };
        self.check(s, "cudaGetDeviceCount")?;
        Ok(n.max(0) as usize)
    }

    fn use_device(&self, device: c_int) -> Result<()> {
        // SAFETY: plain call; an invalid ordinal is an error status.
        self.check(unsafe { (self.set_device)(device) }, "cudaSetDevice")
    }
}

/// How device memory is registered with the NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuRegister {
    /// A dma-buf if the driver exports one, else a device address (nvidia-peermem).
    Auto,
    /// A dma-buf only (kernel ≥ 5.12 and a NIC driver with dma-buf MRs).
    Dmabuf,
    /// The device address (needs the nvidia-peermem module).
    Peermem,
}

/// `len` bytes of device memory on one GPU, freed on drop.
pub struct CudaArena {
    cuda: Arc<Cuda>,
    device: c_int,
    ptr: u64,
    len: usize,
    dmabuf: Option<OwnedFd>,
}

impl std::fmt::Debug for CudaArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaArena")
            .field("device", &self.device)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("dmabuf", &self.dmabuf.is_some())
            .finish()
    }
}

impl CudaArena {
    /// Allocates at least `len` bytes (zeroed) on GPU `device`, exported as `register` says.
    pub fn new(cuda: Arc<Cuda>, device: usize, len: usize, register: GpuRegister) -> Result<Self> {
        let device = c_int::try_from(device).context("GPU ordinal")?;
        let len = len.max(1).div_ceil(GRANULE) * GRANULE;
        cuda.use_device(device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer.
        cuda.check(unsafe { (cuda.malloc)(&mut p, len) }, "cudaMalloc")?;
        let mut arena = CudaArena {
            cuda: cuda.clone(),
            device,
            ptr: p as u64,
            len,
            dmabuf: None,
        };
        // SAFETY: `p` is this allocation of `len` bytes.
        cuda.check(unsafe { (cuda.memset)(p, 0, len) }, "cudaMemset")?;
        // The memset may run asynchronously: it must be done before the NIC writes here.
        // SAFETY: plain call.
        cuda.check(unsafe { (cuda.synchronize)() }, "cudaDeviceSynchronize")?;
        if let Some(set) = cuda.pointer_set_attribute {
            let one: u32 = 1;
            // SAFETY: SYNC_MEMOPS takes a pointer to an unsigned int; `ptr` is an allocation.
            let s = unsafe { set(std::ptr::from_ref(&one).cast(), SYNC_MEMOPS, arena.ptr) };
            cuda.check(s, "cuPointerSetAttribute(SYNC_MEMOPS)")?;
        } else {
            tracing::warn!(
                "libcuda.so.1 not loaded: device memory is used without SYNC_MEMOPS (reads \
                 back after an RDMA completion may need an explicit synchronisation)"
            );
        }
        if register != GpuRegister::Peermem {
            match arena.export_dmabuf() {
                Ok(fd) => arena.dmabuf = Some(fd),
                Err(e) if register == GpuRegister::Dmabuf => return Err(e),
                Err(e) => tracing::info!("no dma-buf for GPU memory ({e:#}); using peermem"),
            }
        }
        Ok(arena)
    }

    fn export_dmabuf(&self) -> Result<OwnedFd> {
        let Some(get) = self.cuda.get_handle_for_range else {
            bail!("the CUDA driver has no cuMemGetHandleForAddressRange (CUDA ≥ 11.7)");
        };
        let mut fd: c_int = -1;
        // SAFETY: the handle of a DMA_BUF_FD range is an int; the range is this allocation
        // (2 MiB-aligned length; CUDA aligns allocations this large).
        let s = unsafe {
            get(
                std::ptr::from_mut(&mut fd).cast(),
                self.ptr,
                self.len,
                DMA_BUF_FD,
                0,
            )
        };
        self.cuda.check(s, "cuMemGetHandleForAddressRange")?;
        if fd < 0 {
            bail!("cuMemGetHandleForAddressRange returned no file descriptor");
        }
        // SAFETY: the driver just created `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for CudaArena {
    fn drop(&mut self) {
        self.dmabuf = None;
        let _ = self.cuda.use_device(self.device);
        // SAFETY: `ptr` came from cudaMalloc and is freed once, here.
        let s = unsafe { (self.cuda.free)(self.ptr as *mut c_void) };
        if let Err(e) = self.cuda.check(s, "cudaFree") {
            tracing::warn!("{e:#}");
        }
    }
}

impl crate::cmd::drive::devpool::DeviceArena for CudaArena {
    fn memory(&self) -> DeviceMemory {
        match &self.dmabuf {
            Some(fd) => DeviceMemory::Dmabuf {
                fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                offset: 0,
                len: self.len,
                iova: self.ptr,
            },
            None => DeviceMemory::PeerMem {
                addr: self.ptr,
                len: self.len,
            },
        }
    }

    fn base(&self) -> u64 {
        self.ptr
    }

    fn bytes(&self) -> usize {
        self.len
    }

    fn read_rows(&self, off: usize, pitch: usize, width: usize, out: &mut [u8]) -> Result<()> {
        let rows = crate::cmd::drive::devpool::check_rows(self.len, off, pitch, width, out.len())?;
        if rows == 0 {
            return Ok(());
        }
        self.cuda.use_device(self.device)?;
        // SAFETY: `check_rows` keeps every source row inside the allocation and `out` holds
        // `rows × width` bytes; a device-to-host copy into pageable memory is synchronous.
        let s = unsafe {
            (self.cuda.memcpy_2d)(
                out.as_mut_ptr().cast(),
                width,
                (self.ptr + off as u64) as *const c_void,
                pitch,
                width,
                rows,
                DEVICE_TO_HOST,
            )
        };
        self.cuda.check(s, "cudaMemcpy2D")
    }
}

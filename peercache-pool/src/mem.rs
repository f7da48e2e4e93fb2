//! Where the pool's memory comes from: one contiguous mapping — private anonymous memory
//! ([`MmapAlloc`]) or a sealed memory file other processes on the host can map read-only
//! ([`MemfdAlloc`]) — faulted in before it serves: all at once ([`RegionAlloc::map`]) or by the
//! pool, slab by slab, on background threads ([`RegionAlloc::map_unfaulted`]).

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::PoolError;

/// A source of pool memory. The default is [`MmapAlloc`]; a pinned or NUMA-placed allocator
/// can implement this trait later.
pub trait RegionAlloc: Send + Sync {
    /// Maps `len` bytes, every page already faulted in.
    fn map(&self, len: usize) -> Result<Mapping, PoolError>;

    /// Maps `len` bytes and leaves faulting to the caller (the pool faults its slabs in on
    /// background threads and uses each once it is in; see [`Mapping::is_populated`]). The
    /// default maps through [`RegionAlloc::map`], already faulted.
    fn map_unfaulted(&self, len: usize) -> Result<Mapping, PoolError> {
        self.map(len)
    }
}

/// An anonymous private mapping; tries explicit huge pages when asked, falls back to normal
/// pages (with transparent-huge-page advice given before the first fault); [`RegionAlloc::map`]
/// faults every page in on several threads (with progress in the log for a large pool).
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapAlloc {
    /// Try `MAP_HUGETLB` first.
    pub hugepages: bool,
}

/// An owned mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    huge: bool,
    /// Every page already faulted in.
    populated: bool,
    /// The memory file behind a shared mapping (offset 0 of it is `ptr`).
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory owned by this value; synchronisation of its contents is
// the pool's job (slot headers, the pool lock).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Base address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty mapping (never produced).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether explicit huge pages back it.
    pub fn is_huge(&self) -> bool {
        self.huge
    }
    /// Whether every page is already faulted in (false for a mapping from
    /// [`RegionAlloc::map_unfaulted`] on normal pages: its owner faults it).
    pub fn is_populated(&self) -> bool {
        self.populated
    }
    /// Faults every page in on `threads` threads (0: one per core, at most 16), huge pages
    /// advised first; a no-op once populated.
    pub fn populate(&mut self, threads: usize) {
        if !self.populated {
            let threads = if threads == 0 {
                crate::prefault::auto_threads()
            } else {
                threads
            };
            crate::prefault::prefault(self.ptr, self.len, threads);
            self.populated = true;
        }
    }
    /// A read-only descriptor of the sealed memory file behind the mapping (its offset 0 is
    /// [`Mapping::ptr`]), when it came from [`MemfdAlloc`]: other processes on the host may map
    /// it read-only; the file refuses writes through any descriptor.
    pub fn shared_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap and are unmapped exactly once.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

fn mmap(len: usize, extra: libc::c_int) -> Option<*mut u8> {
    // SAFETY: an anonymous private mapping with no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as *mut u8)
}

impl RegionAlloc for MmapAlloc {
    fn map(&self, len: usize) -> Result<Mapping, PoolError> {
        let mut m = self.map_unfaulted(len)?;
        m.populate(0);
        Ok(m)
    }

    fn map_unfaulted(&self, len: usize) -> Result<Mapping, PoolError> {
        if len == 0 {
            return Err(PoolError::Geometry("pool size is zero".into()));
        }
        if self.hugepages {
            let huge_len = len.div_ceil(2 << 20) * (2 << 20);
            // Huge pages are reserved whole at map time; populate them there too.
            if let Some(ptr) = mmap(huge_len, libc::MAP_HUGETLB | libc::MAP_POPULATE) {
                return Ok(Mapping {
                    ptr,
                    len: huge_len,
                    huge: true,
                    populated: true,
                    fd: None,
                });
            }
            tracing::info!(len, "no explicit huge pages available; using normal pages");
        }
        let ptr = mmap(len, 0).ok_or_else(|| PoolError::Map {
            len,
            detail: std::io::Error::last_os_error().to_string(),
        })?;
        Ok(Mapping {
            ptr,
            len,
            huge: false,
            populated: false,
            fd: None,
        })
    }
}

/// A shared mapping of a sealed memory file (`memfd_create`): the pool's memory can then be
/// handed to other processes on the same host, which map it read-only and copy pages out of
/// it directly (the transport's host-local path). Before anyone else sees it the file is
/// sealed against shrinking and growing, so a reader's mapping can never lose its backing
/// pages (no `SIGBUS`), and — once the pool's own writable mapping exists — against every
/// later write (`F_SEAL_FUTURE_WRITE`); the descriptor [`Mapping::shared_fd`] hands out is
/// read-only. A process that receives it can read the pool and nothing more. Explicit huge pages when asked, else normal pages with huge-page advice
/// (honoured when the kernel's `shmem_enabled` allows it).
#[derive(Debug, Clone, Copy, Default)]
pub struct MemfdAlloc {
    /// Try `MFD_HUGETLB` first.
    pub hugepages: bool,
}

fn memfd(len: usize, huge: bool) -> Result<OwnedFd, std::io::Error> {
    let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    if huge {
        flags |= libc::MFD_HUGETLB;
    }
    // SAFETY: a NUL-terminated name and plain flags; the result is checked.
    let raw = unsafe { libc::memfd_create(c"peercache-pool".as_ptr(), flags) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let fd_raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: plain syscalls on a descriptor we own.
    let ok = unsafe {
        libc::ftruncate(fd_raw, len as libc::off_t) == 0
            && libc::fcntl(
                fd_raw,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ) == 0
    };
    if !ok {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Once the owner's own writable mapping exists: seals the file against every later write
/// (`F_SEAL_FUTURE_WRITE`: no `write`, no writable shared mapping, no hole punching, through
/// any descriptor) and against further seal changes, and returns a read-only descriptor of it
/// — the only one that leaves this module. The read-write descriptor is dropped by the caller.
fn seal_read_only(fd: &OwnedFd) -> Result<OwnedFd, std::io::Error> {
    let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
    // SAFETY: fcntl on a descriptor we own.
    let sealed = unsafe {
        libc::fcntl(
            raw,
            libc::F_ADD_SEALS,
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )
    };
    if sealed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // A fresh open file description, read-only, of the same memory file.
    let ro = std::fs::File::open(format!("/proc/self/fd/{raw}"))?;
    Ok(OwnedFd::from(ro))
}

fn map_shared(fd: &OwnedFd, len: usize) -> Result<*mut u8, std::io::Error> {
    // SAFETY: a shared mapping of a file we own, no address hint; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(fd),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(p as *mut u8)
    }
}

impl RegionAlloc for MemfdAlloc {
    fn map(&self, len: usize) -> Result<Mapping, PoolError> {
        let mut m = self.map_unfaulted(len)?;
        m.populate(0);
        Ok(m)
    }

    /// The file is sealed against writes through any other descriptor before this returns;
    /// the owner's mapping made here stays writable, so faulting it in later is allowed.
    fn map_unfaulted(&self, len: usize) -> Result<Mapping, PoolError> {
        if len == 0 {
            return Err(PoolError::Geometry("pool size is zero".into()));
        }
        if self.hugepages {
            let huge_len = len.div_ceil(2 << 20) * (2 << 20);
            if let Ok(fd) = memfd(huge_len, true)
                && let Ok(ptr) = map_shared(&fd, huge_len)
            {
                // Built first, so the mapping is released if sealing fails.
                let mut mapping = Mapping {
                    ptr,
                    len: huge_len,
                    huge: true,
                    populated: false,
                    fd: None,
                };
                mapping.fd = Some(seal_read_only(&fd).map_err(|e| PoolError::Map {
                    len,
                    detail: format!("sealing the shared memory file: {e}"),
                })?);
                return Ok(mapping);
            }
            tracing::info!(
                len,
                "no explicit huge pages for a shared pool; using normal pages"
            );
        }
        let err = |e: std::io::Error| PoolError::Map {
            len,
            detail: format!("shared memory file: {e}"),
        };
        let fd = memfd(len, false).map_err(err)?;
        let ptr = map_shared(&fd, len).map_err(err)?;
        let mut mapping = Mapping {
            ptr,
            len,
            huge: false,
            populated: false,
            fd: None,
        };
        mapping.fd = Some(seal_read_only(&fd).map_err(err)?);
        Ok(mapping)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn memfd_pool_is_sealed_and_visible_through_a_second_mapping() {
        let len = 1 << 20;
        let m = MemfdAlloc::default().map(len).unwrap();
        assert_eq!(m.len(), len);
        let fd = m
            .shared_fd()
            .expect("a shared mapping has a file")
            .as_raw_fd();
        // SAFETY: plain fcntl/ftruncate on a descriptor the mapping owns.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_eq!(
            seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL),
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL
        );
        // SAFETY: as above; the call must fail on the sealed file.
        let shrunk = unsafe { libc::ftruncate(fd, 4096) };
        assert_ne!(shrunk, 0, "shrinking must be refused");
        // SAFETY: writes inside the mapping this test owns.
        unsafe { std::ptr::copy_nonoverlapping(b"kv page".as_ptr(), m.ptr().add(8192), 7) };
        // SAFETY: a read-only shared view of the same file, unmapped below.
        let view = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert_ne!(view, libc::MAP_FAILED);
        // SAFETY: 7 bytes inside the view.
        let seen = unsafe { std::slice::from_raw_parts((view as *const u8).add(8192), 7) };
        assert_eq!(seen, b"kv page");
        // SAFETY: unmaps the view mapped above.
        unsafe { libc::munmap(view, len) };
    }

    /// Every way a process holding the shared descriptor could change the pool, tried on it
    /// and on a read-write re-open of it through `/proc`: all must fail.
    fn assert_unwritable(fd: i32, len: usize) {
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"));
        let mut fds = vec![fd];
        if let Ok(f) = &reopened {
            fds.push(f.as_raw_fd());
        }
        for fd in fds {
            // SAFETY: a one-byte write from a live buffer; it must fail.
            let wrote = unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) };
            assert_eq!(wrote, -1, "pwrite through fd {fd} must fail");
            // SAFETY: a shared writable mapping attempt; unmapped if it (wrongly) succeeds.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                // SAFETY: unmaps the mapping made just above.
                unsafe { libc::munmap(p, len) };
                panic!("a writable shared mapping through fd {fd} must fail");
            }
            // SAFETY: plain fallocate on a descriptor this test holds; it must fail.
            let punched = unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    4096,
                )
            };
            assert_eq!(punched, -1, "punching a hole through fd {fd} must fail");
        }
    }

    #[test]
    fn the_shared_descriptor_is_read_only_and_the_file_refuses_writes() {
        for hugepages in [false, true] {
            let len = 4 << 20;
            let m = MemfdAlloc { hugepages }.map(len).unwrap();
            let fd = m.shared_fd().unwrap().as_raw_fd();
            // SAFETY: fcntl on a descriptor the mapping owns.
            let (mode, seals) = unsafe {
                (
                    libc::fcntl(fd, libc::F_GETFL) & libc::O_ACCMODE,
                    libc::fcntl(fd, libc::F_GET_SEALS),
                )
            };
            assert_eq!(mode, libc::O_RDONLY, "huge={}", m.is_huge());
            assert_ne!(seals & libc::F_SEAL_FUTURE_WRITE, 0);
            assert_unwritable(fd, m.len());
            // The owner's own mapping, made before the seal, still writes.
            // SAFETY: inside the mapping this test owns.
            unsafe { m.ptr().add(100).write_volatile(42) };
            let mut b = [0u8; 1];
            // SAFETY: a one-byte read into `b` at offset 100 of the file.
            assert_eq!(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 1, 100) }, 1);
            assert_eq!(b[0], 42);
        }
    }

    #[test]
    fn private_pool_has_no_file() {
        let m = MmapAlloc::default().map(1 << 20).unwrap();
        assert!(m.shared_fd().is_none());
        assert!(MemfdAlloc::default().map(0).is_err());
    }
}

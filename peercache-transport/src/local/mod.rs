//! The host-local path: a peer on the same host reads this node's shared regions straight out
//! of memory — one copy, no socket, no server thread — instead of over loopback TCP.
//!
//! A region is shared when its memory is a sealed memory file ([`crate::Transport::share`];
//! the pool maps one with `MemfdAlloc`). A reader attaches in the background after its first
//! successful network read from a peer (never delaying a read, never asking a peer that does
//! not answer), in three steps:
//!
//! 1. the reader opens the peer's data port on the [`Plane::HostLocal`] plane (the usual
//!    authenticated handshake) and gets the name of an abstract Unix socket plus a 128-bit
//!    token;
//! 2. it connects to that socket — which only works from the same host and network namespace,
//!    so a peer elsewhere simply stays on TCP — and sends the token;
//! 3. the owner answers with its shared, remote-readable regions and their file descriptors
//!    (`SCM_RIGHTS`); the reader checks each file is sealed against shrinking and long enough,
//!    then maps it read-only.
//!
//! The Unix connection stays open as a lease: the owner closes every one whenever its set of
//! shared regions changes or it shuts down, and the reader checks its end once per batch (a
//! non-blocking peek), re-attaching or falling back to TCP when it finds it closed.
//!
//! Reads copy like RDMA READs do: the owner may rewrite a slot during the copy, so callers
//! verify what they read (the store checks every page's header and checksum).
//!
//! [`Plane::HostLocal`]: peercache_wire::handshake::Plane::HostLocal

mod client;
mod codec;
mod error;
mod fds;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;

use peercache_wire::handshake::Hello;

pub(crate) use fds::check_shareable;
pub(crate) use server::Invites;

use crate::metrics::Counters;
use crate::region::RegionTable;
use crate::{Batch, OpResults};
use client::LocalClient;
use server::LocalServer;

/// Runs the same-host decoders (invitation, region table) on arbitrary bytes; for the fuzz
/// target of the transport.
pub(crate) fn fuzz_decode(data: &[u8]) -> usize {
    codec::fuzz_decode(data)
}

/// The same-host path as one of the transport's data paths: this node's listener (what it
/// shares) and its attachments to peers on this host (what it reads).
pub(crate) struct LocalPath {
    server: LocalServer,
    client: LocalClient,
    table: Arc<RegionTable>,
    max_op_bytes: u32,
    counters: Arc<Counters>,
}

impl LocalPath {
    /// Starts the listener; `hello` is the data plane's (the attach uses its own plane).
    pub(crate) fn start(
        table: Arc<RegionTable>,
        cfg: &crate::TransportConfig,
        hello: Hello,
        counters: Arc<Counters>,
    ) -> std::io::Result<Self> {
        let server = LocalServer::start(table.clone(), cfg.op_timeout)?;
        let client = LocalClient::new(hello, cfg.auth.clone(), cfg.op_timeout, counters.clone());
        Ok(LocalPath {
            server,
            client,
            table,
            max_op_bytes: cfg.max_op_bytes,
            counters,
        })
    }

    /// Where the data port's same-host plane gets each handshake's single-use invitation.
    pub(crate) fn invites(&self) -> Arc<Invites> {
        self.server.invites.clone()
    }

    /// Whether reads from `peer` currently copy from its shared memory.
    pub(crate) fn is_attached(&self, peer: SocketAddr) -> bool {
        self.client.is_attached(peer)
    }
}

impl std::fmt::Debug for LocalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalPath")
            .field("socket", &self.server.invites.name())
            .finish()
    }
}

impl crate::path::DataPath for LocalPath {
    fn read_batch(&self, peer: SocketAddr, batch: &Batch) -> crate::path::Carried {
        let res =
            self.client
                .read_batch(peer, batch, &self.table, self.max_op_bytes, &self.counters)?;
        self.counters.count_batch(false, batch, &res);
        Some(Ok(res))
    }

    fn read_elsewhere(&self, peer: SocketAddr, outcome: &Result<OpResults, crate::TransportError>) {
        if matches!(outcome, Ok(r) if r.iter().any(|x| x.is_ok())) {
            self.client.network_read_ok(peer);
        }
    }

    fn forget_peer(&self, peer: SocketAddr) {
        self.client.forget(peer);
    }

    fn add_stats(&self, s: &mut crate::TransportStats) {
        s.local_peers = self.client.attached() as u64;
        s.local_populated_bytes = self.client.populated_bytes();
        s.local_leases = self.server.lease_count() as u64;
    }

    fn shutdown(&self) {
        self.server.stop();
        self.server.revoke();
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::codec::*;
    use super::error::LocalError;
    use super::fds::recv_table;
    use super::fds::{check_file, check_shareable};
    use super::server::{LocalServer, same_token, send_table};
    use crate::RegionKey;
    use crate::region::RegionTable;
    use crate::region::SharedFile;

    #[test]
    fn invitation_round_trips_and_rejects_garbage() {
        let inv = Invitation {
            name: "peercache-local-1-00ff".into(),
            token: [7; TOKEN_LEN],
        };
        let back = Invitation::decode(&inv.encode()).unwrap();
        assert_eq!(back.name, inv.name);
        assert_eq!(back.token, inv.token);
        assert!(Invitation::decode(b"short").is_err());
        let mut bad = inv.encode();
        bad[4] = 9;
        assert!(matches!(
            Invitation::decode(&bad),
            Err(LocalError::Version { .. })
        ));
        let mut cut = inv.encode();
        cut.truncate(cut.len() - 3);
        assert!(Invitation::decode(&cut).is_err());
    }

    #[test]
    fn region_tables_must_match_their_descriptors() {
        let mut body = Vec::new();
        body.extend_from_slice(&TABLE_MAGIC.to_le_bytes());
        body.extend_from_slice(&[VERSION, 0, 0, 0]);
        body.extend_from_slice(&2u32.to_le_bytes());
        for v in [11u64, 0x1000, 8192, 0, 12, 0x9000, 4096, 8192] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(table_count(&body, 2).unwrap(), 2);
        assert_eq!(
            table_entries(&body, 2),
            vec![
                (RegionKey(11), 0x1000, 8192, 0),
                (RegionKey(12), 0x9000, 4096, 8192)
            ]
        );
        assert!(table_count(&body, 1).is_err(), "one descriptor short");
        assert!(table_count(&body[..8], 2).is_err(), "truncated header");
        let mut wrong = body.clone();
        wrong[0] ^= 1;
        assert!(table_count(&wrong, 2).is_err());
        let mut huge = body.clone();
        huge[8..12].copy_from_slice(&(MAX_SHARED_REGIONS as u32 + 1).to_le_bytes());
        assert!(table_count(&huge, MAX_SHARED_REGIONS + 1).is_err());
        assert_eq!(
            fuzz_decode(&body),
            0,
            "two descriptors are not implied by the byte"
        );
    }

    #[test]
    fn tokens_compare_whole() {
        let a = [1u8; TOKEN_LEN];
        let mut b = a;
        assert!(same_token(&a, &b));
        b[15] = 2;
        assert!(!same_token(&a, &b));
    }

    #[test]
    fn unsealed_or_short_files_are_refused() {
        // SAFETY: a fresh memory file this test owns.
        let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizes the file we own.
        assert_eq!(unsafe { libc::ftruncate(raw, 1 << 16) }, 0);
        assert!(matches!(
            check_file(&fd, 0, 4096),
            Err(LocalError::Unsealed)
        ));
        let sealed = {
            // SAFETY: a fresh memory file this test owns.
            let raw = unsafe {
                libc::memfd_create(c"s".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
            };
            // SAFETY: `raw` is ours; sized then sealed against shrinking only.
            unsafe {
                assert_eq!(libc::ftruncate(raw, 1 << 16), 0);
                assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
                OwnedFd::from_raw_fd(raw)
            }
        };
        assert!(
            matches!(check_file(&sealed, 0, 1 << 16), Err(LocalError::Unsealed)),
            "writes are not sealed yet"
        );
        // SAFETY: adds a seal on the file we own.
        let future_write = unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&sealed),
                libc::F_ADD_SEALS,
                libc::F_SEAL_FUTURE_WRITE,
            )
        };
        assert_eq!(future_write, 0);
        check_file(&sealed, 0, 1 << 16).unwrap();
        assert!(check_file(&sealed, 4096, 1 << 16).is_err(), "past the end");
        assert!(check_file(&sealed, 100, 4096).is_err(), "unaligned offset");
        assert!(
            matches!(
                check_shareable(&sealed, 0, 1 << 16),
                Err(LocalError::Writable)
            ),
            "a read-write descriptor is never handed out"
        );
        let ro = std::fs::File::open(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&sealed)
        ))
        .unwrap();
        check_shareable(&OwnedFd::from(ro), 0, 1 << 16).unwrap();
    }

    /// A memory file made the way the pool makes one: resizing sealed, the owner's writable
    /// mapping, then writes sealed and a read-only descriptor.
    fn pool_like_file(len: usize) -> (OwnedFd, *mut u8) {
        // SAFETY: a fresh memory file this test owns; every call's result is checked.
        unsafe {
            let raw =
                libc::memfd_create(c"p".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            assert!(raw >= 0);
            let rw = OwnedFd::from_raw_fd(raw);
            assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, seals), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let seals = libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, seals), 0);
            let ro = std::fs::File::open(format!("/proc/self/fd/{raw}")).unwrap();
            drop(rw);
            (OwnedFd::from(ro), p as *mut u8)
        }
    }

    #[test]
    fn a_received_pool_descriptor_cannot_change_the_pool() {
        use std::os::fd::AsRawFd;
        let len = 1 << 16;
        let (fd, owner_map) = pool_like_file(len);
        // SAFETY: the owner's writable mapping still writes after the seal.
        unsafe { owner_map.add(10).write_volatile(7) };
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let shared = SharedFile {
            fd: std::sync::Arc::new(fd),
            offset: 0,
        };
        send_table(&a, &[(RegionKey(5), 0x1000, len as u64, shared)]).unwrap();
        let got = recv_table(&b).unwrap();
        assert_eq!(got.len(), 1);
        let received = &got[0].4;
        check_file(received, 0, len as u64).unwrap();
        let reopened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", received.as_raw_fd()))
            .unwrap();
        // SAFETY: F_GETFL on a descriptor the test holds.
        let mode = unsafe { libc::fcntl(received.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE;
        assert_eq!(mode, libc::O_RDONLY, "the received descriptor is read-only");
        for fd in [received.as_raw_fd(), reopened.as_raw_fd()] {
            // SAFETY: each call is checked and must fail; a mapping that wrongly succeeds is
            // unmapped before the assertion.
            unsafe {
                assert_eq!(libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0), -1, "pwrite");
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                );
                let mapped = p != libc::MAP_FAILED;
                if mapped {
                    libc::munmap(p, len);
                }
                assert!(!mapped, "a writable shared mapping");
                let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                assert_eq!(libc::fallocate(fd, punch, 0, 4096), -1, "hole punching");
            }
        }
        let mut byte = [0u8; 1];
        // SAFETY: a one-byte read into `byte`.
        let read = unsafe { libc::pread(received.as_raw_fd(), byte.as_mut_ptr().cast(), 1, 10) };
        assert_eq!(read, 1);
        assert_eq!(byte[0], 7, "reads still see the pool");
        // SAFETY: unmaps the owner's mapping made in `pool_like_file`.
        unsafe { libc::munmap(owner_map.cast(), len) };
    }

    #[test]
    fn silent_local_connections_do_not_delay_another_attach() {
        use std::io::Write;
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
        let table = std::sync::Arc::new(RegionTable::new());
        let server = LocalServer::start(table, std::time::Duration::from_secs(2)).unwrap();
        let inv = server.invites.invite().unwrap();
        let addr = UnixAddr::from_abstract_name(&inv.name).unwrap();
        // Strangers on this host that connect and say nothing.
        let silent: Vec<UnixStream> = (0..10)
            .map(|_| UnixStream::connect_addr(&addr).unwrap())
            .collect();
        let t0 = std::time::Instant::now();
        let mut peer = UnixStream::connect_addr(&addr).unwrap();
        peer.write_all(&inv.token).unwrap();
        let table = recv_table(&peer).unwrap();
        let took = t0.elapsed();
        assert!(table.is_empty(), "nothing is shared yet");
        assert!(
            took < std::time::Duration::from_millis(400),
            "an attach behind ten silent connections took {took:?}"
        );
        drop(silent);
        server.stop();
    }

    #[test]
    fn an_invitation_opens_one_attach_and_no_other() {
        use std::io::Write;
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
        let table = std::sync::Arc::new(RegionTable::new());
        // Invitations live the op timeout, at least a second.
        let server = LocalServer::start(table, std::time::Duration::from_millis(10)).unwrap();
        let attach = |token: &[u8; TOKEN_LEN]| {
            let inv_name = server.invites.name().to_string();
            let mut s = UnixStream::connect_addr(&UnixAddr::from_abstract_name(&inv_name).unwrap())
                .unwrap();
            s.write_all(token).unwrap();
            recv_table(&s).is_ok()
        };
        let first = server.invites.invite().unwrap();
        let second = server.invites.invite().unwrap();
        assert_ne!(
            first.token, second.token,
            "every handshake gets its own token"
        );
        assert_eq!(server.invites.outstanding(), 2);
        assert!(attach(&first.token), "a fresh invitation attaches");
        assert!(!attach(&first.token), "a used token opens nothing");
        assert!(!attach(&[7u8; TOKEN_LEN]), "a made-up token opens nothing");
        assert!(attach(&second.token), "the other invitation is still good");
        assert_eq!(server.invites.outstanding(), 0);
        // An invitation nobody used expires.
        let late = server.invites.invite().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while server.invites.outstanding() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the invitation never expired"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!attach(&late.token), "an expired token opens nothing");
        // A flood of handshakes keeps a bounded set, newest kept.
        let many: Vec<_> = (0..100).map(|_| server.invites.invite().unwrap()).collect();
        assert_eq!(server.invites.outstanding(), 64);
        assert!(!attach(&many[0].token), "the oldest was dropped");
        assert!(attach(&many[99].token));
        server.stop();
    }
}

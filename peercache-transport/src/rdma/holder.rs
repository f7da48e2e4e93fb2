//! [`Holder`]: the server's halves of many bootstrapped queue pairs, each kept exactly as long
//! as its client's bootstrap socket stays open, by one thread for all of them (a thread per
//! queue pair would let peers' channels cost this host a thread each).
//!
//! ```
//! use std::io::Write;
//! use std::net::{TcpListener, TcpStream};
//! use std::time::{Duration, Instant};
//! use peercache_transport::rdma::holder::Holder;
//!
//! let holder: Holder<&'static str> = Holder::start().unwrap();
//! let l = TcpListener::bind("127.0.0.1:0").unwrap();
//! let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
//! let (server_side, _) = l.accept().unwrap();
//! holder.hold(server_side, "a queue pair");
//! assert_eq!(holder.held(), 1);
//! drop(client); // the client goes away: its queue pair is released
//! let until = Instant::now() + Duration::from_secs(5);
//! while holder.held() > 0 && Instant::now() < until {
//!     std::thread::yield_now();
//! }
//! assert_eq!(holder.held(), 0);
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use parking_lot::Mutex;

/// Keeps values alive while their sockets are open; one background thread polls them all.
pub struct Holder<H: Send + 'static> {
    tx: mpsc::Sender<(TcpStream, H)>,
    /// Written to wake the thread (a new entry, or stop); closing it stops the thread.
    wake: Mutex<Option<UnixStream>>,
    held: Arc<AtomicUsize>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl<H: Send + 'static> std::fmt::Debug for Holder<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder")
            .field("held", &self.held())
            .finish()
    }
}

impl<H: Send + 'static> Holder<H> {
    /// Starts the holding thread.
    pub fn start() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<(TcpStream, H)>();
        let (wake, woken) = UnixStream::pair()?;
        woken.set_nonblocking(true)?;
        let held = Arc::new(AtomicUsize::new(0));
        let count = held.clone();
        let thread = std::thread::Builder::new()
            .name("pc-rdma-hold".into())
            .spawn(move || run(&rx, woken, &count))?;
        Ok(Holder {
            tx,
            wake: Mutex::new(Some(wake)),
            held,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Keeps `value` until the peer closes `socket` (or sends anything, or the connection
    /// fails), then drops it. After [`Holder`] is dropped, `value` is dropped at once.
    pub fn hold(&self, socket: TcpStream, value: H) {
        self.held.fetch_add(1, Ordering::AcqRel);
        if self.tx.send((socket, value)).is_err() {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        if let Some(w) = self.wake.lock().as_mut() {
            let _ = w.write_all(&[1]);
        }
    }

    /// Values held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl<H: Send + 'static> Drop for Holder<H> {
    fn drop(&mut self) {
        drop(self.wake.lock().take()); // the thread sees the end of its wake socket
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

fn run<H>(rx: &mpsc::Receiver<(TcpStream, H)>, mut woken: UnixStream, held: &AtomicUsize) {
    let mut entries: Vec<(TcpStream, H)> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut scratch = [0u8; 64];
    loop {
        fds.clear();
        fds.push(libc::pollfd {
            fd: woken.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(entries.iter().map(|(s, _)| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: `fds` is a live, initialised array of `fds.len()` pollfd structs whose
        // descriptors stay open for the call (owned by `woken` and `entries`, untouched here).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break; // cannot poll: release everything rather than hold it blind
        }
        // A readable client socket means EOF, a reset or a stray byte: each ends the hold.
        let mut i = entries.len();
        while i > 0 {
            i -= 1;
            if fds[i + 1].revents != 0 {
                drop(entries.swap_remove(i));
                held.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if fds[0].revents != 0 {
            match woken.read(&mut scratch) {
                Ok(0) => break, // the Holder was dropped
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            entries.extend(rx.try_iter());
        }
    }
    let n = entries.len() + rx.try_iter().count();
    drop(entries);
    held.fetch_sub(n, Ordering::AcqRel);
}

//! A TCP proxy in the middle for tests of encryption in transit: it relays every connection to
//! one target, keeps a copy of every byte it relays, and can flip one byte in either direction.
//!
//! Self-contained (std only) so the wire crate's own integration tests can include it by path.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// Which way a byte travels through the tap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// From the connecting side to the target.
    ToServer,
    /// From the target back.
    ToClient,
}

#[derive(Default)]
struct Shared {
    seen: Mutex<Vec<u8>>,
    /// Per way: bytes still to pass before the one to flip (negative: none armed).
    flip_to_server: AtomicI64,
    flip_to_client: AtomicI64,
}

/// A running tap; it stops accepting when the process ends (tests only).
pub struct Tap {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Tap {
    /// Listens on `listen` (e.g. `127.0.0.9:0`) and relays each connection to `target`.
    ///
    /// # Panics
    /// When it cannot listen (it is a test helper).
    pub fn start(listen: &str, target: SocketAddr) -> Tap {
        let listener = TcpListener::bind(listen).expect("tap listens");
        let addr = listener.local_addr().expect("tap address");
        let shared = Arc::new(Shared::default());
        shared.flip_to_server.store(-1, Ordering::SeqCst);
        shared.flip_to_client.store(-1, Ordering::SeqCst);
        let sh = shared.clone();
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (from, to, way) in [
                    (client.try_clone(), server.try_clone(), Way::ToServer),
                    (server.try_clone(), client.try_clone(), Way::ToClient),
                ] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        let sh = sh.clone();
                        thread::spawn(move || relay(from, to, way, &sh));
                    }
                }
            }
        });
        Tap { addr, shared }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every byte relayed so far, both ways, in the order relayed.
    pub fn seen(&self) -> Vec<u8> {
        self.shared.seen.lock().expect("tap lock").clone()
    }

    /// Flips (xor 1) the byte `after` bytes from now going `way`.
    pub fn flip(&self, way: Way, after: u64) {
        let slot = match way {
            Way::ToServer => &self.shared.flip_to_server,
            Way::ToClient => &self.shared.flip_to_client,
        };
        slot.store(after as i64, Ordering::SeqCst);
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream, way: Way, sh: &Shared) {
    let slot = match way {
        Way::ToServer => &sh.flip_to_server,
        Way::ToClient => &sh.flip_to_client,
    };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let k = slot.load(Ordering::SeqCst);
        if k >= 0 {
            if (k as usize) < n {
                buf[k as usize] ^= 1;
                slot.store(-1, Ordering::SeqCst);
            } else {
                slot.store(k - n as i64, Ordering::SeqCst);
            }
        }
        sh.seen
            .lock()
            .expect("tap lock")
            .extend_from_slice(&buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Whether `needle` (at least 16 bytes) occurs anywhere in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    needle.len() <= hay.len()
        && hay
            .windows(needle.len())
            .any(|w| w[0] == first && w == needle)
}

//! Shares of a server's budgets among its peers: how many inbound connections one source
//! address may hold ([`SourceShare`]), and how many bytes of frames still arriving every
//! connection together may make the process buffer ([`FrameBudget`]).
//!
//! Both are checked where a connection or a frame starts, never per request: a connection takes
//! its source slot at accept, a frame above [`UNCHARGED_FRAME`] takes its length from the budget
//! when its length prefix arrives and gives it back when it is complete or its connection ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// Frames up to this size are never charged to a [`FrameBudget`]: the connection cap already
/// bounds what they can hold (cap × this).
pub const UNCHARGED_FRAME: usize = 64 << 10;

/// A server's optional shares (its `ServerConfig::shares`); the default has none.
#[derive(Clone, Debug, Default)]
pub struct Shares {
    /// The most connections one source address may hold (`None`: only the server's cap).
    pub per_source: Option<Arc<SourceShare>>,
    /// The budget large frames are charged to while they arrive (`None`: only `max_frame`
    /// per connection). Servers of one process share one.
    pub frame_budget: Option<Arc<FrameBudget>>,
}

/// The most inbound connections one source address may hold at once.
///
/// # Example
///
/// ```
/// use peercache_wire::shares::SourceShare;
///
/// let share = SourceShare::new(2);
/// let ip = "127.0.0.5".parse().unwrap();
/// let a = share.admit(ip).expect("first");
/// let _b = share.admit(ip).expect("second");
/// assert!(share.admit(ip).is_none(), "a third from the same source is refused");
/// assert!(share.admit("127.0.0.6".parse().unwrap()).is_some(), "another source is not");
/// drop(a);
/// assert!(share.admit(ip).is_some(), "a slot comes back when its connection ends");
/// ```
#[derive(Debug)]
pub struct SourceShare {
    max: usize,
    live: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its source's share; dropping it gives the place back.
#[derive(Debug)]
pub struct SourceSlot {
    share: Arc<SourceShare>,
    ip: IpAddr,
}

impl SourceShare {
    /// A share of at most `max` connections per source address (at least one).
    pub fn new(max: usize) -> Arc<SourceShare> {
        Arc::new(SourceShare {
            max: max.max(1),
            live: Mutex::new(HashMap::new()),
        })
    }

    /// The most connections one source may hold.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for a new connection from `ip`, or `None` when that source holds its share.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<SourceSlot> {
        let mut live = self.live.lock();
        let n = live.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            share: self.clone(),
            ip,
        })
    }

    /// Connections `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        self.live.lock().get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut live = self.share.live.lock();
        if let Some(n) = live.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                live.remove(&self.ip);
            }
        }
    }
}

/// Bytes of partially received frames a process may buffer, across all its connections.
///
/// A frame's length prefix arrives before its body, and a reader sizes its buffer from it: a
/// peer that announces a large frame and sends it slowly (or never finishes it) holds that
/// memory. Each connection is bounded by the server's `max_frame`; this bounds their sum.
///
/// # Example
///
/// ```
/// use peercache_wire::shares::FrameBudget;
///
/// let budget = FrameBudget::new(3 << 20);
/// assert!(budget.take(2 << 20));
/// assert!(!budget.take(2 << 20), "only 1 MiB is left");
/// budget.give(2 << 20);
/// assert_eq!(budget.held(), 0);
/// ```
#[derive(Debug)]
pub struct FrameBudget {
    cap: usize,
    held: AtomicUsize,
}

impl FrameBudget {
    /// A budget of `cap` bytes.
    pub fn new(cap: usize) -> Arc<FrameBudget> {
        Arc::new(FrameBudget {
            cap,
            held: AtomicUsize::new(0),
        })
    }

    /// The budget's size in bytes.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes held now by frames still arriving.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Takes `n` bytes when they fit in what is left; `false` (nothing taken) otherwise.
    pub fn take(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                h.checked_add(n).filter(|&t| t <= self.cap)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken before.
    pub fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_share_counts_each_source_apart_and_forgets_an_empty_one() {
        let share = SourceShare::new(1);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let sa = share.admit(a).unwrap();
        assert!(share.admit(a).is_none());
        let sb = share.admit(b).unwrap();
        assert_eq!((share.held_by(a), share.held_by(b)), (1, 1));
        drop(sa);
        drop(sb);
        assert!(share.live.lock().is_empty());
    }

    #[test]
    fn a_frame_budget_never_goes_past_its_cap_under_concurrent_takes() {
        let budget = FrameBudget::new(10 << 20);
        let taken = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        if budget.take(3 << 20) {
                            assert!(budget.held() <= budget.cap());
                            taken.fetch_add(1, Ordering::Relaxed);
                            budget.give(3 << 20);
                        }
                    }
                });
            }
        });
        assert!(taken.load(Ordering::Relaxed) > 0);
        assert_eq!(budget.held(), 0);
        assert!(!budget.take((10 << 20) + 1));
    }
}

//! Peers' queue pairs cost this host no thread each: the bootstrap server hands every queue
//! pair it accepts to one holding thread, which keeps it exactly as long as the peer's socket.
//! (Its own test binary, so the process's thread count is this test's alone.)

use std::sync::Arc;
use std::time::Duration;

use peercache_transport::Transport;
use peercache_transport::rdma::engine::Verbs;
use peercache_transport::rdma::path::{RdmaPath, RdmaPlane};
use peercache_transport::rdma::soft::{Fabric, SoftBootstrap, SoftVerbs};

mod common;
use common::{auth, cfg, wait_for};

fn verbs(fabric: &Arc<Fabric>) -> SoftVerbs {
    let mut v = SoftVerbs::new(fabric.clone(), 2, 4, 16);
    v.bootstrap = Some(SoftBootstrap {
        node: None,
        auth: auth(),
        timeout: Duration::from_secs(2),
    });
    v
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn many_peer_queue_pairs_are_held_by_one_thread_and_released_with_their_sockets() {
    let fabric = Fabric::new();
    let path = RdmaPath::new(verbs(&fabric), None, auth(), Duration::from_secs(2));
    let plane: Arc<dyn RdmaPlane> = path.clone();
    let server = Transport::start_with_rdma(cfg(), None, Some(plane)).unwrap();
    let peer = server.local_endpoint().to_string();
    let client = verbs(&fabric);
    let before = threads();

    let qps: Vec<_> = (0..24)
        .map(|i| client.connect(&peer, i % 2).unwrap())
        .collect();
    wait_for(Duration::from_secs(10), "24 queue pairs held", || {
        path.served_queue_pairs() == 24
    });
    // Every bootstrap connection's server thread has returned; the queue pairs stay.
    wait_for(
        Duration::from_secs(10),
        "the bootstrap threads to return",
        || threads() <= before + 2,
    );
    assert_eq!(path.served_queue_pairs(), 24);

    // A peer closing its socket releases exactly its queue pair; all of them, all.
    let mut qps = qps;
    drop(qps.pop());
    wait_for(Duration::from_secs(5), "one release", || {
        path.served_queue_pairs() == 23
    });
    drop(qps);
    wait_for(Duration::from_secs(5), "every release", || {
        path.served_queue_pairs() == 0
    });
    drop(server);
}

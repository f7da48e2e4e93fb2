"""KV events as a router sees them: three ``peercache-node`` processes publish their directory
shards' changes (``kv_events_port``), decoded with vLLM's own ``KVEventBatch`` over real
ZeroMQ sockets; a router built from those streams alone agrees with the directory as pages
are written, evicted and lost with a killed node, and a late subscriber's replay gives it the
same picture."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

import pytest

msgspec = pytest.importorskip("msgspec", reason="the vLLM venv (scripts/vllm-e2e.sh)")
zmq = pytest.importorskip("zmq", reason="the vLLM venv (scripts/vllm-e2e.sh)")
pytest.importorskip("vllm.distributed.kv_events", reason="the vLLM venv (scripts/vllm-e2e.sh)")

import peercache  # noqa: E402
from peercache.core import prefix_runs  # noqa: E402
from peercache.router import ClusterView, NodeEvents  # noqa: E402
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch  # noqa: E402

from harness import free_port  # noqa: E402

SECRET = "kv events test secret, 32 bytes!"
PAGE = 64 << 10
END = (-1).to_bytes(8, "big", signed=True)

Copy = Tuple[bytes, str, str]  # (block hash, holder node id, medium)


class Stream:
    """One node's KV events as a router follows them: subscribe, ask the replay port for the
    state, apply live batches numbered after it, and replay again from the first missing
    number when a gap shows or the stream has been quiet for half a second."""

    def __init__(self, ctx: zmq.Context, host: str, port: int, replay_port: int) -> None:
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(f"tcp://{host}:{port}")
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.replayer = ctx.socket(zmq.DEALER)
        self.replayer.setsockopt(zmq.LINGER, 0)
        self.replayer.setsockopt(zmq.RCVTIMEO, 10_000)
        self.replayer.connect(f"tcp://{host}:{replay_port}")
        self.copies: Set[Copy] = set()
        self.last: Optional[int] = None
        self.removed = 0
        self.caught_up = 0.0
        self.replay(0)

    def replay(self, start: int) -> None:
        self.caught_up = time.monotonic()
        self.replayer.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            _, topic, seq, payload = self.replayer.recv_multipart()
            if seq == END:
                return
            self.apply(topic, int.from_bytes(seq, "big"), payload)

    def apply(self, topic: bytes, seq: int, payload: bytes) -> None:
        holder = topic.decode()
        for ev in self.decoder.decode(payload).events:
            if isinstance(ev, AllBlocksCleared):
                self.copies.clear()
            elif isinstance(ev, BlockStored):
                assert ev.medium in ("CPU", "STORAGE") and ev.block_size == 16
                self.copies.update((bytes(h), holder, ev.medium) for h in ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                self.removed += len(ev.block_hashes)
                self.copies.difference_update((bytes(h), holder, ev.medium) for h in ev.block_hashes)
        self.last = seq if self.last is None else max(self.last, seq)

    def pump(self) -> None:
        """Applies every batch that has arrived; when none has for a while, asks the replay
        port for anything after the last one (a subscription takes effect a moment after the
        connection, so a batch published in between reaches this subscriber only that way)."""
        if not self.sub.poll(0) and time.monotonic() - self.caught_up > 0.5:
            assert self.last is not None
            self.replay(self.last + 1)
        while self.sub.poll(0):
            topic, seq_b, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_b, "big")
            assert self.last is not None
            if seq <= self.last:
                continue  # already in the replayed state
            if seq > self.last + 1:
                self.replay(self.last + 1)  # a gap: fetch what was missed
                if seq <= self.last:
                    continue
            self.apply(topic, seq, payload)

    def close(self) -> None:
        self.sub.close()
        self.replayer.close()


class Node:
    def __init__(self, n: int, seed: str, log_dir: str, secret_file: str) -> None:
        self.host = f"127.0.0.{n}"
        self.client_port = free_port(self.host)
        self.events_port = free_port(self.host)
        self.replay_port = free_port(self.host)
        sets = {
            "protocol": "tcp", "global_segment_size": "32mb", "cluster_secret_file": secret_file,
            "metrics_enabled": "false", "client_enabled": "true", "client_port": self.client_port,
            "kv_events_port": self.events_port, "kv_events_replay_port": self.replay_port,
            "kv_events_block_size": 16, "heartbeat_interval": 0.2, "member_ttl": 1.0,
            "op_timeout": 2.0,
        }
        argv = [os.path.join(os.path.dirname(sys.executable), "peercache-node"),
                "--host", self.host, "--discovery-addr", seed]
        for k, v in sets.items():
            argv += ["--set", f"{k}={v}"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(log_dir, f"node-{n}.log"), "w"),
                                     start_new_session=True)
        self.client = peercache.Client(f"{self.host}:{self.client_port}", cluster_secret=SECRET, timeout=5)
        self.node_id = ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def wait_until(what: str, cond: Callable[[], bool], timeout: float, pump: Callable[[], None] = lambda: None) -> None:
    until = time.monotonic() + timeout
    while True:
        pump()
        if cond():
            return
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def truth(client: peercache.Client, keys: List[str]) -> Set[Copy]:
    """Every (block hash, holder, medium) the directory lists for ``keys``."""
    out: Set[Copy] = set()
    for key, owners in zip(keys, json.loads(client.locate_json(keys))):
        for o in owners:
            out.add((peercache.page_hash(key), o["node"], "CPU" if o["resident"] else "STORAGE"))
    return out


@pytest.fixture
def cluster():
    log_dir = tempfile.mkdtemp(prefix="peercache-events-")
    fd, secret_file = tempfile.mkstemp(dir=log_dir)
    with os.fdopen(fd, "w") as f:
        f.write(SECRET)
    seed = f"127.0.0.61:{free_port('127.0.0.61')}"
    nodes = [Node(n, seed, log_dir, secret_file) for n in (61, 62, 63)]
    ctx = zmq.Context()
    try:
        for node in nodes:
            def up(node: Node = node) -> bool:
                # Serving once a page can be written: the node knows directory members.
                try:
                    return node.client.put([f"events-probe-{node.host}"], [b"\x01" * PAGE]) == [True]
                except RuntimeError:
                    return False
            wait_until(f"{node.host} to serve", up, 30)
        yield nodes, ctx, log_dir
    finally:
        for node in nodes:
            node.kill()
        ctx.destroy(linger=0)


def test_a_router_following_every_nodes_events_sees_what_the_directory_holds(cluster) -> None:
    nodes, ctx, log_dir = cluster
    a, b, c = nodes
    streams = {n.host: Stream(ctx, n.host, n.events_port, n.replay_port) for n in nodes}
    # The library's follower beside the test's own (which decodes with vLLM's classes): it is
    # never told that a node dies.
    router = ClusterView([NodeEvents(n.host, n.events_port, n.replay_port) for n in nodes],
                         context=ctx, timeout_s=1.0)

    def pump() -> None:
        for s in streams.values():
            s.pump()
        router.pump()

    def view(hosts: Optional[List[str]] = None) -> Set[Copy]:
        return set().union(*(s.copies for h, s in streams.items() if hosts is None or h in hosts))

    keys_a = [f"events-a-{i}" for i in range(60)]
    keys_b = [f"events-b-{i}" for i in range(40)]
    assert a.client.put(keys_a, [bytes([i % 251]) * PAGE for i in range(60)]) == [True] * 60
    assert b.client.put(keys_b, [bytes([i % 241]) * PAGE for i in range(40)]) == [True] * 40
    written = keys_a + keys_b + [f"events-probe-{n.host}" for n in nodes]
    # The nodes may still be joining one another's rings: the directory lists every page once
    # they agree (hand-offs move what was listed on a smaller ring).
    wait_until("the directory to list every page",
               lambda: {h for h, _, _ in truth(c.client, written)} == {peercache.page_hash(k) for k in written}, 15)
    for n in nodes:
        n.node_id = json.loads(c.client.locate_json([f"events-probe-{n.host}"]))[0][0]["node"]
    want = truth(c.client, written)
    assert {h for h, _, _ in want} == {peercache.page_hash(k) for k in written}
    wait_until("the events to list every page written", lambda: view() == want, 15, pump)
    assert {holder for _, holder, _ in view()} == {n.node_id for n in nodes}
    wait_until("the router to list every page written", lambda: router.copies() == want, 15, pump)
    # Its prefix answers are the directory's, and its hint names the writer.
    for keys in (keys_a[:20], keys_b, keys_a[:5] + keys_b[:5], ["events-never-written"]):
        assert router.prefix(keys) == prefix_runs(c.client.prefix_locations_json(keys)), keys
    assert router.hint(keys_a) == {"holder_node": a.node_id}
    assert router.hint(keys_b[:3]) == {"holder_node": b.node_id}
    assert router.hint(["events-never-written"]) is None
    assert router.holders(peercache.page_hash(keys_a[0])) == {a.node_id: "CPU"}
    assert router.stats.malformed == 0 and router.stats.batches > 0

    # b's pool (32 MiB) takes about 500 pages of 64 KiB: 600 more evict its oldest pages, and
    # the evictions reach the directory shards, which tell the routers.
    more = [f"events-b-more-{i}" for i in range(600)]
    for i in range(0, 600, 100):
        assert b.client.put(more[i:i + 100], [bytes([j % 239]) * PAGE for j in range(100)]) == [True] * 100
    written += more
    wait_until("b's evictions to reach the directory",
               lambda: len(truth(c.client, keys_b)) < len(keys_b), 15)
    wait_until("the events to match the directory after evictions",
               lambda: view() == truth(c.client, written), 15, pump)
    wait_until("the router to match the directory after evictions",
               lambda: router.copies() == truth(c.client, written), 15, pump)
    assert sum(s.removed for s in streams.values()) > 0

    # A late subscriber to a and c: its replay gives it the state the live streams built.
    late = {n.host: Stream(ctx, n.host, n.events_port, n.replay_port) for n in (a, c)}
    try:
        pump()
        for host, s in late.items():
            def same(s: Stream = s, host: str = host) -> bool:
                s.pump()
                streams[host].pump()
                return s.copies == streams[host].copies
            wait_until(f"the late subscriber to {host} to match", same, 10)
            assert s.copies, "the replayed state is not empty"
    finally:
        for s in late.values():
            s.close()

    # b is killed: within the member TTL the directory and the surviving shards' events drop
    # every copy it held, and the prefix answers no longer name it.
    b.kill()
    streams.pop(b.host).close()

    def b_gone() -> bool:
        runs = json.loads(c.client.prefix_locations_json(keys_b[-5:] + more[-5:]))
        return all(r["node"] != b.node_id for r in runs)
    wait_until("b to leave the prefix answers", b_gone, 10)
    wait_until("the events to drop b's copies",
               lambda: all(holder != b.node_id for _, holder, _ in view()), 10, pump)
    wait_until("the events to match the directory without b",
               lambda: view() == truth(c.client, written), 10, pump)
    assert {holder for _, holder, _ in view()} == {a.node_id, c.node_id}
    # The router finds b's replay port silent, drops b's stream and still agrees.
    wait_until("the router to match the directory without b",
               lambda: router.copies() == truth(c.client, written) and not router.is_up(b.host), 10, pump)
    assert router.stats.down >= 1
    assert router.prefix(keys_a[:20]) == prefix_runs(c.client.prefix_locations_json(keys_a[:20]))
    router.close()
    for s in streams.values():
        s.close()


def test_the_ports_refuse_the_wrong_socket_types_and_keep_serving(cluster) -> None:
    nodes, ctx, _ = cluster
    a = nodes[0]
    # A REQ socket on the PUB port and a SUB socket on the replay port are closed at the
    # greeting; a real subscriber afterwards is served.
    wrong = ctx.socket(zmq.REQ)
    wrong.setsockopt(zmq.LINGER, 0)
    wrong.setsockopt(zmq.RCVTIMEO, 500)
    wrong.connect(f"tcp://{a.host}:{a.events_port}")
    wrong.send(b"\x00" * 8)
    with pytest.raises(zmq.Again):
        wrong.recv()
    wrong.close()
    # The page is listed on the shards its key hashes to, which may be any two of the three.
    good = [Stream(ctx, n.host, n.events_port, n.replay_port) for n in nodes]
    assert a.client.put(["events-after-wrong"], [b"\x07" * PAGE]) == [True]
    want = peercache.page_hash("events-after-wrong")

    def pump() -> None:
        for s in good:
            s.pump()
    wait_until("the page's event", lambda: any(h == want for s in good for h, _, _ in s.copies), 10, pump)
    for s in good:
        s.close()

"""``peercache.router.ClusterView`` against a publisher that speaks the nodes' event protocol
(a ZeroMQ PUB socket and a ROUTER replay socket on loopback, batches encoded as the nodes encode
them), so what a node rarely does on cue is driven exactly: a skipped sequence number, a batch
that does not decode, a node that never answers, and bad arguments. Against real nodes the
view is checked in ``test_events.py``."""

from __future__ import annotations

import threading
import time
from typing import Callable, List, Tuple

import pytest

msgspec = pytest.importorskip("msgspec", reason="the vLLM venv (scripts/vllm-e2e.sh)")
zmq = pytest.importorskip("zmq", reason="the vLLM venv (scripts/vllm-e2e.sh)")

from peercache.router import ClusterView, NodeEvents  # noqa: E402

from harness import free_port  # noqa: E402

HOST = "127.0.0.70"
END = (-1).to_bytes(8, "big", signed=True)


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def batch(kind: str, hashes: List[int], medium: str = "CPU") -> bytes:
    ev = {"type": kind, "block_hashes": [h(i) for i in hashes], "parent_block_hash": None,
          "token_ids": [], "block_size": 16, "lora_id": None, "medium": medium}
    return msgspec.msgpack.encode([time.time(), [ev]])


class Publisher:
    """One node's two event ports: live batches on PUB, the numbered history on ROUTER (a
    request for 0 gets everything, for n the batches from n), each answer closed by the end
    marker."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.events_port, self.replay_port = free_port(HOST), free_port(HOST)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://{HOST}:{self.events_port}")
        self.history: List[Tuple[int, bytes, bytes]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(f"tcp://{HOST}:{self.replay_port}")
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            if not self.router.poll(50):
                continue
            ident, _, start_b = self.router.recv_multipart()
            start = int.from_bytes(start_b, "big")
            with self.lock:
                for seq, topic, payload in self.history:
                    if seq >= start:
                        self.router.send_multipart([ident, b"", topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([ident, b"", b"", END, b""])

    def record(self, seq: int, payload: bytes, holder: str = "n1") -> None:
        with self.lock:
            self.history.append((seq, holder.encode(), payload))

    def send(self, seq: int, payload: bytes, holder: str = "n1") -> None:
        self.pub.send_multipart([holder.encode(), seq.to_bytes(8, "big"), payload])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.router.close(linger=0)
        self.pub.close(linger=0)


def wait_until(what: str, cond: Callable[[], bool], pump: Callable[[], int], timeout: float = 10) -> None:
    until = time.monotonic() + timeout
    while not cond():
        pump()
        if time.monotonic() > until:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_a_gap_is_caught_up_from_the_replay_port_and_a_bad_batch_is_skipped(ctx) -> None:
    node = Publisher(ctx)
    try:
        node.record(1, batch("BlockStored", [1, 2]))
        # A long quiet time: only the state request and the gap path ask the replay port.
        view = ClusterView([NodeEvents(HOST, node.events_port, node.replay_port)], context=ctx, quiet_s=60)
        assert view.copies() == {(h(1), "n1", "CPU"), (h(2), "n1", "CPU")}, "the state at start"
        # Live batch 2, sent until the subscription has taken effect (a repeat is ignored).
        node.record(2, batch("BlockStored", [3], "STORAGE"))

        def live() -> int:
            node.send(2, batch("BlockStored", [3], "STORAGE"))
            return view.pump()
        wait_until("the live batch", lambda: (h(3), "n1", "STORAGE") in view.copies(), live)
        replays = view.stats.replays
        # Batch 3 is never sent live; 4 is: the view sees the gap and asks from 3.
        node.record(3, batch("BlockRemoved", [1]))
        node.record(4, batch("BlockStored", [5]))
        node.send(4, batch("BlockStored", [5]))
        wait_until("the gap to be caught up", lambda: (h(5), "n1", "CPU") in view.copies(), view.pump)
        assert view.stats.gaps == 1 and view.stats.replays == replays + 1
        assert view.copies() == {(h(2), "n1", "CPU"), (h(3), "n1", "STORAGE"), (h(5), "n1", "CPU")}
        assert view.holders(h(3)) == {"n1": "STORAGE"}
        # A batch that does not decode is counted and skipped; the next one applies with no gap.
        node.record(5, b"\xc1 not msgpack")
        node.send(5, b"\xc1 not msgpack")
        node.record(6, batch("BlockRemoved", [2]))
        node.send(6, batch("BlockRemoved", [2]))
        wait_until("the batch after the bad one", lambda: (h(2), "n1", "CPU") not in view.copies(), view.pump)
        assert view.stats.malformed == 1 and view.stats.gaps == 1
        # AllBlocksCleared empties the stream's copies.
        node.record(7, msgspec.msgpack.encode([time.time(), [{"type": "AllBlocksCleared"}]]))
        node.send(7, msgspec.msgpack.encode([time.time(), [{"type": "AllBlocksCleared"}]]))
        wait_until("the clear", lambda: not view.copies(), view.pump)
        assert view.is_up(HOST)
        view.close()
    finally:
        node.close()


def test_a_node_that_never_answers_is_down_and_bad_arguments_are_refused(ctx) -> None:
    silent = NodeEvents("127.0.0.71", free_port("127.0.0.71"), free_port("127.0.0.71"))
    t = time.monotonic()
    view = ClusterView([silent], context=ctx, timeout_s=0.2, retry_s=0.2)
    assert time.monotonic() - t < 2, "the state request is bounded by timeout_s"
    assert not view.is_up(silent.host) and view.stats.down == 1
    assert view.copies() == set() and view.prefix(["k"]) == [] and view.hint(["k"]) is None
    # Asked again after retry_s, still bounded.
    wait_until("a second try", lambda: view.stats.down >= 2, view.pump, timeout=5)
    with pytest.raises(ValueError, match="followed already"):
        view.add_node(silent)
    with pytest.raises(ValueError, match="bad event ports"):
        view.add_node(NodeEvents("127.0.0.72", 0, 5))
    view.remove_node(silent.host)
    assert view.nodes() == []
    view.close()
    with pytest.raises(ValueError, match="positive"):
        ClusterView([], timeout_s=0)

"""The cluster's cache as a router sees it, from the nodes' KV events alone.

Every PeerCache node publishes the changes of its own directory shard on ``kv_events_port``
(ZeroMQ PUB, vLLM's ``KVEventBatch`` format; ``docs/operations.md``, "KV events") and answers
for its current state on ``kv_events_replay_port``. :class:`ClusterView` follows every node's
stream the way the docs describe — subscribe, ask for the state, apply the batches numbered
after it, ask again from the first missing number when one is skipped or the stream has been
quiet — and answers what a cache-aware router asks: which nodes hold a page, how long a leading
run of a request's pages each node holds (:meth:`ClusterView.prefix`, the same answer a node's
``prefix_locations`` gives from the directory), and the ``kv_transfer_params`` hint that sends
the request's reads straight to that node (:meth:`ClusterView.hint`, ``docs/vllm.md``).

No master is involved: each node reports the pages its shard lists, and a page counts as held
while any node's stream lists it (every entry lives on ``directory_replicas`` shards). A node
that stops answering its replay port within ``timeout_s`` is taken as gone: its stream's state
is dropped (the other shards report that node's copies gone within the member TTL) and it is
asked again every ``retry_s``.

Needs ``pyzmq`` and ``msgspec`` (both are vLLM dependencies)::

    from peercache.router import ClusterView, NodeEvents

    view = ClusterView([NodeEvents("10.0.0.1", 5557, 5558), NodeEvents("10.0.0.2", 5557, 5558)])
    view.pump()
    runs = view.prefix(page_keys)          # longest run first
    params = view.hint(page_keys)          # {"holder_node": ...} or None
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

import msgspec
import zmq

from . import _peercache
from .core import PrefixRun

# The replay port's end-of-answer marker: sequence number -1.
_END = (-1).to_bytes(8, "big", signed=True)

Copy = Tuple[bytes, str, str]
"""One listed copy: (block hash, holder node id, medium ``"CPU"`` or ``"STORAGE"``)."""


class NodeEvents(NamedTuple):
    """Where one node publishes its KV events: its host and its two event ports."""

    host: str
    events_port: int
    replay_port: int


@dataclass
class FollowStats:
    """What following the streams took (summed over every node)."""

    batches: int = 0     # batches applied (live and replayed)
    replays: int = 0     # state or catch-up requests sent to replay ports
    gaps: int = 0        # live batches whose number skipped one (caught up by a replay)
    malformed: int = 0   # batches that did not decode as a KVEventBatch (skipped)
    down: int = 0        # times a node's replay port did not answer within the timeout


@dataclass
class _Stream:
    """One node's stream: its sockets and the copies its shard lists."""

    at: NodeEvents
    sub: zmq.Socket
    replayer: zmq.Socket
    copies: Dict[bytes, Set[Tuple[str, str]]] = field(default_factory=dict)
    last: Optional[int] = None
    caught_up: float = 0.0
    # While down: when to ask again.
    retry_at: Optional[float] = None

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replayer.close(linger=0)


class ClusterView:
    """Follows the KV events of every node in ``nodes`` (see the module's doc). Keys given
    to :meth:`prefix` and :meth:`hint` are hashed in ``keyspace`` (the nodes' ``prefix``
    setting; empty: none), as ``peercache.page_hash(key, keyspace)``.

    Call :meth:`pump` often (each call applies what arrived and returns at once unless a
    replay is due); the answers reflect the batches applied so far. Not thread-safe: one
    thread pumps and asks.
    """

    def __init__(
        self,
        nodes: Iterable[NodeEvents],
        *,
        timeout_s: float = 2.0,
        quiet_s: float = 0.5,
        retry_s: float = 1.0,
        keyspace: str = "",
        context: Optional[zmq.Context] = None,
    ) -> None:
        if timeout_s <= 0 or quiet_s <= 0 or retry_s <= 0:
            raise ValueError("timeout_s, quiet_s and retry_s must be positive")
        self._timeout_ms = max(1, int(timeout_s * 1000))
        self._quiet_s = quiet_s
        self._retry_s = retry_s
        self._keyspace = keyspace
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._decoder = msgspec.msgpack.Decoder()
        self._streams: Dict[str, _Stream] = {}
        self.stats = FollowStats()
        for n in nodes:
            self.add_node(n)

    # -- membership -------------------------------------------------------------------------

    def add_node(self, at: NodeEvents) -> None:
        """Follows one more node (keyed by its host); asks for its state now."""
        if at.host in self._streams:
            raise ValueError(f"{at.host} is followed already")
        if not (0 < at.events_port < 65536 and 0 < at.replay_port < 65536):
            raise ValueError(f"bad event ports for {at.host}: {at.events_port}, {at.replay_port}")
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(f"tcp://{at.host}:{at.events_port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        s = _Stream(at=at, sub=sub, replayer=self._replayer(at))
        self._streams[at.host] = s
        self._replay(s, 0)

    def remove_node(self, host: str) -> None:
        """Stops following ``host``; what its stream listed is forgotten."""
        s = self._streams.pop(host, None)
        if s is not None:
            s.close()

    def nodes(self) -> List[str]:
        """The hosts followed, sorted."""
        return sorted(self._streams)

    def is_up(self, host: str) -> bool:
        """Whether ``host``'s replay port answered its last request."""
        s = self._streams.get(host)
        return s is not None and s.retry_at is None

    # -- following --------------------------------------------------------------------------

    def pump(self) -> int:
        """Applies every batch that arrived on every stream; returns how many. A stream quiet
        for ``quiet_s`` is asked for anything after its last batch (a subscription takes effect
        a moment after the connection, so a batch published in between arrives only that way);
        a node that was down is asked again once ``retry_s`` passed."""
        applied = 0
        now = time.monotonic()
        for s in list(self._streams.values()):
            if s.retry_at is not None:
                if now >= s.retry_at:
                    self._drain(s)  # what queued while it was down predates the state
                    self._replay(s, 0)
                continue
            if not s.sub.poll(0) and now - s.caught_up > self._quiet_s:
                self._replay(s, 0 if s.last is None else s.last + 1)
            while s.retry_at is None and s.sub.poll(0):
                topic, seq_b, payload = s.sub.recv_multipart()
                seq = int.from_bytes(seq_b, "big", signed=True)
                if s.last is not None and seq <= s.last:
                    continue  # already in the replayed state
                if s.last is not None and seq > s.last + 1:
                    self.stats.gaps += 1
                    self._replay(s, s.last + 1)
                    if s.retry_at is not None or (s.last is not None and seq <= s.last):
                        continue
                self._apply(s, topic, seq, payload)
                applied += 1
        return applied

    def _replayer(self, at: NodeEvents) -> zmq.Socket:
        r = self._ctx.socket(zmq.DEALER)
        r.setsockopt(zmq.LINGER, 0)
        r.setsockopt(zmq.RCVTIMEO, self._timeout_ms)
        r.connect(f"tcp://{at.host}:{at.replay_port}")
        return r

    def _drain(self, s: _Stream) -> None:
        while s.sub.poll(0):
            s.sub.recv_multipart()

    def _replay(self, s: _Stream, start: int) -> None:
        """Asks ``s``'s replay port for the batches from ``start`` (0: the whole state) and
        applies the answer; marks the node down when it does not answer in time."""
        self.stats.replays += 1
        s.caught_up = time.monotonic()
        deadline = s.caught_up + self._timeout_ms / 1000
        try:
            s.replayer.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not s.replayer.poll(int(left * 1000) + 1):
                    raise zmq.Again()
                frames = s.replayer.recv_multipart()
                if len(frames) < 3:
                    continue
                topic, seq_b, payload = frames[-3], frames[-2], frames[-1]
                if seq_b == _END:
                    s.retry_at = None
                    return
                self._apply(s, topic, int.from_bytes(seq_b, "big", signed=True), payload)
        except zmq.ZMQError:
            self._down(s)

    def _down(self, s: _Stream) -> None:
        """The node did not answer: drop what its stream listed, ask again later on a fresh
        socket (a half-answered request must not be read as the next answer)."""
        self.stats.down += 1
        s.copies.clear()
        s.last = None
        s.retry_at = time.monotonic() + self._retry_s
        s.replayer.close(linger=0)
        s.replayer = self._replayer(s.at)

    def _apply(self, s: _Stream, topic: bytes, seq: int, payload: bytes) -> None:
        try:
            batch = self._decoder.decode(payload)
            events = batch[1]
            holder = topic.decode()
            parsed = [_event(e) for e in events]
        except (msgspec.DecodeError, IndexError, TypeError, KeyError, ValueError, OverflowError,
                UnicodeDecodeError):
            # Skipped, but its number is taken: asking for it again would get it again.
            self.stats.malformed += 1
            s.last = seq if s.last is None else max(s.last, seq)
            return
        for kind, hashes, medium in parsed:
            if kind == "AllBlocksCleared":
                s.copies.clear()
            elif kind == "BlockStored":
                for h in hashes:
                    s.copies.setdefault(h, set()).add((holder, medium))
            elif kind == "BlockRemoved":
                for h in hashes:
                    held = s.copies.get(h)
                    if held is not None:
                        held.discard((holder, medium))
                        if not held:
                            del s.copies[h]
        s.last = seq if s.last is None else max(s.last, seq)
        self.stats.batches += 1

    # -- answers ----------------------------------------------------------------------------

    def holders(self, block_hash: bytes) -> Dict[str, str]:
        """Every node holding the page ``block_hash`` (``peercache.page_hash(key)``), with its
        medium: ``"CPU"`` when any listed copy of that node is in memory, else ``"STORAGE"``."""
        out: Dict[str, str] = {}
        for s in self._streams.values():
            for holder, medium in s.copies.get(block_hash, ()):
                if out.get(holder) != "CPU":
                    out[holder] = medium
        return out

    def prefix(self, keys: Sequence[str]) -> List[PrefixRun]:
        """Every node holding ``keys[0]``, with the leading run of ``keys`` it holds and the
        in-memory part of that run, longest first (ties by node id) — as a node's
        ``prefix_locations`` answers from the directory."""
        return self.prefix_of_hashes([_peercache.page_hash(k, self._keyspace) for k in keys])

    def prefix_of_hashes(self, hashes: Sequence[bytes]) -> List[PrefixRun]:
        """:meth:`prefix` of page hashes."""
        if not hashes:
            return []
        first = self.holders(hashes[0])
        leading = {n: 1 for n in first}
        resident = {n: int(m == "CPU") for n, m in first.items()}
        open_l, open_r = set(first), {n for n, m in first.items() if m == "CPU"}
        for h in hashes[1:]:
            if not open_l:
                break
            here = self.holders(h)
            open_l &= set(here)
            open_r &= {n for n, m in here.items() if m == "CPU"}
            for n in open_l:
                leading[n] += 1
            for n in open_r:
                resident[n] += 1
        runs = [PrefixRun(node=n, leading=leading[n], resident=resident[n]) for n in first]
        runs.sort(key=lambda r: (-r.leading, r.node))
        return runs

    def hint(self, keys: Sequence[str], min_pages: int = 1) -> Optional[Dict[str, str]]:
        """The ``kv_transfer_params`` that send a request's reads to the node holding the
        longest leading run of ``keys`` (``{"holder_node": id}``), or None when no node holds
        ``min_pages`` of them. A hint only saves a directory lookup: a wrong one still reads
        the right bytes."""
        runs = self.prefix(keys)
        if not runs or runs[0].leading < max(1, min_pages):
            return None
        return {"holder_node": runs[0].node}

    def copies(self) -> Set[Copy]:
        """Every (block hash, holder, medium) some followed stream lists."""
        out: Set[Copy] = set()
        for s in self._streams.values():
            for h, held in s.copies.items():
                out.update((h, holder, medium) for holder, medium in held)
        return out

    def close(self) -> None:
        """Closes every socket (and the context when this view made it)."""
        for s in self._streams.values():
            s.close()
        self._streams.clear()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> "ClusterView":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _event(e: object) -> Tuple[str, List[bytes], str]:
    """One decoded event as (type, block hashes, medium); raises on anything else."""
    if not isinstance(e, dict):
        raise TypeError("an event is not a map")
    kind = e["type"]
    if kind not in ("BlockStored", "BlockRemoved"):
        return str(kind), [], ""  # AllBlocksCleared, or a kind this view does not track
    medium = e.get("medium") or "CPU"
    hashes = [bytes(h) if isinstance(h, (bytes, bytearray)) else int(h).to_bytes(16, "big")
              for h in e["block_hashes"]]
    return str(kind), hashes, str(medium)

"""The one page store every engine adapter sits on.

:class:`PageStore` owns a PeerCache node: it starts it from a config mapping, registers host
memory once per span, applies one key scheme (:class:`KeyScheme`: model, ranks, layout
fingerprint) and exposes the batch calls an adapter needs — publish, read, leading-run exists,
wait for a prefix — as a public API. ``peercache.store`` (SGLang HiCache),
``peercache.linker`` (SGLang direct linker) and ``peercache.vllm`` (vLLM KV connector) are
adapters over it; none of them reaches into another's members.

Example (a node alone on loopback: one page published from a buffer and read back)::

    from peercache.core import PageStore, Segments
    store = PageStore({"protocol": "tcp", "local_hostname": "127.0.0.1",
                       "discovery_addr": "127.0.0.1:31998", "global_segment_size": "16mb"})
    page = bytearray(b"k" * 4096)
    store.put_buffers(["model|h0"], [page])
    out = bytearray(4096)
    assert store.get_buffers(["model|h0"], [out]) == [True] and out == page
    store.close()

``peercache-py/tests/test_core.py`` runs this.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _peercache

logger = logging.getLogger("peercache")

ConfigValue = Union[str, int, float, bool, None]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def as_bool(v: object, name: str = "value") -> bool:
    """A boolean as an engine's extra config may spell it: ``True``, ``1``, ``"1"``,
    ``"true"``, ``"True"``, ``"yes"``, ``"on"`` (and their negatives). Anything else is a clear
    error, never a silent ``False``."""
    if isinstance(v, str):
        t = v.strip().lower()
        if t in _TRUE:
            return True
        if t in _FALSE:
            return False
        raise ValueError(f"peercache: {name} = {v!r}: expected 1/true/yes/on or 0/false/no/off")
    if v is None:
        return False
    if isinstance(v, (bool, int, float)):
        return bool(v)
    raise ValueError(f"peercache: {name} = {v!r}: expected a boolean")


def ptr_len(x: object) -> Optional[Tuple[int, int]]:
    """(address, bytes) of a contiguous tensor or numpy array; None for other objects.
    Raises ``ValueError`` for a non-contiguous one."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # torch.Tensor
        if not x.is_contiguous():  # type: ignore[attr-defined]
            raise ValueError("tensors must be contiguous")
        return int(x.data_ptr()), int(x.numel() * x.element_size())  # type: ignore[attr-defined]
    if hasattr(x, "__array_interface__") and hasattr(x, "nbytes"):  # numpy.ndarray
        if not x.flags["C_CONTIGUOUS"]:  # type: ignore[attr-defined]
            raise ValueError("arrays must be C-contiguous")
        return int(x.__array_interface__["data"][0]), int(x.nbytes)
    return None


def layout_fingerprint(spec: Mapping[str, object]) -> str:
    """A short, stable tag of a page layout (model, dtype, geometry, ranks, hash algorithm…):
    the same mapping gives the same tag in every process, any change gives another."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class KeyScheme:
    """How a page hash becomes a PeerCache key: ``<namespace>|<hash>`` then one ``|tag`` per
    rank dimension that splits the page (``tp0of2``, ``pp1``…). ``namespace`` is the model name,
    or a layout fingerprint where pages of another shape must never meet."""

    namespace: str
    rank_tags: Tuple[str, ...] = ()

    def key(self, page_hash: str) -> str:
        """The key of one page."""
        k = f"{self.namespace}|{page_hash}"
        for t in self.rank_tags:
            k += f"|{t}"
        return k

    def keys(self, page_hashes: Sequence[str]) -> List[str]:
        """The keys of a batch, in order."""
        return [self.key(h) for h in page_hashes]


@dataclass
class Segments:
    """Raw memory segments of a batch of pages: page ``i`` is ``counts[i]`` consecutive
    (address, size) pairs of ``ptrs``/``sizes``."""

    ptrs: List[int] = field(default_factory=list)
    sizes: List[int] = field(default_factory=list)
    counts: List[int] = field(default_factory=list)

    def add_page(self, ptrs: Sequence[int], sizes: Sequence[int]) -> None:
        """Appends one page of ``len(ptrs)`` segments."""
        self.ptrs.extend(ptrs)
        self.sizes.extend(sizes)
        self.counts.append(len(ptrs))

    def nbytes(self) -> int:
        """Bytes the batch moves."""
        return sum(self.sizes)


@dataclass(frozen=True)
class PrefixRun:
    """One node's share of a request's prefix (:meth:`PageStore.prefix_locations`)."""

    node: str
    leading: int   # leading keys the node holds (in memory or on its disk tier)
    resident: int  # leading keys it holds in memory


def prefix_runs(text: str) -> List[PrefixRun]:
    """The native ``prefix_locations_json`` answer (a node's or a ``Client``'s) as
    :class:`PrefixRun` values."""
    rows: List[Dict[str, object]] = json.loads(text)
    return [PrefixRun(node=str(r["node"]), leading=int(str(r["leading"])), resident=int(str(r["resident"])))
            for r in rows]


class PageStore:
    """A PeerCache node seen as a page store: publish, read and probe pages by key, in
    batches, into and out of registered host memory.

    ``config`` holds the node's config keys (``docs/configuration.md``); ``PEERCACHE_<KEY>``
    variables override them as for every node. Every call is safe from several threads.
    """

    def __init__(self, config: Mapping[str, ConfigValue], startup_timeout: Optional[float] = None) -> None:
        self._node = _peercache.Node(json.dumps(dict(config)))
        self._spans: List[Tuple[int, int]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.startup_timeout = startup_timeout

    # ----- lifecycle -----
    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Waits until the node is in the cluster; False (logged) if it is not within
        ``timeout`` seconds (``None``: the store's ``startup_timeout``; 0 or ``None`` there:
        forever). Calls miss until it is."""
        t = self.startup_timeout if timeout is None else timeout
        try:
            self._node.wait_ready(t if t else None)
            self.log_readiness()
            return True
        except Exception as e:
            logger.warning("peercache: not in the cluster yet (%s); lookups miss until it is", e)
            return False

    def wait_members(self, n: int, timeout: float) -> bool:
        """Waits until discovery sees ``n`` members."""
        return bool(self._node.wait_members(n, timeout))

    @property
    def node_id(self) -> str:
        """This node's ring identity."""
        return str(self._node.node_id)

    @property
    def metrics_endpoint(self) -> Optional[str]:
        """``host:port`` of the node's ``/metrics``, if served."""
        return self._node.metrics_endpoint

    @property
    def client_endpoint(self) -> Optional[str]:
        """``host:port`` of the node's client API, if served."""
        return self._node.client_endpoint

    @property
    def warnings(self) -> List[str]:
        """Config warnings (unknown keys)."""
        return list(self._node.warnings)

    def close(self) -> None:
        """Leaves the cluster and releases the pool; idempotent."""
        if not self._closed:
            self._closed = True
            self._node.close()

    # ----- memory -----
    def register_host(self, ptr: int, nbytes: int) -> bool:
        """Registers ``nbytes`` of host memory at ``ptr`` as a zero-copy source and
        destination, once: a span inside one already registered is skipped (False). The
        memory must outlive the store."""
        with self._lock:
            if any(b <= ptr and ptr + nbytes <= b + m for b, m in self._spans):
                return False
            self._node.register_host_buffer(ptr, nbytes)
            self._spans.append((ptr, nbytes))
            return True

    def register_device_peermem(self, ptr: int, nbytes: int) -> None:
        """Registers device memory through ``nvidia-peermem`` (GPUDirect RDMA)."""
        self._node.register_device_peermem(ptr, nbytes)

    def register_device_spans(self, spans: Mapping[int, int]) -> Optional[str]:
        """Registers each ``address → bytes`` span as device memory (:meth:`register_device_peermem`),
        in order: None once all are, else why the node refused one (no RDMA path, no peermem,
        not memory the fabric can reach); the engine then stages instead."""
        try:
            for ptr, nbytes in spans.items():
                self._node.register_device_peermem(ptr, nbytes)
        except (RuntimeError, ValueError) as e:
            return str(e)
        return None

    def registered(self, ptr: int, nbytes: int) -> bool:
        """Whether ``[ptr, ptr + nbytes)`` lies inside one registered host span."""
        with self._lock:
            return any(b <= ptr and ptr + nbytes <= b + m for b, m in self._spans)

    def set_layout(self, spec: Mapping[str, object]) -> str:
        """Declares the shape of this node's pages (the store's layout check); returns its
        fingerprint."""
        return str(self._node.set_layout(json.dumps(dict(spec))))

    # ----- batches -----
    def put(self, keys: Sequence[str], segs: Segments) -> List[bool]:
        """Publishes page ``i`` from its segments under ``keys[i]``."""
        return list(self._node.batch_set_ptrs(list(keys), segs.ptrs, segs.sizes, segs.counts))

    def put_partial(self, keys: Sequence[str], segs: Segments, valid: Sequence[int]) -> List[bool]:
        """Publishes pages whose valid bytes are ``valid[i]`` (a partial tail page)."""
        return list(self._node.batch_set_partial_ptrs(list(keys), segs.ptrs, segs.sizes, segs.counts, list(valid)))

    def get(self, keys: Sequence[str], segs: Segments, hint: Optional[str] = None) -> List[bool]:
        """Reads page ``i`` into its segments; True = the segments hold the page written under
        that key (verified), False = a miss. ``hint``: the node id a router says holds the
        pages; it is asked first, instead of the directory, and what it does not hold is
        looked up as always (never trusted for the bytes)."""
        return list(self._node.batch_get_ptrs(list(keys), segs.ptrs, segs.sizes, segs.counts, hint))

    def get_valid(self, keys: Sequence[str], segs: Segments) -> List[Optional[int]]:
        """Like :meth:`get`, with each page's valid byte count (None: a miss)."""
        return list(self._node.batch_get_valid_ptrs(list(keys), segs.ptrs, segs.sizes, segs.counts))

    def get_device(self, keys: Sequence[str], segs: Segments) -> List[bool]:
        """Reads pages straight into registered device memory (GPUDirect RDMA)."""
        return list(self._node.batch_get_device_ptrs(list(keys), segs.ptrs, segs.sizes, segs.counts))

    def put_buffers(self, keys: Sequence[str], values: Sequence[object]) -> List[bool]:
        """Publishes pages from Python buffers (copied)."""
        return list(self._node.batch_set_buffers(list(keys), list(values)))

    def get_buffers(self, keys: Sequence[str], dests: Sequence[object]) -> List[bool]:
        """Reads pages into writable Python buffers (copied)."""
        return list(self._node.batch_get_buffers(list(keys), list(dests)))

    def leading(self, keys: Sequence[str], hint: Optional[str] = None) -> int:
        """How many leading keys are held anywhere in the cluster (one batched lookup). ``hint``:
        the node id a router says holds them; it is asked first, and when it holds every key no
        directory request is sent (a wrong hint costs a round trip, never a wrong count)."""
        return int(self._node.batch_exists(list(keys), hint))

    def leading_valid(self, keys: Sequence[str]) -> List[int]:
        """The valid byte count of each leading present page."""
        return list(self._node.batch_exists_valid(list(keys)))

    def prefix_locations(self, keys: Sequence[str]) -> List["PrefixRun"]:
        """Where a request's prefix is: every node holding ``keys[0]``, with the leading run of
        ``keys`` (in order) it holds and the in-memory part of that run, longest first — what
        a cache-aware router asks before it picks an engine. One directory fan-out."""
        return prefix_runs(str(self._node.prefix_locations_json(list(keys))))

    def contains(self, keys: Sequence[str]) -> List[bool]:
        """Presence of every key (not only the leading run)."""
        return list(self._node.batch_contains(list(keys)))

    def wait_for_full_prefix(self, keys: Sequence[str], timeout_s: float) -> int:
        """Waits up to ``timeout_s`` until every key is present; the leading count then."""
        return int(self._node.wait_for_full_prefix(list(keys), float(timeout_s)))

    def clear(self) -> int:
        """Removes every page this node published; how many."""
        return int(self._node.clear())

    def cluster(self) -> Dict[str, object]:
        """The node's view of the cluster (members, endpoints, transport), as ``/cluster``."""
        out: Dict[str, object] = json.loads(self._node.cluster_json())
        return out

    def pool_readiness(self) -> Tuple[int, int]:
        """(bytes of the pool faulted in and usable, bytes of the whole pool). A node serves from
        the start; a large pool warms in the background and its slabs join as they are in."""
        s = json.loads(self._node.stats_json())
        return int(s["pool_ready_bytes"]), int(s["pool_total_bytes"])

    def log_readiness(self) -> None:
        """One INFO line when the pool is still warming (the node serves meanwhile)."""
        ready, total = self.pool_readiness()
        if ready < total:
            logger.info(
                "peercache: in the cluster; pool warming in the background, %.1f of %.1f GiB ready",
                ready / 2**30,
                total / 2**30,
            )

    def stats(self) -> Dict[str, object]:
        """The node's counters."""
        out: Dict[str, object] = json.loads(self._node.stats_json())
        return out

"""``PeerCacheStore``: PeerCache as an SGLang HiCache L3 storage backend.

Launch SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "peercache",
        "module_path": "peercache.store", "class_name": "PeerCacheStore",
        "interface_v1": 1, "discovery_addr": "10.0.0.1:31998"}'

Keys: SGLang passes bare page hashes. A page key here is
``<model>|<hash>|tp<rank>of<size>`` for MHA (ranks of different TP sizes never collide), and
``<model>|<hash>|mla`` for MLA, where rank 0 writes and every rank reads; ``|pp<rank>`` and
``|cp<rank>`` are added when those sizes are above 1. With decode context parallelism
(``dcp_size`` > 1, MLA only) each DCP rank keeps its shard of every page under
``<model>|<hash>|mla|tp<size>|dcp<rank>of<size>|page<logical page size>``, published by the
first DCP group (``is_storage_writer``); other ranks read and skip their writes. The node then
applies ``prefix`` (one keyspace on every path). A page's components (K and V, or every layer in ``layer_first``) are
segments of that one key, so they are stored, evicted and served together.

Side pools of the v2 interface (Mamba, SWA, DSA indexer, draft, DeepSeek-V4 compressed pools)
store page ``h`` of pool ``p`` under ``<page key>|<p>``; the page key is the shared ``|mla``
form for MLA-shaped pools of an MLA model and the per-rank form otherwise (Mamba state and
MHA-shaped pools are split by rank).
"""

import functools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import (
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Sized,
    Tuple,
    TypedDict,
    Union,
    cast,
)

from . import policy as policy_fns
from .core import ConfigValue, PageStore, Segments, as_bool, ptr_len
from .sglang_types import (
    HostPool,
    HostPoolGroup,
    Indices,
    PoolEntry,
    PoolKey,
    PoolTransfer,
    StorageMetrics,
    TransferResult,
)

logger = logging.getLogger("peercache")


def _hicache_base() -> type:
    """SGLang's real base class when importable (imported on its own, so a missing optional
    name elsewhere cannot break the subclass check), else a stand-in."""
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: PLC0415

        return HiCacheStorage
    except Exception:  # sglang absent or unimportable: stand alone, silently.

        class HiCacheStorage:  # type: ignore[no-redef]
            """Stand-in with the attributes SGLang's base class sets."""

            def register_mem_pool_host(self, mem_pool_host: object) -> None:
                self.mem_pool_host = mem_pool_host

        return HiCacheStorage


_Base = _hicache_base()


def _storage_metrics_class() -> Optional[Callable[[], StorageMetrics]]:
    """SGLang's ``StorageMetrics``: ``sglang.srt.observability.metrics_collector`` since 0.5.6,
    ``sglang.srt.metrics.collector`` before. SGLang's collector checks ``isinstance`` against it,
    so a look-alike would not do. None when sglang is absent."""
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return getattr(__import__(module, fromlist=["StorageMetrics"]), "StorageMetrics")
        except Exception:
            continue
    return None


_as_bool = as_bool
_ptr_len = ptr_len
_leading = policy_fns.leading


_BUFFER_SUFFIXES = ("_buffer", "_buffers")
_POLICIES = ("all_pages", "trailing_pages", "block_groups")


def _host_tensors(pool: object) -> List[object]:
    """The host tensors (or arrays) a pool keeps its pages in: every ``*_buffer`` attribute
    that is one, or a list of them, on the CPU. Device mirrors are skipped."""
    out: List[object] = []
    attrs = getattr(pool, "__dict__", {})
    for name, v in attrs.items():
        if not name.endswith(_BUFFER_SUFFIXES) or name.startswith("device"):
            continue
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            dev = getattr(t, "device", None)
            if hasattr(t, "data_ptr") and getattr(dev, "type", "cpu") != "cpu":
                continue
            if hasattr(t, "data_ptr") or hasattr(t, "__array_interface__"):
                out.append(t)
    return out


def pool_name(x: object) -> str:
    """``PoolName.MAMBA`` → ``"mamba"``; plain strings pass through."""
    return str(getattr(x, "value", x))


def _numel(x: Optional[Indices]) -> int:
    if x is None:
        return 0
    numel = getattr(x, "numel", None)  # a tensor; lists and arrays have a length
    if callable(numel):
        return int(numel())
    return len(cast(Sized, x))


@dataclass
class _PoolTransferResult:
    """Stand-in for SGLang's ``PoolTransferResult`` on releases without it."""

    kv_hit_pages: int
    extra_pool_hit_pages: Dict[PoolKey, int]
    restorable_prefix_pages: Optional[List[int]] = None


class PoolSpec(TypedDict):
    """One pool of a :class:`LayoutSpec`."""

    name: str
    tokens_per_page: int
    host_layout: str
    bytes_per_page: int


class LayoutSpec(TypedDict):
    """The layout spec of a rank's pages (what :meth:`PeerCacheStore.layout_spec` returns and
    the node fingerprints)."""

    model: str
    kv_dtype: str
    pp_rank: int
    tp: Optional[List[int]]
    pools: List[PoolSpec]


class _ResultClass(Protocol):
    """``PoolTransferResult``'s constructor (older releases take no restorable pages)."""

    def __call__(self, kv_hit_pages: int, extra_pool_hit_pages: Dict[PoolKey, int],
                 restorable_prefix_pages: Optional[List[int]] = ...) -> TransferResult: ...


@functools.lru_cache(maxsize=1)
def _v2_types() -> Tuple[_ResultClass, PoolKey]:
    """(``PoolTransferResult``, ``PoolName.KV``) from SGLang 0.5.19+, else stand-ins."""
    try:
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransferResult  # noqa: PLC0415

        return PoolTransferResult, PoolName.KV
    except Exception:
        return _PoolTransferResult, "kv"


def _transfer_result(kv: int, hits: Dict[PoolKey, int], restorable: List[int]) -> TransferResult:
    cls, _ = _v2_types()
    try:
        return cls(kv, hits, restorable)
    except TypeError:  # releases whose result has no restorable_prefix_pages yet
        r = cls(kv, hits)
        return r


def _extra(extra_info: object) -> Mapping[str, ConfigValue]:
    """The free-form part of a call's extra info: ``HiCacheStorageExtraInfo.extra_info`` or a
    plain dict; empty for anything else (None, or an object without it)."""
    if isinstance(extra_info, dict):
        return extra_info
    inner = getattr(extra_info, "extra_info", None)
    return inner if isinstance(inner, dict) else {}


class PeerCacheStore(_Base):  # type: ignore[misc,valid-type]
    """SGLang HiCache storage backend on a PeerCache node (one node per rank)."""

    def __init__(self, storage_config: object = None, kwargs: object = None) -> None:
        extra: Dict[str, ConfigValue] = {}
        if storage_config is not None:
            extra.update(getattr(storage_config, "extra_config", None) or {})
        if isinstance(kwargs, dict):  # built-in convention passes mem_pool_host here: ignore
            extra.update(kwargs)
        get = lambda name, default: getattr(storage_config, name, default) if storage_config is not None else default  # noqa: E731
        self.tp_rank = int(get("tp_rank", extra.get("tp_rank", 0)) or 0)
        self.tp_size = int(get("tp_size", extra.get("tp_size", 1)) or 1)
        self.pp_rank = int(get("pp_rank", 0) or 0)
        self.pp_size = int(get("pp_size", 1) or 1)
        self.cp_rank = int(get("attn_cp_rank", 0) or 0)
        self.cp_size = int(get("attn_cp_size", 1) or 1)
        self.is_mla = _as_bool(get("is_mla_model", False), "is_mla_model")
        self.model = str(get("model_name", None) or extra.get("model_name") or "model")
        self.interface_v1 = _as_bool(extra.get("interface_v1", False), "interface_v1")
        self._kv_cache_dtype = extra.get("kv_cache_dtype")
        # Decode context parallelism (MLA only): each DCP rank holds its shard of every page;
        # equivalent shards of different DCP groups share one key, written by the first group.
        self.dcp_rank = int(get("dcp_rank", 0) or 0)
        self.dcp_size = int(get("dcp_size", 1) or 1)
        self.logical_page_size = get("logical_page_size", None)
        computed_writer = (not self.is_mla) or self.tp_rank == self.dcp_rank
        self.is_storage_writer = bool(getattr(storage_config, "is_storage_writer", computed_writer)) \
            if storage_config is not None else computed_writer
        cfg = {k: v for k, v in extra.items() if k not in ("interface_v1", "kv_cache_dtype")}
        cfg.update({"tp_rank": self.tp_rank, "tp_size": self.tp_size, "pp_rank": self.pp_rank, "pp_size": self.pp_size})
        cfg.setdefault("dp_rank", int(get("dp_rank", 0) or 0))
        self._closed = False
        self.mem_pool_host: Optional[Union[HostPool, HostPoolGroup]] = None
        self._page_pool: Optional[HostPool] = None
        self._kv_page_bytes = 0  # bytes of one KV page of the registered pool (0: unknown)
        self.registered_pools: Dict[PoolKey, HostPool] = {}
        self._pools_by_name: Dict[str, HostPool] = {}
        self._warned: set[str] = set()
        self._stats_lock = threading.Lock()
        self._stats: Dict[str, List[float]] = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                                               "backup_bandwidth": []}
        # `startup_timeout` bounds every wait for the cluster (0 = wait forever, as configured).
        self._startup_timeout = float(cfg.get("startup_timeout", 30.0) or 0.0)
        self.core = PageStore(cfg, startup_timeout=self._startup_timeout)
        if not self.is_storage_writer:
            logger.info("peercache: TP rank %d is not this shard's storage writer: it reads, and its "
                        "writes are skipped (the writer publishes the same bytes)", self.tp_rank)
        self.core.wait_ready()  # keeps SGLang starting; calls miss until the cluster answers

    # ----- keys -----
    def _key(self, h: str, shared: Optional[bool] = None) -> str:
        """The page key of hash ``h``: shared by every TP rank (MLA-style pools, which hold
        the same bytes on every rank) or this rank's own."""
        shared = self.is_mla if shared is None else shared
        k = f"{self.model}|{h}|mla" if shared else f"{self.model}|{h}|tp{self.tp_rank}of{self.tp_size}"
        if shared and self.dcp_size > 1:
            # One shard of the page per DCP rank; its geometry depends on TP and the page.
            k += f"|tp{self.tp_size}|dcp{self.dcp_rank}of{self.dcp_size}|page{self.logical_page_size}"
        if self.pp_size > 1:
            k += f"|pp{self.pp_rank}"
        if self.cp_size > 1:
            k += f"|cp{self.cp_rank}"
        return k

    def _keys(self, keys: Sequence[str]) -> List[str]:
        return [self._key(k) for k in keys]

    # ----- registration -----
    def register_mem_pool_host(self, mem_pool_host: Union[HostPool, HostPoolGroup]) -> None:
        """Registers SGLang's host KV pool for zero-copy transfers. A ``HostPoolGroup``
        (DeepSeek-V4 and other multi-pool models) is resolved to its anchor pool for page
        geometry, and every entry's ``kv_buffer`` is registered."""
        self.mem_pool_host = mem_pool_host
        anchor: Optional[PoolEntry] = getattr(mem_pool_host, "anchor_entry", None)
        page_pool = anchor.host_pool if anchor is not None else cast(HostPool, mem_pool_host)
        self._page_pool = page_pool
        entries: List[PoolEntry] = list(getattr(mem_pool_host, "entries", [])) if anchor is not None else []
        pools = [e.host_pool for e in entries] if anchor is not None else [page_pool]
        # A group's side pools are known by name from here on, whether or not SGLang also
        # registers each of them through register_mem_host_pool_v2.
        for e in entries:
            if e is not anchor:
                self.registered_pools.setdefault(e.name, e.host_pool)
                self._pools_by_name.setdefault(pool_name(e.name), e.host_pool)
        registered = sum(self._register_buffers(pool) for pool in pools)
        self._kv_page_bytes = self._page_bytes()
        if registered == 0:
            logger.info("peercache: host pool has no kv_buffer (logical anchor); nothing to register")
        self._declare_layout()

    def register_mem_host_pool_v2(self, host_pool: HostPool, host_pool_name: PoolKey) -> None:
        """Registers one more host pool (Mamba, SWA, DSA indexer, draft, DeepSeek-V4
        compressed pools…) under its name; its buffers become zero-copy destinations."""
        self.registered_pools[host_pool_name] = host_pool
        self._pools_by_name[pool_name(host_pool_name)] = host_pool
        self._register_buffers(host_pool)
        self._declare_layout()

    def on_host_pools_registered(self) -> None:
        """Validates every registered pool once, so a bad registration fails the attach rather
        than the first request: each pool's page geometry resolves through its own
        ``get_page_buffer_meta`` for one page, into buffers that are all registered with the
        node (the zero-copy path), of sizes that add up to a page; a logical anchor (no
        buffers) is accepted, and its v1 calls will miss. Raises ``ValueError`` naming the pool
        and what is wrong."""
        checks: List[Tuple[str, HostPool]] = []
        if self._page_pool is not None:
            checks.append(("kv", self._page_pool))
        checks.extend((n, p) for n, p in self._pools_by_name.items() if n != "kv" or p is not self._page_pool)
        for name, pool in checks:
            if name == "kv" and getattr(pool, "kv_buffer", None) is None:
                self._warn_once("v1:anchor", "peercache: the KV host pool is a logical anchor (no page "
                                "buffers): v1 calls miss; side pools carry the pages (v2)")
                continue
            page_size = int(getattr(pool, "page_size", 0) or 0)
            if page_size <= 0:
                raise ValueError(f"peercache: host pool {name!r} has no page_size")
            meta = getattr(pool, "get_page_buffer_meta", None)
            if meta is None:
                raise ValueError(f"peercache: host pool {name!r} has no get_page_buffer_meta")
            indices = self._one_page_indices(pool, name, page_size)
            try:
                ptrs, sizes = meta(indices)
            except Exception as e:
                raise ValueError(f"peercache: host pool {name!r}: get_page_buffer_meta failed for one "
                                 f"page ({type(e).__name__}: {e})") from e
            if not ptrs or len(ptrs) != len(sizes) or any(int(z) <= 0 for z in sizes):
                raise ValueError(f"peercache: host pool {name!r}: a page resolves to {len(ptrs)} buffers "
                                 f"of sizes {list(map(int, sizes))[:4]}")
            outside = [(int(p), int(z)) for p, z in zip(ptrs, sizes)
                       if not self.core.registered(int(p), int(z))]
            if outside:
                raise ValueError(f"peercache: host pool {name!r}: {len(outside)} of {len(ptrs)} page buffers "
                                 f"lie outside every registered host buffer (first at {outside[0][0]:#x}, "
                                 f"{outside[0][1]} bytes): register the pool before the attach completes")
        self._declare_layout()

    def layout_spec(self) -> Optional[LayoutSpec]:
        """The layout spec of this rank's pages, from the registered pools: model, KV dtype,
        PP rank, the TP shard for MHA (none for MLA, whose latent every TP rank shares) and each
        pool's name, tokens per page, host layout and bytes per page. None before a pool with
        page buffers is registered."""
        pools: List[PoolSpec] = []
        named: List[Tuple[str, HostPool]] = []
        if self._page_pool is not None:
            named.append(("kv", self._page_pool))
        named.extend((n, p) for n, p in self._pools_by_name.items() if p is not self._page_pool)
        dtype = None
        for name, pool in named:
            if getattr(pool, "kv_buffer", None) is None and name == "kv":
                continue  # a logical anchor carries no bytes of its own
            page_size = int(getattr(pool, "page_size", 0) or 0)
            per_token = int(getattr(pool, "size_per_token", 0) or 0)
            if page_size <= 0 or per_token <= 0:
                continue
            host_layout = str(getattr(pool, "layout", "layer_first") or "layer_first")
            tag = getattr(pool, "storage_format_tag", None)  # the pool's own page byte format
            if tag:
                host_layout += f"+{tag}"
            pools.append({"name": str(name), "tokens_per_page": page_size, "host_layout": host_layout,
                          "bytes_per_page": per_token * page_size})
            pool_dtype = getattr(pool, "dtype", None)
            if dtype is None and pool_dtype is not None:
                dtype = str(pool_dtype)
        if not pools:
            return None
        # Host pools keep the storage dtype (fp8 caches are stored as uint8): the deployment's
        # `kv_cache_dtype`, when given in the extra config, names the cache dtype exactly.
        dtype = str(self._kv_cache_dtype or dtype or "unknown")
        return {"model": self.model, "kv_dtype": dtype, "pp_rank": self.pp_rank,
                "tp": None if self.is_mla else [self.tp_rank, self.tp_size], "pools": pools}

    def _declare_layout(self) -> None:
        """Tells the node the shape of this rank's pages: every page it writes carries the
        fingerprint, and pages of another shape under the same keys (another dtype, TP split,
        page size or host layout of the same model) are misses, never wrong bytes."""
        spec = self.layout_spec()
        if spec is None:
            return
        fp = self.core.set_layout(spec)
        if fp != getattr(self, "_layout", None):
            self._layout = fp
            logger.info("peercache: page layout %s (%s, %d pool(s))", fp, spec["kv_dtype"], len(spec["pools"]))

    @staticmethod
    def _one_page_indices(pool: HostPool, name: str, page_size: int) -> Indices:
        """Host indices of the first page of ``pool`` in the form its ``get_page_buffer_meta``
        takes: a torch tensor when torch is importable (SGLang's pools), else a list."""
        # Mamba pools index one slot per page; token pools page_size tokens.
        count = 1 if name == "mamba" else page_size
        try:
            import torch  # noqa: PLC0415

            return cast(Indices, torch.arange(0, count, dtype=torch.int64))
        except Exception:
            return list(range(count))

    def _register_buffers(self, pool: object) -> int:
        """Registers every host tensor of ``pool`` (``kv_buffer``, Mamba's ``temporal_buffer``
        and ``conv_buffer``, indexer buffers…), each span once. Returns how many it added."""
        added = 0
        for t in _host_tensors(pool):
            try:
                pl = _ptr_len(t)
            except ValueError:
                continue  # a strided view of a buffer registered whole elsewhere
            if pl is None or pl[1] == 0:
                continue
            ptr, n = pl
            if self.core.register_host(ptr, n):
                added += 1
        return added

    # ----- v1 zero-copy -----
    def _meta(self, keys: Sequence[str], host_indices: Indices) -> Optional[Tuple[List[int], List[int], List[int]]]:
        pool = self._page_pool
        if self.mem_pool_host is None or pool is None or not keys:
            return None
        if getattr(pool, "kv_buffer", None) is None:
            # A logical anchor (DeepSeek-V4's LogicalHostPool) holds no bytes: v1 has nothing
            # to move; the v2 side pools carry the pages. Every key misses (0.8.4 behaviour).
            self._warn_once("v1:anchor", "peercache: the KV host pool is a logical anchor (no page "
                            "buffers): v1 calls miss; side pools carry the pages (v2)")
            return None
        try:
            ptrs, sizes = pool.get_page_buffer_meta(host_indices)
        except Exception as e:
            self._warn_once("v1:meta", "peercache: the KV host pool gave no page buffer meta (%s); its pages miss", e)
            return None
        n = len(keys)
        per, rem = divmod(len(ptrs), n)
        if rem or per == 0:
            logger.warning("peercache: %d buffer segments for %d pages; refusing the batch", len(ptrs), n)
            return None
        return list(map(int, ptrs)), list(map(int, sizes)), [per] * n

    def batch_set_v1(self, keys: List[str], host_indices: Indices, extra_info: object = None) -> List[bool]:
        """Publishes the pages at ``host_indices``. With ``extra_info`` carrying
        ``{"last_page_valid_tokens": n}`` (a ``HiCacheStorageExtraInfo``'s ``extra_info``, or
        a plain dict), the last page is a partial tail holding ``n`` valid tokens — see
        :meth:`batch_set_v1_partial`."""
        valid = _extra(extra_info).get("last_page_valid_tokens")
        if valid is not None:
            return self.batch_set_v1_partial(keys, host_indices, int(valid))
        if not self.is_storage_writer:
            return [True] * len(keys)
        m = self._meta(keys, host_indices)
        if m is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        res = self.core.put(self._keys(keys), Segments(*m))
        self._record("backup", sum(res), sum(m[1]), time.perf_counter() - t0)
        return res

    def batch_set_v1_partial(self, keys: List[str], host_indices: Indices, last_page_valid_tokens: int) -> List[bool]:
        """Publishes pages whose last one is a partial tail: only its first
        ``last_page_valid_tokens`` tokens hold data (a prefill rank handing off a prompt that
        does not end on a page boundary). The whole page is stored; readers see the count
        through :meth:`batch_get_v1_valid` and :meth:`batch_exists_tokens`."""
        if not self.is_storage_writer:
            return [True] * len(keys)
        page_size = int(getattr(self._page_pool, "page_size", 0) or 0)
        if not 0 < last_page_valid_tokens <= max(page_size, 1):
            raise ValueError(f"peercache: last_page_valid_tokens = {last_page_valid_tokens}: expected "
                             f"1..{page_size} (the page size)")
        m = self._meta(keys, host_indices)
        if m is None:
            return [False] * len(keys)
        ptrs, sizes, counts = m
        per = counts[0]
        page_bytes = [sum(sizes[i * per:(i + 1) * per]) for i in range(len(keys))]
        # Valid lengths are kept in bytes: a token's share of the page, whatever the layout.
        valid = page_bytes[:-1] + [page_bytes[-1] * last_page_valid_tokens // page_size]
        t0 = time.perf_counter()
        res = self.core.put_partial(self._keys(keys), Segments(ptrs, sizes, counts), valid)
        self._record("backup", sum(res), sum(sizes), time.perf_counter() - t0)
        return res

    def batch_get_v1(self, keys: List[str], host_indices: Indices, extra_info: object = None) -> List[bool]:
        m = self._meta(keys, host_indices)
        if m is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        res = self.core.get(self._keys(keys), Segments(*m))
        self._record("prefetch", sum(res), sum(m[1]), time.perf_counter() - t0)
        return res

    def batch_get_v1_valid(self, keys: List[str], host_indices: Indices, extra_info: object = None) -> List[Optional[int]]:
        """Like :meth:`batch_get_v1`, but per page how many of its tokens are valid (the page
        size for a whole page, fewer for a partial tail, ``None`` for a miss)."""
        m = self._meta(keys, host_indices)
        if m is None:
            return [None] * len(keys)
        ptrs, sizes, counts = m
        per = counts[0]
        page_size = int(getattr(self._page_pool, "page_size", 1) or 1)
        t0 = time.perf_counter()
        got = self.core.get_valid(self._keys(keys), Segments(ptrs, sizes, counts))
        self._record("prefetch", sum(v is not None for v in got), sum(sizes), time.perf_counter() - t0)
        out: List[Optional[int]] = []
        for i, v in enumerate(got):
            page = sum(sizes[i * per:(i + 1) * per])
            out.append(None if v is None else (page_size if v >= page else v * page_size // page))
        return out

    def batch_exists(self, keys: List[str], extra_info: object = None) -> int:
        # `extra_info.prefix_keys` (the hashes before these keys) saves nothing here: a page
        # hash already names its whole prefix, so the keys alone decide; it is ignored.
        if not keys:
            return 0
        return self.core.leading(self._keys(keys))

    def batch_exists_tokens(self, keys: List[str], extra_info: object = None) -> int:
        """The restorable prefix in tokens: whole leading pages times the page size, plus a
        partial tail's valid tokens (a decode rank seeing a prefill rank's last page)."""
        if not keys:
            return 0
        page_size = int(getattr(self._page_pool, "page_size", 1) or 1)
        valid = self.core.leading_valid(self._keys(keys))
        page = self._kv_page_bytes
        tokens = 0
        for v in valid:
            if page and v < page:
                tokens += v * page_size // page
                break
            tokens += page_size
        return tokens

    def _page_bytes(self) -> int:
        """Bytes of one KV page of the registered host pool (0 when unknown); computed once,
        at registration."""
        pool = self._page_pool
        if pool is None or getattr(pool, "kv_buffer", None) is None:
            return 0
        try:
            _, sizes = pool.get_page_buffer_meta(self._one_page_indices(pool, "kv", int(pool.page_size)))
            return int(sum(int(z) for z in sizes))
        except Exception:
            return 0

    def wait_for_full_prefix(self, keys: List[str], timeout_s: float) -> int:
        """Waits (bounded by ``timeout_s``) until every key is present; returns the leading
        count. For decode ranks waiting on a prefill rank's pages."""
        if not keys:
            return 0
        return self.core.wait_for_full_prefix(self._keys(keys), float(timeout_s))

    # ----- v2: KV plus sidecar pools (SGLang 0.5.19+) -----
    def _pool(self, name: str) -> Optional[HostPool]:
        pool = self._pools_by_name.get(name)
        if pool is None and name == "kv":
            pool = self._page_pool
        return pool

    def _pool_shared(self, name: str, pool: object) -> bool:
        """Whether a pool's pages are the same on every TP rank (so one key serves all
        ranks): the KV pool of an MLA model and, in MLA models, its MLA-shaped side pools
        (DSA indexer, DeepSeek-V4 compressed pools, an MLA draft). Mamba state and MHA-shaped
        pools (K and V split by head) are per rank."""
        if name == "kv":
            return self.is_mla
        if not self.is_mla or name == "mamba":
            return False
        return not (hasattr(pool, "v_buffer") or type(pool).__name__.startswith("MHA"))

    def pool_key(self, name: str, pool: object, h: str) -> str:
        """The key of page ``h`` of host pool ``name`` (the KV pool's is the page key)."""
        if name == "kv":
            return self._key(h)
        return f"{self._key(h, self._pool_shared(name, pool))}|{name}"

    def _warn_once(self, what: str, msg: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(msg, *args)

    def _v2_io(self, transfers: Optional[Sequence[PoolTransfer]], write: bool) -> Dict[PoolKey, List[bool]]:
        """Every pool of the call in one node batch: each page's buffers (2–3 for Mamba and
        DeepSeek-V4 layouts) are the segments of one key, gathered on write and scattered on
        read by the transport — no packing copy."""
        results: Dict[PoolKey, List[bool]] = {}
        spans: List[Tuple[PoolKey, int, int]] = []
        keys_all: List[str] = []
        ptrs: List[int] = []
        sizes: List[int] = []
        counts: List[int] = []
        for t in transfers or []:
            name = pool_name(t.name)
            keys = list(t.keys or [])
            if not keys:
                results.setdefault(t.name, [])
                continue
            pool = self._pool(name)
            if pool is None:
                self._warn_once("pool:" + name, "peercache: pool %r was never registered; its pages miss", name)
                results.setdefault(t.name, []).extend([False] * len(keys))
                continue
            page_size = int(getattr(pool, "page_size", 1) or 1)
            indices = t.host_indices
            if indices is None or _numel(indices) != len(keys) * page_size:
                self._warn_once("idx:" + name, "peercache: pool %r got %d host indices for %d pages of %d; refusing the batch",
                                name, _numel(t.host_indices), len(keys), page_size)
                results.setdefault(t.name, []).extend([False] * len(keys))
                continue
            try:
                p, sz = pool.get_page_buffer_meta(indices)
            except Exception as e:  # e.g. a Mamba pool in a layout with no zero-copy meta
                self._warn_once("meta:" + name, "peercache: pool %r has no page buffer meta (%s); its pages miss", name, e)
                results.setdefault(t.name, []).extend([False] * len(keys))
                continue
            per, rem = divmod(len(p), len(keys))
            if rem or per == 0:
                self._warn_once("segs:" + name, "peercache: pool %r gave %d buffers for %d pages; refusing the batch",
                                name, len(p), len(keys))
                results.setdefault(t.name, []).extend([False] * len(keys))
                continue
            spans.append((t.name, len(keys_all), len(keys)))
            keys_all.extend(self.pool_key(name, pool, h) for h in keys)
            ptrs.extend(map(int, p))
            sizes.extend(map(int, sz))
            counts.extend([per] * len(keys))
        if keys_all:
            t0 = time.perf_counter()
            op = self.core.put if write else self.core.get
            res = op(keys_all, Segments(ptrs, sizes, counts))
            self._record("backup" if write else "prefetch", sum(res), sum(sizes), time.perf_counter() - t0)
            for pool_key, start, n in spans:
                results.setdefault(pool_key, []).extend(res[start:start + n])
        return results

    def batch_set_v2(self, transfers: Sequence[PoolTransfer], extra_info: object = None) -> Dict[PoolKey, List[bool]]:
        """Writes each ``PoolTransfer``'s pages from its host pool; per pool, one flag a page."""
        if not self.is_storage_writer:
            return {t.name: [True] * len(t.keys or []) for t in transfers or []}
        return self._v2_io(transfers, write=True)

    def batch_get_v2(self, transfers: Sequence[PoolTransfer], extra_info: object = None) -> Dict[PoolKey, List[bool]]:
        """Reads each ``PoolTransfer``'s pages into its host pool; per pool, one flag a page."""
        return self._v2_io(transfers, write=False)

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[Sequence[PoolTransfer]] = None,
                        extra_info: object = None) -> TransferResult:
        """The usable prefix over the KV pool and every side pool, by each pool's hit policy
        (``all_pages``, ``trailing_pages``, ``block_groups``), in one directory fan-out.

        ``kv_hit_pages`` is the longest prefix every gating pool can restore;
        ``extra_pool_hit_pages`` each pool's own boundary; ``restorable_prefix_pages`` every
        prefix length that works (a trailing-window pool leaves holes, so SGLang intersects
        these sets across ranks rather than taking a maximum)."""
        _, kv_name = _v2_types()
        n = len(keys)
        if n == 0:
            return _transfer_result(0, {}, [])
        # A logical anchor (DeepSeek-V4 groups) has no KV bytes: the side pools decide.
        logical = self._page_pool is not None and getattr(self._page_pool, "kv_buffer", None) is None
        probe: List[str] = [] if logical else [self._key(h) for h in keys]
        plan: List[Tuple[PoolTransfer, Optional[int]]] = []
        for t in pool_transfers or []:
            name = pool_name(t.name)
            policy = pool_name(getattr(t, "hit_policy", "all_pages"))
            if policy not in _POLICIES:
                raise ValueError(f"peercache: unsupported pool hit policy {policy!r} for pool {name!r}")
            pool = self._pool(name)
            if pool is None:
                self._warn_once("pool:" + name, "peercache: pool %r was never registered; its pages miss", name)
                plan.append((t, None))
                continue
            plan.append((t, len(probe)))
            probe.extend(self.pool_key(name, pool, h) for h in keys)
        present = self.core.contains(probe) if probe else []
        kv_pages = n if logical else _leading(present[:n])
        hits: Dict[PoolKey, int] = {kv_name: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t, start in plan:
            ex = present[start:start + n] if start is not None else [False] * n
            policy = pool_name(getattr(t, "hit_policy", "all_pages"))
            if policy == "block_groups":
                # Never gates the KV hit: the pool's own verdict is the pages its leading
                # complete key groups (one per block, from the span start) cover.
                group = max(1, int(getattr(t, "group_pages", 0) or 1))
                block = max(1, int(getattr(t, "block_pages", 0) or group))
                covered = policy_fns.leading_groups_cover(ex, group, block)
                if covered:
                    hits[t.name] = covered
                continue
            if not restorable:
                continue
            if policy == "all_pages":
                boundary = _leading(ex[:kv_pages])
                ok = set(range(1, boundary + 1))
            else:  # trailing_pages
                window = max(1, len(t.keys) if t.keys else 1)
                ok = policy_fns.trailing_restorable(ex, kv_pages, window)
                boundary = max(ok, default=0)
            if boundary:
                hits[t.name] = boundary
            restorable = [p for p in restorable if p in ok]
        return _transfer_result(restorable[-1] if restorable else 0, hits, restorable)

    # ----- generic (legacy) path -----
    def batch_set(self, keys: List[str], values: Optional[Sequence[object]] = None,
                  target_locations: Optional[Sequence[int]] = None,
                  target_sizes: Optional[Sequence[int]] = None) -> bool:
        if not keys:
            return True
        if values is None and target_locations is not None:
            if target_sizes is None:
                raise ValueError("batch_set with target_locations needs target_sizes")
            ptrs = [int(p) for p in target_locations]
            sizes = [int(s) for s in target_sizes]
            return all(self.core.put(self._keys(keys), Segments(ptrs, sizes, [1] * len(keys))))
        values = list(values or [])
        pl = [_ptr_len(v) for v in values]
        ok = True
        at = [(i, p) for i, p in enumerate(pl) if p is not None]
        idx_buf = [i for i, p in enumerate(pl) if p is None]
        if at:
            ok &= all(self.core.put(self._keys([keys[i] for i, _ in at]), Segments(
                [p[0] for _, p in at], [p[1] for _, p in at], [1] * len(at))))
        if idx_buf:
            ok &= all(self.core.put_buffers(self._keys([keys[i] for i in idx_buf]), [values[i] for i in idx_buf]))
        return bool(ok)

    def set(self, key: str, value: object = None, target_location: Optional[int] = None,
            target_sizes: Optional[int] = None) -> bool:
        if value is None and target_location is not None:
            if target_sizes is None:
                raise ValueError("set with target_location needs target_sizes")
            return self.batch_set([key], None, [target_location], [target_sizes])
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Optional[Sequence[object]] = None,
                  target_sizes: Optional[Sequence[int]] = None) -> Union[int, List[Optional[object]]]:
        """Fills each destination (tensor, array or writable bytes-like) and returns it, or
        None for a miss. With integer addresses and ``target_sizes`` it returns the number of
        leading pages read. A read-only destination (``bytes``) raises ValueError."""
        if not keys:
            return []
        targets = list(target_locations or [])
        if len(targets) != len(keys):
            raise ValueError("batch_get needs one destination per key")
        addrs = [t for t in targets if isinstance(t, int)]
        if targets and len(addrs) == len(targets):
            if target_sizes is None:
                raise ValueError("batch_get with integer addresses needs target_sizes")
            return self._get_addresses(keys, addrs, target_sizes)
        return self._get_buffers(keys, targets)

    def _get_addresses(self, keys: List[str], addrs: List[int], sizes: Sequence[int]) -> int:
        """Reads page ``i`` to address ``addrs[i]`` (``sizes[i]`` bytes); the leading pages read."""
        got = self.core.get(self._keys(keys), Segments(addrs, [int(s) for s in sizes], [1] * len(keys)))
        return _leading(got)

    def _get_buffers(self, keys: List[str], targets: List[object]) -> List[Optional[object]]:
        """Fills each destination buffer; the destination for a hit, None for a miss."""
        pl = [_ptr_len(t) for t in targets]
        res: List[bool] = [False] * len(keys)
        at = [(i, p) for i, p in enumerate(pl) if p is not None]
        idx_buf = [i for i, p in enumerate(pl) if p is None]
        if at:
            got = self.core.get(self._keys([keys[i] for i, _ in at]), Segments(
                [p[0] for _, p in at], [p[1] for _, p in at], [1] * len(at)))
            for (i, _), g in zip(at, got):
                res[i] = g
        if idx_buf:
            got = self.core.get_buffers(self._keys([keys[i] for i in idx_buf]), [targets[i] for i in idx_buf])
            for i, g in zip(idx_buf, got):
                res[i] = g
        return [t if ok else None for t, ok in zip(targets, res)]

    def get(self, key: str, target_location: object = None, target_sizes: Optional[int] = None) -> object:
        if target_location is None:
            raise ValueError("PeerCacheStore.get needs a destination (target_location)")
        if isinstance(target_location, int):
            if target_sizes is None:
                raise ValueError("PeerCacheStore.get with an address needs target_sizes")
            return self._get_addresses([key], [target_location], [target_sizes]) == 1
        return self._get_buffers([key], [target_location])[0]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ----- management -----
    def _record(self, kind: str, pages: int, nbytes: int, secs: float) -> None:
        with self._stats_lock:
            self._stats[f"{kind}_pgs"].append(pages)
            self._stats[f"{kind}_bandwidth"].append(nbytes / secs / 1e9 if secs > 0 else 0.0)

    def get_stats(self) -> Optional[StorageMetrics]:
        """A real ``StorageMetrics`` with this interval's values (cleared on read), or None
        when sglang is not importable."""
        StorageMetrics = _storage_metrics_class()
        if StorageMetrics is None:
            return None
        with self._stats_lock:
            s, self._stats = self._stats, {k: [] for k in self._stats}
        m = StorageMetrics()
        for k, v in s.items():
            setattr(m, k, v)
        return m

    def stats(self) -> Dict[str, object]:
        """Node counters (pool pages, evictions, directory RPCs, bytes read, members…)."""
        return self.core.stats()

    def check_server(self) -> bool:
        """True when this node is in the cluster and its directory answers."""
        try:
            self.core.leading(["peercache-health-probe"])
            return int(self.core.stats()["members"]) >= 1  # type: ignore[call-overload]
        except Exception:
            return False

    def warmup(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until this node is in the cluster, at most ``timeout_s`` seconds (default: the
        ``startup_timeout`` setting, 30 s unless configured; 0 waits as long as it takes). True
        when it is; False (with a warning) when the deadline passed — the node keeps trying, and
        lookups miss until it is in. A large pool may still be warming then (one INFO line says
        how far): the node serves meanwhile, ``core.pool_readiness()`` says how much is in."""
        t = self._startup_timeout if timeout_s is None else float(timeout_s)
        return self.core.wait_ready(t if t > 0 else 0)

    def clear(self) -> None:
        """Removes every page this rank's node published (this node, this namespace)."""
        self.core.clear()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.core.close()

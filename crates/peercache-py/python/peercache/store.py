"""``PeerCacheStore``: PeerCache as an SGLang HiCache L3 storage backend.

Launch SGLang with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "peercache",
        "module_path": "peercache.store", "class_name": "PeerCacheStore",
        "interface_v1": 1, "discovery_addr": "10.0.0.1:31998"}'

Keys: SGLang passes bare page hashes. A page key here is
``<model>|<hash>|tp<rank>of<size>`` for MHA (ranks of different TP sizes never collide), and
``<model>|<hash>|mla`` for MLA, where rank 0 writes and every rank reads; ``|pp<rank>`` and
``|cp<rank>`` are added when those sizes are above 1. The node then applies ``prefix`` (one
keyspace on every path). A page's components (K and V, or every layer in ``layer_first``) are
segments of that one key, so they are stored, evicted and served together.
"""

import json
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _peercache

logger = logging.getLogger("peercache")


def _hicache_base():
    """SGLang's real base class when importable (imported on its own, so a missing optional
    name elsewhere cannot break the subclass check), else a stand-in."""
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: PLC0415

        return HiCacheStorage
    except Exception:  # sglang absent or unimportable: stand alone, silently.

        class HiCacheStorage:  # type: ignore[no-redef]
            """Stand-in with the attributes SGLang's base class sets."""

            def register_mem_pool_host(self, mem_pool_host: Any) -> None:
                self.mem_pool_host = mem_pool_host

        return HiCacheStorage


_Base = _hicache_base()


def _storage_metrics_class() -> Any:
    """SGLang's ``StorageMetrics``: ``sglang.srt.observability.metrics_collector`` since 0.5.6,
    ``sglang.srt.metrics.collector`` before. SGLang's collector checks ``isinstance`` against it,
    so a look-alike would not do. None when sglang is absent."""
    for module in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return getattr(__import__(module, fromlist=["StorageMetrics"]), "StorageMetrics")
        except Exception:
            continue
    return None


def _as_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on")
    return bool(v)


def _ptr_len(x: Any) -> Optional[Tuple[int, int]]:
    """(address, bytes) of a contiguous tensor or numpy array; None for other objects."""
    if hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # torch.Tensor
        if not x.is_contiguous():
            raise ValueError("tensors must be contiguous")
        return int(x.data_ptr()), int(x.numel() * x.element_size())
    if hasattr(x, "__array_interface__") and hasattr(x, "nbytes"):  # numpy.ndarray
        if not x.flags["C_CONTIGUOUS"]:
            raise ValueError("arrays must be C-contiguous")
        return int(x.__array_interface__["data"][0]), int(x.nbytes)
    return None


class PeerCacheStore(_Base):  # type: ignore[misc,valid-type]
    """SGLang HiCache storage backend on a PeerCache node (one node per rank)."""

    def __init__(self, storage_config: Any = None, kwargs: Any = None) -> None:
        extra: Dict[str, Any] = {}
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
        self.is_mla = bool(get("is_mla_model", False))
        self.model = str(get("model_name", None) or extra.get("model_name") or "model")
        self.interface_v1 = _as_bool(extra.get("interface_v1", False))
        cfg = {k: v for k, v in extra.items() if k not in ("interface_v1",)}
        cfg.update({"tp_rank": self.tp_rank, "tp_size": self.tp_size, "pp_rank": self.pp_rank, "pp_size": self.pp_size})
        cfg.setdefault("dp_rank", int(get("dp_rank", 0) or 0))
        self._node = _peercache.Node(json.dumps(cfg))
        self._closed = False
        self.mem_pool_host = None
        self._page_pool: Any = None
        self.registered_pools: Dict[str, Any] = {}
        self._stats_lock = threading.Lock()
        self._stats = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
        timeout = float(cfg.get("startup_timeout", 30.0) or 0) or None
        try:
            self._node.wait_ready(timeout)
        except Exception as e:  # keep SGLang starting; calls miss until the cluster answers
            logger.warning("peercache: not in the cluster yet (%s); lookups miss until it is", e)

    # ----- keys -----
    def _key(self, h: str) -> str:
        k = f"{self.model}|{h}|mla" if self.is_mla else f"{self.model}|{h}|tp{self.tp_rank}of{self.tp_size}"
        if self.pp_size > 1:
            k += f"|pp{self.pp_rank}"
        if self.cp_size > 1:
            k += f"|cp{self.cp_rank}"
        return k

    def _keys(self, keys: Sequence[str]) -> List[str]:
        return [self._key(k) for k in keys]

    # ----- registration -----
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Registers SGLang's host KV pool for zero-copy transfers. A ``HostPoolGroup``
        (DeepSeek-V4 and other multi-pool models) is resolved to its anchor pool for page
        geometry, and every entry's ``kv_buffer`` is registered."""
        self.mem_pool_host = mem_pool_host
        anchor = getattr(mem_pool_host, "anchor_entry", None)
        self._page_pool = anchor.host_pool if anchor is not None else mem_pool_host
        pools = [e.host_pool for e in getattr(mem_pool_host, "entries", [])] if anchor is not None else [mem_pool_host]
        registered = 0
        for pool in pools:
            buf = getattr(pool, "kv_buffer", None)
            pl = _ptr_len(buf) if buf is not None else None
            if pl is not None:
                self._node.register_host_buffer(*pl)
                registered += 1
        if registered == 0:
            logger.info("peercache: host pool has no kv_buffer (logical anchor); nothing to register")

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[str(host_pool_name)] = host_pool

    def on_host_pools_registered(self) -> None:
        return None

    # ----- v1 zero-copy -----
    def _meta(self, keys: Sequence[str], host_indices: Any) -> Optional[Tuple[List[int], List[int], List[int]]]:
        if self.mem_pool_host is None or not keys:
            return None
        ptrs, sizes = self._page_pool.get_page_buffer_meta(host_indices)
        n = len(keys)
        per, rem = divmod(len(ptrs), n)
        if rem or per == 0:
            logger.warning("peercache: %d buffer segments for %d pages; refusing the batch", len(ptrs), n)
            return None
        return list(map(int, ptrs)), list(map(int, sizes)), [per] * n

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        m = self._meta(keys, host_indices)
        if m is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        res = self._node.batch_set_ptrs(self._keys(keys), *m)
        self._record("backup", sum(res), sum(m[1]), time.perf_counter() - t0)
        return res

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        m = self._meta(keys, host_indices)
        if m is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        res = self._node.batch_get_ptrs(self._keys(keys), *m)
        self._record("prefetch", sum(res), sum(m[1]), time.perf_counter() - t0)
        return res

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        if not keys:
            return 0
        return int(self._node.batch_exists(self._keys(keys)))

    def wait_for_full_prefix(self, keys: List[str], timeout_s: float) -> int:
        """Waits (bounded by ``timeout_s``) until every key is present; returns the leading
        count. For decode ranks waiting on a prefill rank's pages."""
        if not keys:
            return 0
        return int(self._node.wait_for_full_prefix(self._keys(keys), float(timeout_s)))

    # ----- generic (legacy) path -----
    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        if not keys:
            return True
        if values is None and target_locations is not None:
            ptrs = [int(p) for p in target_locations]
            sizes = [int(s) for s in target_sizes]
            return all(self._node.batch_set_ptrs(self._keys(keys), ptrs, sizes, [1] * len(keys)))
        values = list(values)
        pl = [_ptr_len(v) for v in values]
        ok = True
        idx_ptr = [i for i, p in enumerate(pl) if p is not None]
        idx_buf = [i for i, p in enumerate(pl) if p is None]
        if idx_ptr:
            ok &= all(self._node.batch_set_ptrs(
                self._keys([keys[i] for i in idx_ptr]), [pl[i][0] for i in idx_ptr], [pl[i][1] for i in idx_ptr], [1] * len(idx_ptr)))
        if idx_buf:
            ok &= all(self._node.batch_set_buffers(self._keys([keys[i] for i in idx_buf]), [values[i] for i in idx_buf]))
        return bool(ok)

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        if value is None and target_location is not None:
            return self.batch_set([key], None, [target_location], [target_sizes])
        return self.batch_set([key], [value])

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """Fills each destination (tensor, array or writable bytes-like) and returns it, or
        None for a miss. With integer addresses and ``target_sizes`` it returns the number of
        leading pages read. A read-only destination (``bytes``) raises ValueError."""
        if not keys:
            return []
        targets = list(target_locations or [])
        if len(targets) != len(keys):
            raise ValueError("batch_get needs one destination per key")
        if targets and all(isinstance(t, int) for t in targets):
            res = self._node.batch_get_ptrs(self._keys(keys), targets, [int(s) for s in target_sizes], [1] * len(keys))
            n = 0
            while n < len(res) and res[n]:
                n += 1
            return n
        pl = [_ptr_len(t) for t in targets]
        res: List[bool] = [False] * len(keys)
        idx_ptr = [i for i, p in enumerate(pl) if p is not None]
        idx_buf = [i for i, p in enumerate(pl) if p is None]
        if idx_ptr:
            got = self._node.batch_get_ptrs(
                self._keys([keys[i] for i in idx_ptr]), [pl[i][0] for i in idx_ptr], [pl[i][1] for i in idx_ptr], [1] * len(idx_ptr))
            for i, g in zip(idx_ptr, got):
                res[i] = g
        if idx_buf:
            got = self._node.batch_get_buffers(self._keys([keys[i] for i in idx_buf]), [targets[i] for i in idx_buf])
            for i, g in zip(idx_buf, got):
                res[i] = g
        return [t if ok else None for t, ok in zip(targets, res)]

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        if target_location is None:
            raise ValueError("PeerCacheStore.get needs a destination (target_location)")
        if isinstance(target_location, int):
            return self.batch_get([key], [target_location], [target_sizes]) == 1
        return self.batch_get([key], [target_location])[0]

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ----- management -----
    def _record(self, kind: str, pages: int, nbytes: int, secs: float) -> None:
        with self._stats_lock:
            self._stats[f"{kind}_pgs"].append(pages)
            self._stats[f"{kind}_bandwidth"].append(nbytes / secs / 1e9 if secs > 0 else 0.0)

    def get_stats(self) -> Any:
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

    def stats(self) -> Dict[str, Any]:
        """Node counters (pool pages, evictions, directory RPCs, bytes read, members…)."""
        return json.loads(self._node.stats_json())

    def check_server(self) -> bool:
        """True when this node is in the cluster and its directory answers."""
        try:
            self._node.batch_exists(["peercache-health-probe"])
            return json.loads(self._node.stats_json())["members"] >= 1
        except Exception:
            return False

    def warmup(self) -> None:
        self._node.wait_ready(None)

    def clear(self) -> None:
        """Removes every page this rank's node published (this node, this namespace)."""
        self._node.clear()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._node.close()

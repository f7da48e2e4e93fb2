"""SGLang's direct linker on PeerCache: the device KV pools read and written through a node.

SGLang 0.5.23 can reach an external store straight from its device KV pools, with no host tier
(``--unified-cache-external-linker dynamic``). Launch it with::

    --unified-cache-external-linker dynamic
    --unified-cache-external-linker-config '{"linker": "PeerCacheLinker",
        "linker_module_path": "peercache.linker",
        "linker_extra_config": {"discovery_addr": "10.0.0.1:7100", "protocol": "tcp"}}'

``linker_extra_config`` takes every PeerCache node setting (as
``--hicache-storage-backend-extra-config`` does for :class:`~peercache.store.PeerCacheStore`)
plus the linker's own keys, which never reach the node:

``linker_staging``
    ``auto`` (default) moves pages straight between the node and pools in host memory, and
    stages through a host arena (pinned on CUDA) when a pool lives in device memory, which the
    TCP transport cannot address; ``always`` stages even host pools (the path CUDA takes,
    exercised on any machine).
``linker_staging_bytes``
    Size of each direction's staging arena (default 64 MiB); larger batches move in chunks.
``linker_gpudirect``
    ``off`` (default) or ``peermem``: register the pools' device buffers with the node
    (``nvidia-peermem`` addresses) so loads of pages other nodes hold land in the pools over
    RDMA with no host copy (GPUDirect); the node's own pages and peers without RDMA still come
    through the staging arena. Where the node cannot (TCP, no peermem) one warning says so and
    loads stage.
``model_name``
    The model name pages are keyed on (default: SGLang's ``model_path``). Servers that should
    share pages must agree on it, including HiCache servers running ``PeerCacheStore``.

Pages are laid out as SGLang's host ``layer_first`` pages are (K0, V0, K1, V1, … for MHA; one
latent segment per layer for MLA) and declared with the same layout fingerprint, so a page
offloaded by this linker is found and read by a HiCache server running ``PeerCacheStore`` over
a ``layer_first`` host pool, and the other way round. Hybrid pool groups (SWA, Mamba, DSA,
DeepSeek-V4) are stored in the linker's own segment order, declared as host layout ``linker``:
a HiCache server sees those pages as another layout (misses, never wrong bytes).

Every page read is checked against the checksum its writer published before any layer of the
batch is reported: a layer is reported through ``layer_done_counter`` once its bytes are in the
device pool, and a page that does not land fails the batch, so ``finish_layer_wise_loading``
returns False and SGLang aborts the loading requests.
"""

from __future__ import annotations

import logging
import threading
from queue import Empty, Queue
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, cast

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import (
        LayerWiseLoadCounter,
        UnifiedCacheLinker,
    )
    from sglang.srt.utils import get_device_module
except ImportError as e:  # pragma: no cover - only without SGLang
    raise ImportError(
        "peercache.linker needs SGLang 0.5.23+ and torch: it subclasses SGLang's UnifiedCacheLinker"
    ) from e

from .core import ConfigValue, Segments
from .sglang_types import (
    DeviceKVCache,
    DevicePoolEntry,
    DevicePoolGroup,
    Event,
    Indices,
    LinkerParams,
    LinkerTransfer,
    MHAKVCache,
    MLAKVCache,
    PoolKey,
    Tensor,
)
from .store import PeerCacheStore, pool_name

logger = logging.getLogger(__name__)

_STAGING_MODES = ("auto", "always")
_GPUDIRECT_MODES = ("off", "peermem")
_DEFAULT_STAGING_BYTES = 64 << 20

#: One pool's share of a batch: (pool name, page hashes, page numbers in the pool's buffers).
PoolPages = Tuple[PoolKey, List[str], List[int]]


def _device_pool_group(kvcache: DeviceKVCache, params: LinkerParams, components: Iterable[object]) -> DevicePoolGroup:
    """SGLang's device pool group for ``kvcache``. Hybrid models go through SGLang's own
    resolver; plain MHA and MLA pools (which that resolver refuses) get one entry built from
    SGLang's ``DevicePoolEntry``, as its hybrid strategies build their full-attention entries."""
    from sglang.srt.mem_cache.hybrid_cache.linker_pool_assembler import (  # noqa: PLC0415
        DevicePoolEntry,
        DevicePoolGroup,
        resolve_hybrid_device_pool_group,
    )
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: PLC0415
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: PLC0415

    page = int(params.page_size)
    plain = type(kvcache) in (MHATokenToKVPool, MLATokenToKVPool)
    if not plain or set(components) != {ComponentType.FULL}:
        return resolve_hybrid_device_pool_group(kvcache=kvcache, page_size=page, params=params,
                                                components=set(components))
    if getattr(params, "sidecar_draft_device_pools", ()) or getattr(params, "mtp_draft_device_pools", ()):
        raise ValueError("peercache linker: draft KV pools are not supported on plain MHA/MLA models")
    layers = int(kvcache.layer_num)
    if type(kvcache) is MHATokenToKVPool:
        mha = cast(MHAKVCache, kvcache)
        if getattr(kvcache, "k_scale_buffer", None) is not None or \
                getattr(kvcache, "native_k_scale_buffer", None) is not None:
            raise ValueError("peercache linker: scaled KV caches are not supported")
        entry = DevicePoolEntry(name=PoolName.KV, indices_from_pool=PoolName.KV, device_pool=kvcache,
                                components=[[*mha.k_buffer, *mha.v_buffer]],
                                layer_mapping={layer: (layer, layers + layer) for layer in range(layers)},
                                page_size=page, rows_are_pages=False)
        return DevicePoolGroup([entry], layers, page, rank_replicated=False)
    mla = cast(MLAKVCache, kvcache)
    entry = DevicePoolEntry(name=PoolName.KV, indices_from_pool=PoolName.KV, device_pool=kvcache,
                            components=[list(mla.kv_buffer)],
                            layer_mapping={layer: layer for layer in range(layers)},
                            page_size=page, rows_are_pages=False)
    return DevicePoolGroup([entry], layers, page, rank_replicated=True)


class _PoolView:
    """One device pool entry as the page store sees a host pool: page geometry, dtype, host
    layout and ``get_page_buffer_meta``, whose segments come in the stored page's order."""

    def __init__(self, entry: DevicePoolEntry, interleave: bool, host_layout: str, num_layers: int) -> None:
        self.entry = entry
        self.page_size = int(entry.page_size)
        buffers = list(entry.kv_buffer)
        self._meta = [m for component in entry.buffer_meta for m in component]  # (base, row stride, bytes)
        order = list(range(len(buffers)))
        if interleave:  # MHA: K0..K(L-1), V0..V(L-1) on the device; K0, V0, K1, V1… in a host page
            half = len(buffers) // 2
            order = [i for layer in range(half) for i in (layer, half + layer)]
        self.order = order
        self.segment_of = {i: seg for seg, i in enumerate(order)}
        self.row_span = int(entry._row_span)
        self.segment_bytes = [int(self._meta[i][2]) for i in order]
        self.page_bytes = sum(self.segment_bytes)
        self.size_per_token = self.page_bytes // max(self.page_size, 1)
        self.dtype = buffers[0].dtype
        self.layout = host_layout
        self.device = buffers[0].device
        self.on_device = any(b.device.type != "cpu" for b in buffers)
        self.buffers = buffers
        # Host tensors the node registers for the zero-copy path (set by the linker).
        self.kv_buffer: List[Tensor] = []
        self.layer_members = self._layer_members(num_layers)

    def _layer_members(self, num_layers: int) -> List[List[int]]:
        """Per transfer layer, the buffers (indices into ``buffers``) it covers; buffers no
        layer names (none in SGLang's groups today) ride with layer 0."""
        offsets, base = [], 0
        for component in self.entry.components:
            offsets.append(base)
            base += len(component)
        per_layer: List[List[int]] = [[] for _ in range(max(num_layers, 1))]
        for layer, mapped in self.entry.layer_mapping.items():
            if not 0 <= int(layer) < len(per_layer):
                continue
            indices = [mapped] if isinstance(mapped, int) else list(mapped)
            per_layer[int(layer)].extend(off + int(i) for off in offsets for i in indices)
        named = {i for layer in per_layer for i in layer}
        per_layer[0].extend(i for i in range(len(self.buffers)) if i not in named)
        return per_layer

    def pages(self, indices: Indices) -> List[int]:
        """Page numbers of ``indices`` in units of one page of each buffer (validated by SGLang's
        entry: aligned, contiguous, in range)."""
        return [row // self.row_span for row in self.entry.prepare_locations(indices)]

    def get_page_buffer_meta(self, indices: Indices) -> Tuple[List[int], List[int]]:
        return self.rows_meta(self.entry.prepare_locations(indices))

    def rows_meta(self, rows: Sequence[int]) -> Tuple[List[int], List[int]]:
        """Pointers and sizes of the pages at buffer rows ``rows``, segments in page order."""
        ptrs: List[int] = []
        sizes: List[int] = []
        for row in rows:
            for i in self.order:
                base, stride, size = self._meta[i]
                ptrs.append(base + row * stride)
                sizes.append(size)
        return ptrs, sizes

    def page_rows(self, i: int) -> Tensor:
        """Buffer ``i`` as a ``(pages, segment bytes)`` uint8 view: one row per page."""
        b = self.buffers[i]
        if not b.is_contiguous():
            raise ValueError(f"peercache linker: pool {pool_name(self.entry.name)!r} buffer {i} is not "
                             "contiguous; staging needs whole pages")
        flat = b.reshape(-1).view(torch.uint8)
        seg = int(self._meta[i][2])
        pages = flat.numel() // seg
        return flat[: pages * seg].view(pages, seg)


class _Arena:
    """A host staging area for one direction: per pool and segment a ``(capacity, bytes)``
    block, all carved from one tensor (pinned when the pools are on CUDA) registered with the
    node once, so the transport reads and writes it with no further copy."""

    def __init__(self, store: PeerCacheStore, views: Dict[PoolKey, _PoolView], budget: int, pinned: bool) -> None:
        per_page = sum(v.page_bytes for v in views.values())
        self.capacity = max(1, budget // max(per_page, 1))
        self.tensor: Tensor = torch.empty(self.capacity * per_page, dtype=torch.uint8, pin_memory=pinned)
        store.core.register_host(int(self.tensor.data_ptr()), int(self.tensor.numel()))
        self.blocks: Dict[PoolKey, List[Tensor]] = {}
        off = 0
        for name, view in views.items():
            blocks = []
            for seg in view.segment_bytes:
                n = self.capacity * seg
                blocks.append(self.tensor[off:off + n].view(self.capacity, seg))
                off += n
            self.blocks[name] = blocks  # in page segment order

    def halves(self) -> Tuple[int, List[int]]:
        """Pages per chunk and the first page of each half: two halves when the arena holds two
        pages or more, so one half is copied to or from the pools while the node fills or
        drains the other; else the whole arena, one chunk at a time."""
        if self.capacity >= 2:
            half = self.capacity // 2
            return half, [0, half]
        return self.capacity, [0]

    def meta(self, name: PoolKey, count: int, first: int = 0) -> Tuple[List[int], List[int]]:
        """Pointers and sizes of arena pages ``first..first + count`` of pool ``name``, segment
        by segment."""
        blocks = self.blocks[name]
        ptrs: List[int] = []
        sizes: List[int] = []
        bases = [(int(b.data_ptr()), int(b.shape[1])) for b in blocks]
        for page in range(first, first + count):
            for base, seg in bases:
                ptrs.append(base + page * seg)
                sizes.append(seg)
        return ptrs, sizes


class PeerCacheLinker(UnifiedCacheLinker):
    """SGLang's direct linker on a PeerCache node (one node per rank).

    Constructed by SGLang's linker factory as
    ``PeerCacheLinker(server_args, params, components=..., extra_config=..., forward_stream=...)``.
    """

    def __init__(self, server_args: object, params: LinkerParams, *, components: Iterable[object],
                 extra_config: Optional[Mapping[str, ConfigValue]] = None, forward_stream: object = None) -> None:
        from sglang.srt.runtime_context import get_model, get_parallel  # noqa: PLC0415

        self.forward_stream = forward_stream
        self.page_size = int(params.page_size)
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        self.pool_group = _device_pool_group(kvcache, params, components)
        self.pools = self.pool_group.entry_map
        self.num_layers = int(self.pool_group.num_layers)
        tp_rank, tp_size = 0, int(get_parallel().tp_size)
        group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            tp_rank = torch.distributed.get_rank(group=group)
            tp_size = torch.distributed.get_world_size(group=group)
        replicated = bool(self.pool_group.rank_replicated)
        # Every rank of a replicated (MLA-style) group holds the same bytes: rank 0 writes them.
        self.offload_owner = not replicated or tp_rank == 0
        extra = dict(extra_config or {})
        staging = str(extra.pop("linker_staging", "auto"))
        if staging not in _STAGING_MODES:
            raise ValueError(f"peercache linker: linker_staging = {staging!r}: expected one of {_STAGING_MODES}")
        gpudirect = str(extra.pop("linker_gpudirect", "off"))
        if gpudirect not in _GPUDIRECT_MODES:
            raise ValueError(f"peercache linker: linker_gpudirect = {gpudirect!r}: expected one of {_GPUDIRECT_MODES}")
        budget = extra.pop("linker_staging_bytes", _DEFAULT_STAGING_BYTES)
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ValueError(f"peercache linker: linker_staging_bytes = {budget!r}: expected a positive integer")
        model = extra.pop("model_name", None) or get_model().model_path
        self.tp_rank = tp_rank
        config = HiCacheStorageConfig(
            tp_rank=tp_rank, tp_size=tp_size,
            pp_rank=int(getattr(params, "pp_rank", 0) or 0), pp_size=int(getattr(params, "pp_size", 1) or 1),
            attn_cp_rank=int(getattr(params, "attn_cp_rank", 0) or 0),
            attn_cp_size=int(getattr(params, "attn_cp_size", 1) or 1),
            is_mla_model=replicated, enable_storage_metrics=False, is_page_first_layout=False,
            model_name=str(model), extra_config=extra)
        self.store = PeerCacheStore(config)
        try:
            plain = set(self.pools) == {PoolName.KV}
            interleave = plain and not replicated
            self.views: Dict[PoolKey, _PoolView] = {
                name: _PoolView(entry, interleave, "layer_first" if plain else "linker", self.num_layers)
                for name, entry in self.pools.items()}
            on_device = any(v.on_device for v in self.views.values())
            # GPUDirect needs the staged path beside it: pages it cannot land (this node's own,
            # peers without RDMA) come through the arena.
            self.staging = staging == "always" or on_device or gpudirect != "off"
            for name, view in self.views.items():
                if not self.staging:
                    view.kv_buffer = view.buffers  # zero copy: the node reads and writes them in place
                self.store.register_mem_host_pool_v2(view, name)
            if self.staging:
                pinned = on_device and torch.cuda.is_available()
                self._load_arena = _Arena(self.store, self.views, int(budget), pinned)
                self._offload_arena = _Arena(self.store, self.views, int(budget), pinned)
                self._copy_stream = torch.cuda.Stream() if pinned else None
                logger.info("peercache linker: staging through two %d-page host arenas (%s pools)",
                            self._load_arena.capacity, "device" if on_device else "host")
            else:
                self.store.on_host_pools_registered()
            self.gpudirect = gpudirect == "peermem" and self._register_device_pools()
        except BaseException:
            self.store.close()
            raise
        self._device = get_device_module()
        self.layer_done_counter = LayerWiseLoadCounter(self.num_layers)
        req_to_token_pool = getattr(params, "req_to_token_pool", None)
        if PoolName.MAMBA in self.pools and req_to_token_pool is not None:
            req_to_token_pool.register_layer_transfer_counter(self.layer_done_counter)
        self.pending_loads: Dict[str, List[LinkerTransfer]] = {}
        self.load_queue: Queue[Optional[Tuple[int, List[LinkerTransfer], Event]]] = Queue()
        self.offload_queue: Queue[Optional[Tuple[Optional[List[LinkerTransfer]], Sequence[Event]]]] = Queue()
        self.offload_results: Queue[bool] = Queue()
        self._closed = False
        self._load_thread = threading.Thread(target=self._load_loop, daemon=True,
                                             name=f"peercache-load-tp{tp_rank}")
        self._offload_thread = threading.Thread(target=self._offload_loop, daemon=True,
                                                name=f"peercache-offload-tp{tp_rank}")
        self._load_thread.start()
        self._offload_thread.start()

    def _register_device_pools(self) -> bool:
        """Registers every pool buffer with the node as device memory (``nvidia-peermem``
        addresses), so loads from other nodes land in the pools over RDMA; False, with one
        warning, where the node cannot (no RDMA path, no peermem)."""
        seen: Dict[int, int] = {}
        for view in self.views.values():
            for b in view.buffers:
                seen.setdefault(int(b.data_ptr()), int(b.numel() * b.element_size()))
        why = self.store.core.register_device_spans(seen)
        if why is not None:
            logger.warning("peercache linker: GPUDirect unavailable (%s); loads stage through host memory", why)
            return False
        logger.info("peercache linker: GPUDirect on: %d pool buffers registered; pages of other nodes land "
                    "in the pools over RDMA", len(seen))
        return True

    # ----- lookup -----
    def lookup(self, rid: str, transfers: Sequence[LinkerTransfer]) -> List[int]:
        """Every prefix length (pages) this rank can restore across all pools: the KV pages
        present from the start, cut at each side pool's boundary by its hit policy (a
        trailing-window pool leaves holes, so the set is sparse). One directory fan-out."""
        expanded = self.pool_group.resolve_transfers(transfers)
        kv = next((t for t in expanded if t.name == PoolName.KV), None)
        if kv is None or not kv.keys:
            return []
        side = [t for t in expanded if t.name != PoolName.KV]
        result = self.store.batch_exists_v2(list(kv.keys), side)
        return list(result.restorable_prefix_pages or [])

    # ----- load -----
    def load(self, rid: str, transfers: Sequence[LinkerTransfer]) -> bool:
        expanded = self.pool_group.resolve_transfers(transfers, allow_partial=True, allow_missing_kv=True)
        if not expanded:
            return False
        if rid in self.pending_loads:
            raise RuntimeError(f"peercache linker: a load for rid={rid} is already queued")
        if not self._slots_valid(expanded, "load"):
            return False
        self.pending_loads[rid] = expanded
        return True

    def _slots_valid(self, expanded: Sequence[LinkerTransfer], what: str) -> bool:
        """Misaligned, partial or out-of-range device slots refuse the transfer up front (SGLang
        then recomputes), rather than failing later in a transfer thread."""
        for t in expanded:
            try:
                self.views[t.name].pages(t.host_indices)
            except (ValueError, TypeError, AttributeError) as e:
                logger.warning("peercache linker: %s refused: pool %s: %s", what, pool_name(t.name), e)
                return False
        return True

    def cancel_queued_load(self, rid: str) -> bool:
        return self.pending_loads.pop(rid, None) is not None

    def start_layer_wise_loading(self) -> int:
        if not self.pending_loads:
            return -1
        pending, self.pending_loads = self.pending_loads, {}
        index = self.layer_done_counter.update_producer()
        ready = self._device.Event()
        ready.record()
        self.load_queue.put((index, [t for ts in pending.values() for t in ts], ready))
        return index

    def finish_layer_wise_loading(self, counter_index: int) -> bool:
        return self.layer_done_counter.finish(counter_index)

    def _load_loop(self) -> None:
        while True:
            task = self.load_queue.get()
            try:
                if task is None:
                    return
                index, transfers, ready = task
                try:
                    ready.synchronize()
                    if self.staging:
                        self._load_staged(index, transfers)
                    else:
                        self._load_direct(index, transfers)
                except BaseException as e:  # reported through finish_layer_wise_loading
                    logger.warning("peercache linker: load batch %d failed: %s", index, e)
                    self.layer_done_counter.fail(index, e)
            finally:
                self.load_queue.task_done()

    def _load_direct(self, index: int, transfers: Sequence[LinkerTransfer]) -> None:
        """Host pools: the node lands each verified page in place; every layer of the batch is
        in the pools once the call returns."""
        got = self.store.batch_get_v2(transfers)
        missing = sum(not ok for flags in got.values() for ok in flags)
        if missing:
            raise RuntimeError(f"{missing} page(s) did not land")
        for layer in range(self.num_layers):
            self.layer_done_counter.complete(index, layer)

    def _per_pool(self, transfers: Sequence[LinkerTransfer]) -> List[PoolPages]:
        """The batch as (pool, keys, page numbers), one entry per transfer with keys."""
        return [(t.name, list(t.keys), self.views[t.name].pages(t.host_indices)) for t in transfers if t.keys]

    @staticmethod
    def _chunks(per_pool: List[PoolPages], capacity: int) -> List[List[PoolPages]]:
        """``per_pool`` in chunks of at most ``capacity`` pages per pool, so each fits the arena."""
        chunks: List[List[PoolPages]] = []
        start = 0
        longest = max((len(k) for _, k, _ in per_pool), default=0)
        while start < longest:
            chunk = [(name, keys[start:start + capacity], pages[start:start + capacity])
                     for name, keys, pages in per_pool if start < len(keys)]
            chunks.append(chunk)
            start += capacity
        return chunks

    def _node_batch(self, arena: _Arena, chunk: Sequence[PoolPages], first: int = 0
                    ) -> Tuple[List[str], List[int], List[int], List[int]]:
        """A node batch of `chunk`'s pages landing in (or leaving from) `arena` from its page
        `first` on."""
        return self._batch(chunk, lambda name, view, hashes, _: arena.meta(name, len(hashes), first))

    def _batch(self, chunk: Sequence[PoolPages],
               meta: Callable[[PoolKey, "_PoolView", List[str], List[int]],
                              Tuple[List[int], List[int]]]
               ) -> Tuple[List[str], List[int], List[int], List[int]]:
        """Keys, segment pointers and sizes, and segments per page of `chunk`'s pages, each
        pool's segments as `meta(name, view, hashes, pages)` places them."""
        keys: List[str] = []
        ptrs: List[int] = []
        sizes: List[int] = []
        counts: List[int] = []
        for name, hashes, pages in chunk:
            view = self.views[name]
            p, s = meta(name, view, hashes, pages)
            keys.extend(self.store.pool_key(pool_name(name), view, h) for h in hashes)
            ptrs.extend(p)
            sizes.extend(s)
            counts.extend([len(view.order)] * len(hashes))
        return keys, ptrs, sizes, counts

    def _load_staged(self, index: int, transfers: Sequence[LinkerTransfer]) -> None:
        """Device pools: verified pages land in the load arena, then each layer's segments are
        copied into the device pools and the layer is reported once its copy finished."""
        arena = self._load_arena
        per_pool = self._per_pool(transfers)
        if self.gpudirect:
            per_pool = self._load_device(per_pool)
            if not per_pool:  # every page landed in the pools over RDMA
                for layer in range(self.num_layers):
                    self.layer_done_counter.complete(index, layer)
                return
        per_chunk, firsts = arena.halves()
        chunks = self._chunks(per_pool, per_chunk)
        # Half h's copies into the pools, still running (CUDA): the node may refill half h
        # only once they finished. The node fills one half while the other is copied.
        copying: List[Optional[object]] = [None] * len(firsts)
        try:
            for c, chunk in enumerate(chunks):
                h = c % len(firsts)
                self._wait(copying[h])
                keys, ptrs, sizes, counts = self._node_batch(arena, chunk, firsts[h])
                res = self.store.core.get(keys, Segments(ptrs, sizes, counts))
                missing = sum(not ok for ok in res)
                if missing:
                    raise RuntimeError(f"{missing} page(s) did not land")
                slots = self._slots(chunk)
                layers = [self._scatter_layer(arena, firsts[h], chunk, slots, layer) for layer in range(self.num_layers)]
                copying[h] = layers[-1]
                if c == len(chunks) - 1:
                    # The stream runs the copies in order: a layer's are done, so are the earlier
                    # chunks'. Each layer is reported as soon as its own copies finished.
                    for layer, done in enumerate(layers):
                        self._wait(done)
                        self.layer_done_counter.complete(index, layer)
        finally:
            # A failed load leaves no copy running into slots SGLang will hand out again.
            for done in copying:
                self._wait(done)

    def _load_device(self, per_pool: List[PoolPages]) -> List[PoolPages]:
        """GPUDirect: one node call lands every page other nodes hold straight in the pools over
        RDMA (each checked by its header before and after); returns the pages it could not land
        (this node's own, peers reached without RDMA, misses) for the staged path."""
        keys, ptrs, sizes, counts = self._batch(
            per_pool,
            lambda _, view, __, pages: view.rows_meta([page * view.row_span for page in pages]))
        landed = self.store.core.get_device(keys, Segments(ptrs, sizes, counts))
        rest: List[PoolPages] = []
        at = 0
        for name, hashes, pages in per_pool:
            flags = landed[at:at + len(hashes)]
            at += len(hashes)
            left = [(h, p) for h, p, ok in zip(hashes, pages, flags) if not ok]
            if left:
                rest.append((name, [h for h, _ in left], [p for _, p in left]))
        return rest

    def _issue(self, copy: Callable[[bool], None]) -> Optional[object]:
        """Runs ``copy(non_blocking)``: on the side stream, not waited for, for CUDA pools
        (returns the event that marks its end); plainly for host pools (returns None)."""
        stream = self._copy_stream
        if stream is None:
            copy(False)
            return None
        with torch.cuda.stream(stream):
            copy(True)
            done = torch.cuda.Event()
            done.record(stream)
        return done

    @staticmethod
    def _wait(done: Optional[object]) -> None:
        """Returns once the copies ``done`` marks finished (None: nothing in flight)."""
        if done is not None:
            cast(torch.cuda.Event, done).synchronize()

    def _slots(self, chunk: Sequence[PoolPages]) -> Dict[PoolKey, Tensor]:
        """Each pool's page numbers of the chunk as an index tensor on the pool's device."""
        return {name: torch.tensor(pages, dtype=torch.int64).to(self.views[name].device, non_blocking=True)
                for name, _, pages in chunk}

    def _scatter_layer(self, arena: _Arena, first: int, chunk: Sequence[PoolPages],
                       slots: Dict[PoolKey, Tensor], layer: int) -> Optional[object]:
        """Issues the copies of one layer of ``chunk`` from arena pages ``first..`` into the
        pools; the event that marks their end (None: done)."""
        def copy(non_blocking: bool) -> None:
            for name, hashes, _ in chunk:
                view = self.views[name]
                n = len(hashes)
                for i in view.layer_members[layer]:
                    src = arena.blocks[name][view.segment_of[i]][first:first + n].to(view.device, non_blocking=non_blocking)
                    view.page_rows(i).index_copy_(0, slots[name], src)

        return self._issue(copy)

    # ----- offload -----
    def offload(self, transfers: Sequence[LinkerTransfer], session_id: Optional[str] = None) -> bool:
        expanded = self.pool_group.resolve_transfers(transfers, allow_partial=True)
        if not expanded:
            return False
        if not self._slots_valid(expanded, "offload"):
            return False
        if not self.offload_owner:
            # The owner rank writes the same bytes; this rank reports the set as persisted in
            # order with its own queue, so results pop in submission order.
            self.offload_queue.put((None, ()))
            return True
        self.offload_queue.put((expanded, self.record_offload_ready()))
        return True

    def _offload_loop(self) -> None:
        while True:
            task = self.offload_queue.get()
            try:
                if task is None:
                    return
                expanded, events = task
                if expanded is None:
                    self.offload_results.put(True)
                    continue
                try:
                    for ev in events:
                        ev.synchronize()
                    ok = self._offload_staged(expanded) if self.staging else self._offload_direct(expanded)
                    self.offload_results.put(ok)
                except BaseException as e:
                    logger.warning("peercache linker: offload failed: %s", e)
                    self.offload_results.put(False)
            finally:
                self.offload_queue.task_done()

    def _offload_direct(self, expanded: Sequence[LinkerTransfer]) -> bool:
        res = self.store.batch_set_v2(expanded)
        return all(all(flags) for flags in res.values())

    def _offload_staged(self, expanded: Sequence[LinkerTransfer]) -> bool:
        """Gathers each chunk into one arena half while the node publishes the previous one
        from the other."""
        arena = self._offload_arena
        per_chunk, firsts = arena.halves()
        ok = True
        behind: Optional[Tuple[Sequence[PoolPages], int, Optional[object]]] = None
        try:
            for c, chunk in enumerate(self._chunks(self._per_pool(expanded), per_chunk)):
                h = c % len(firsts)
                gathered = self._gather(arena, firsts[h], chunk)
                if behind is not None:
                    ok &= self._publish(arena, *behind)
                behind = (chunk, firsts[h], gathered)
            if behind is not None:
                ok &= self._publish(arena, *behind)
                behind = None
        finally:
            if behind is not None:  # the next offload gathers into this arena
                self._wait(behind[2])
        return ok

    def _publish(self, arena: _Arena, chunk: Sequence[PoolPages], first: int, gathered: Optional[object]) -> bool:
        """Publishes ``chunk`` from arena pages ``first..`` once its gather finished."""
        self._wait(gathered)
        keys, ptrs, sizes, counts = self._node_batch(arena, chunk, first)
        return all(self.store.core.put(keys, Segments(ptrs, sizes, counts)))

    def _gather(self, arena: _Arena, first: int, chunk: Sequence[PoolPages]) -> Optional[object]:
        """Issues the copies of ``chunk``'s pages from the pools into arena pages ``first..``;
        the event that marks their end (None: done)."""
        slots = self._slots(chunk)

        def copy(non_blocking: bool) -> None:
            for name, hashes, _ in chunk:
                view = self.views[name]
                n = len(hashes)
                for seg, i in enumerate(view.order):
                    arena.blocks[name][seg][first:first + n].copy_(view.page_rows(i).index_select(0, slots[name]),
                                                                    non_blocking=non_blocking)

        return self._issue(copy)

    def num_completed_offloads(self) -> int:
        return self.offload_results.qsize()

    def pop_completed_offload(self) -> bool:
        return bool(self.offload_results.get_nowait())

    # ----- lifecycle -----
    def reset(self) -> None:
        """Drops queued loads, waits for running transfers, forgets completed offloads and the
        layer counter."""
        self.pending_loads.clear()
        self.load_queue.join()
        self.offload_queue.join()
        while True:
            try:
                self.offload_results.get_nowait()
            except Empty:
                break
        self.layer_done_counter.reset()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.reset()
        self.load_queue.put(None)
        self.offload_queue.put(None)
        self._load_thread.join()
        self._offload_thread.join()
        self.store.close()


__all__ = ["PeerCacheLinker"]

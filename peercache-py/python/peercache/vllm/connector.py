"""``PeerCacheConnector``: PeerCache as a vLLM KV connector (``KVConnectorBase_V1``, vLLM
0.32–0.33). The scheduler side decides (``scheduler.py``), the worker side moves bytes
(``worker.py``); both sit on :class:`peercache.core.PageStore`. docs/vllm.md."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from ..core import ConfigValue, KeyScheme, PageStore
from .config import Layout, check_hash_algo, node_configs, settings
from .events import PeerCacheKVEvents, StoredBlocks
from .meta import PeerCacheMeta
from .routing import namespace
from .scheduler import SchedulerSide
from .stats import PeerCachePromMetrics, PeerCacheStats
from .worker import StorageTensor, WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("vllm.peercache")


def _ranks(role: KVConnectorRole) -> Tuple[int, int]:
    """(TP rank, PP rank) of this process: the worker's own, 0 on the scheduler side."""
    if role != KVConnectorRole.WORKER:
        return 0, 0
    from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank  # noqa: PLC0415

    return int(get_tensor_model_parallel_rank()), int(get_pp_group().rank_in_group)


def layout_of(vllm_config: "VllmConfig", model_name: Optional[str], tp_rank: int, pp_rank: int) -> Layout:
    """The layout of one rank's KV blocks, from vLLM's config."""
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    dtype = str(cc.cache_dtype)
    if dtype == "auto":
        dtype = str(mc.dtype)
    return Layout(model=model_name or str(mc.model), dtype=dtype, block_size=int(cc.block_size),
                  num_kv_heads=int(mc.get_num_kv_heads(pc)), head_size=int(mc.get_head_size()),
                  num_layers=int(mc.get_num_layers(pc)), tp_rank=tp_rank,
                  tp_size=int(pc.tensor_parallel_size), pp_rank=pp_rank,
                  pp_size=int(pc.pipeline_parallel_size),
                  hash_algo=str(cc.prefix_caching_hash_algo),
                  device=str(vllm_config.device_config.device_type))


class PeerCacheConnector(KVConnectorBase_V1):
    """vLLM's KV connector on a PeerCache cluster. Every engine process runs a node: the
    scheduler's asks the directory how much of a prompt the cluster holds, each worker's
    publishes the blocks its rank computed and loads the ones it is told to, straight into
    vLLM's KV tensors."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        assert ktc is not None  # the base class refused None
        extra: Dict[str, ConfigValue] = dict(ktc.kv_connector_extra_config or {})
        self.settings = settings(extra, str(ktc.kv_role))
        check_hash_algo(str(vllm_config.cache_config.prefix_caching_hash_algo))
        if ktc.kv_load_failure_policy != "recompute":
            # A page that fails to load is a miss to recompute, never a failed request.
            ktc.kv_load_failure_policy = "recompute"
            logger.info("peercache: kv_load_failure_policy set to 'recompute' (a failed load recomputes)")
        tp_rank, pp_rank = _ranks(role)
        self.layout = layout_of(vllm_config, self.settings.model_name, tp_rank, pp_rank)
        self.scheme = KeyScheme(namespace(self.layout))
        rank = tp_rank + pp_rank * self.layout.tp_size
        sched_cfg, worker_cfg = node_configs(extra, str(ktc.engine_id), rank)
        startup = float(extra.get("startup_timeout", 30.0) or 0.0)
        self.store: Optional[PageStore] = None
        self._sched: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        # With the engine's KV events on, blocks stored in the cluster are announced too.
        kec = vllm_config.kv_events_config
        events_on = bool(kec is not None and kec.enable_kv_cache_events and self.settings.save)
        self._events: Optional[StoredBlocks] = None
        if role == KVConnectorRole.SCHEDULER:
            if events_on:
                pc = vllm_config.parallel_config
                workers = int(pc.tensor_parallel_size) * int(pc.pipeline_parallel_size)
                self._events = StoredBlocks(workers, self.layout.block_size)
            if self.settings.load:
                self.store = PageStore(sched_cfg, startup_timeout=startup)
                self.store.wait_ready()
            self._sched = SchedulerSide(self.store, self.scheme, self.layout.block_size,
                                        self.settings.load, self.settings.save, self.settings.prefix_wait_s,
                                        tails=self.settings.tails, save_async=self.settings.save_async,
                                        load_async=self.settings.load_async, events=self._events)
        else:
            self.store = PageStore(worker_cfg, startup_timeout=startup)
            self.store.wait_ready()
            self._worker = WorkerSide(self.store, self.scheme, int(kv_cache_config.num_blocks),
                                      save_async=self.settings.save_async, events=events_on, rank=rank,
                                      staging=self.settings.staging, staging_bytes=self.settings.staging_bytes,
                                      gpudirect=self.settings.gpudirect)
        logger.info("peercache: vLLM connector (%s) layout %s, load=%s save=%s, node %s",
                    role.name.lower(), self.scheme.namespace, self.settings.load, self.settings.save,
                    self.store.node_id if self.store else "none")

    # ----- worker side -----
    def register_kv_caches(self, kv_caches: Mapping[str, StorageTensor]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, PeerCacheMeta):
            self._worker.preempted(kv_connector_metadata.preempted)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: object) -> None:
        meta = self._get_connector_metadata()
        if self._worker is not None and isinstance(meta, PeerCacheMeta):
            self._worker.begin_step(meta)
            self._worker.load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads complete in start_load_kv, before the forward pass

    def save_kv_layer(self, layer_name: str, kv_layer: object, attn_metadata: object, **kwargs: object) -> None:
        return  # whole blocks of every layer are published in wait_for_save

    def wait_for_save(self) -> None:
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if isinstance(meta, PeerCacheMeta):
            self._worker.save(meta)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        if self._worker is None:
            return None, None
        sent, received = self._worker.finished(finished_req_ids)
        return (sent or None), (received or None)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return self._worker.take_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> Optional[PeerCacheStats]:
        if self._worker is None:
            return None
        data = self._worker.take_counts()
        return PeerCacheStats(data=data) if any(data.values()) else None

    def get_kv_connector_kv_cache_events(self) -> Optional[PeerCacheKVEvents]:
        if self._worker is None:
            return None
        stored = self._worker.take_stored()
        return PeerCacheKVEvents.of_hashes(stored, self.layout.block_size) if stored else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Mapping[str, object]] = None) -> PeerCacheStats:
        return PeerCacheStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: Mapping[type, type], labelnames: List[str],
                           per_engine_labelvalues: Dict[int, List[object]]) -> PeerCachePromMetrics:
        return PeerCachePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: object) -> bool:
        """vLLM 0.33's sleep-mode question: can the connector follow the KV cache's remap? Yes
        where the node knows only host memory (in-place host caches, staging mirrors: the device
        caches are reached through their tensors, whose addresses a remap keeps); no with
        ``kv_gpudirect = peermem``, whose device registrations a remap would leave stale."""
        extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
        return str(extra.get("kv_gpudirect", "off")) == "off"

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self.store is not None:
            self.store.close()

    # ----- scheduler side -----
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        assert self._sched is not None
        return self._sched.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        assert self._sched is not None
        self._sched.after_alloc(request, blocks.get_block_ids()[0], num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._sched is not None
        so = scheduler_output
        cached = so.scheduled_cached_reqs
        new = [(r.req_id, r.block_ids[0], r.num_computed_tokens) for r in so.scheduled_new_reqs]
        old = [(rid, ids[0] if ids else None, rid in cached.resumed_req_ids, cached.num_computed_tokens[i])
               for i, (rid, ids) in enumerate(zip(cached.req_ids, cached.new_block_ids))]
        return self._sched.build_meta(new, old, dict(so.num_scheduled_tokens), list(so.finished_req_ids),
                                      sorted(so.preempted_req_ids or ()))

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        report = connector_output.kv_cache_events
        if self._events is not None and isinstance(report, PeerCacheKVEvents):
            self._events.reported(report)

    def take_events(self) -> Iterable["KVCacheEvent"]:
        if self._events is not None:
            yield from self._events.take()

    def request_finished(self, request: "Request", block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, object]]]:
        # True: saves of the request may still be running; vLLM frees its blocks when the
        # workers report it in get_finished.
        delay = self._sched.finished(request.request_id) if self._sched is not None else False
        return delay, None

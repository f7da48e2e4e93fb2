"""The connector's figures in vLLM's own telemetry: ``KV Transfer metrics`` log lines and,
on the server's ``/metrics``, ``vllm:peercache_*`` counters (blocks and bytes loaded and
published, failed loads, seconds spent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Protocol

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# stats key -> (Prometheus name, help)
_COUNTERS = {
    "loaded_blocks": ("vllm:peercache_loaded_blocks", "KV blocks loaded from PeerCache."),
    "load_failed_blocks": ("vllm:peercache_load_failed_blocks", "KV blocks PeerCache could not load (recomputed)."),
    "load_bytes": ("vllm:peercache_loaded_bytes", "Bytes of KV loaded from PeerCache."),
    "load_seconds": ("vllm:peercache_load_seconds", "Seconds spent loading KV from PeerCache."),
    "saved_blocks": ("vllm:peercache_saved_blocks", "KV blocks published to PeerCache."),
    "save_failed_blocks": ("vllm:peercache_save_failed_blocks", "KV blocks PeerCache did not take."),
    "save_bytes": ("vllm:peercache_saved_bytes", "Bytes of KV published to PeerCache."),
    "save_seconds": ("vllm:peercache_save_seconds", "Seconds spent publishing KV to PeerCache."),
}


class PeerCacheStats(KVConnectorStats):
    """Sums of the workers' counters over an interval."""

    def reset(self) -> None:
        self.data.clear()

    def aggregate(self, other: KVConnectorStats) -> "PeerCacheStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, int | float]:
        out: Dict[str, int | float] = {k: round(float(v), 4) if isinstance(v, float) else int(v)
                                       for k, v in self.data.items()}
        secs = float(self.data.get("load_seconds", 0.0))
        if secs > 0:
            out["load_GBps"] = round(float(self.data.get("load_bytes", 0)) / secs / 1e9, 3)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class _Counter(Protocol):
    """One labelled Prometheus counter child."""

    def inc(self, amount: float = ...) -> None: ...


class PeerCachePromMetrics(KVConnectorPromMetrics):
    """One counter per figure, labelled per engine as vLLM's own series are."""

    def __init__(self, vllm_config: "VllmConfig", metric_types: Mapping[type, type], labelnames: List[str],
                 per_engine_labelvalues: Dict[int, List[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._per_engine: Dict[str, Dict[int, _Counter]] = {}
        for key, (name, doc) in _COUNTERS.items():
            metric = self._counter_cls(name=name, documentation=doc, labelnames=labelnames)
            self._per_engine[key] = {i: metric.labels(*vals) for i, vals in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: Mapping[str, float], engine_idx: int = 0) -> None:
        for key, v in transfer_stats_data.items():
            child: Optional[_Counter] = self._per_engine.get(key, {}).get(engine_idx)
            if child is not None and v:
                child.inc(v)

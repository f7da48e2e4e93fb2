"""What the scheduler side hands the workers each step: pages to load into blocks before the
forward pass, pages to publish from blocks after it, requests that ended or were preempted.
Plain data (it crosses processes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

try:  # vLLM's base class when vLLM is importable; the connector module needs it anyway.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata as _MetaBase
except ImportError:  # pragma: no cover - only the policy tests run without vLLM
    _MetaBase = object


@dataclass
class BlockIO:
    """Page ``hashes[i]`` moves to or from block ``block_ids[i]`` of request ``req_id``;
    ``hint``: the node a router named as the holder of the request's KV (loads only), or with
    ``hint_per_rank`` the engine whose worker rank r is node ``<hint>-r<r>``."""

    req_id: str
    hashes: List[str]
    block_ids: List[int]
    hint: Optional[str] = None
    hint_per_rank: bool = False

    def hint_for(self, rank: int) -> Optional[str]:
        """The node worker rank ``rank`` asks first (None: no hint)."""
        if self.hint is None:
            return None
        return f"{self.hint}-r{rank}" if self.hint_per_rank else self.hint


@dataclass
class PeerCacheMeta(_MetaBase):  # type: ignore[explicit-any]  # vLLM's base, unfollowed, is Any
    """One step's loads and saves, and what the workers must know of requests that ended."""

    loads: List[BlockIO] = field(default_factory=list)
    saves: List[BlockIO] = field(default_factory=list)
    # Loads that run between steps (``load_async``): their requests wait in vLLM's
    # WAITING_FOR_REMOTE_KVS until a worker reports them in ``get_finished``.
    async_loads: List[BlockIO] = field(default_factory=list)
    # Requests that finished with saves possibly in flight: vLLM keeps their blocks until the
    # workers report them done (``get_finished``).
    delayed: List[str] = field(default_factory=list)
    # Requests vLLM preempted this step: their blocks may be reused by this step's forward, so
    # their saves in flight must end first (``handle_preemptions``).
    preempted: List[str] = field(default_factory=list)

    def load_pairs(self) -> Tuple[List[str], List[int]]:
        """Every load of the step as (hashes, block ids), one batch."""
        return _flatten(self.loads)

    def save_pairs(self) -> Tuple[List[str], List[int]]:
        """Every save of the step as (hashes, block ids), one batch."""
        return _flatten(self.saves)


def _flatten(ios: List[BlockIO]) -> Tuple[List[str], List[int]]:
    hs: List[str] = []
    bs: List[int] = []
    for io in ios:
        hs.extend(io.hashes)
        bs.extend(io.block_ids)
    return hs, bs

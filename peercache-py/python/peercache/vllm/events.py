"""KV events of the connector: vLLM's ``BlockStored`` for every block the workers published
to PeerCache, so a router listening to the engine's own KV-event stream (``--kv-events-config``)
learns which prefixes this engine can load from the cluster.

A worker knows which pages it stored; the scheduler knows what they are (the block's token
ids, its parent). So each worker reports the page hashes its saves stored
(:class:`PeerCacheKVEvents`, from ``get_kv_connector_kv_cache_events``), and the scheduler
(:class:`StoredBlocks`) emits a block's event from ``take_events`` once every worker of the
engine has stored its part, with the hash, parent and tokens vLLM's own events carry. A block
whose save failed on a rank is never announced. Both sides are bounded."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from vllm.distributed.kv_events import BlockStored, KVCacheEvent, KVConnectorKVEvents
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

# The medium of the connector's events: PeerCache holds pages in host memory.
MEDIUM = "cpu"

# Blocks planned but not yet stored everywhere (a failed save leaves one behind: the oldest
# go first past this).
MAX_PENDING = 1 << 16


class PeerCacheKVEvents(KVConnectorKVEvents):
    """What one or more workers stored since their last report: one ``BlockStored`` per page,
    naming only its block hash (the scheduler adds the rest). Crosses processes (pickled)."""

    def __init__(self, events: Optional[List[KVCacheEvent]] = None, workers: int = 1) -> None:
        self._events: List[KVCacheEvent] = list(events or [])
        self._workers = workers

    @classmethod
    def of_hashes(cls, page_hashes: Iterable[str], block_size: int) -> "PeerCacheKVEvents":
        """The report of one worker: page hashes (hex of vLLM's block hashes) it stored. A
        prompt tail's page (``t…``, no vLLM block) is left out."""
        events: List[KVCacheEvent] = []
        for h in page_hashes:
            try:
                block = bytes.fromhex(h)
            except ValueError:
                continue
            events.append(BlockStored(block_hashes=[block], parent_block_hash=None, token_ids=[],
                                      block_size=block_size, lora_id=None, medium=MEDIUM, lora_name=None))
        return cls(events)

    def add_events(self, events: List[KVCacheEvent]) -> None:
        self._events.extend(events)

    def aggregate(self) -> "PeerCacheKVEvents":
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> List[KVCacheEvent]:
        return list(self._events)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._events = []

    def stored_hashes(self) -> List[bytes]:
        """Every block hash the reports name (once per worker that stored it)."""
        out: List[bytes] = []
        for e in self._events:
            if isinstance(e, BlockStored):
                out.extend(h for h in e.block_hashes if isinstance(h, bytes))
        return out


@dataclass
class _Planned:
    block_hash: bytes
    parent: Optional[bytes]
    token_ids: List[int]
    lora_id: Optional[int]
    lora_name: Optional[str]
    stored_by: int = 0


class StoredBlocks:
    """The scheduler's half: blocks planned for saving, and the events of those every worker
    has stored. ``workers`` is how many workers store each block (tensor × pipeline ranks)."""

    def __init__(self, workers: int, block_size: int, max_pending: int = MAX_PENDING) -> None:
        self.workers = max(1, workers)
        self.block_size = block_size
        self.max_pending = max_pending
        self._planned: "OrderedDict[bytes, _Planned]" = OrderedDict()
        self._ready: List[KVCacheEvent] = []
        self.dropped = 0  # planned blocks forgotten past max_pending (a save that never landed)

    def planned(self, block_hashes: Sequence[bytes], parent: Optional[bytes], token_ids: Sequence[int],
                lora_id: Optional[int] = None, lora_name: Optional[str] = None) -> None:
        """Blocks ``block_hashes`` (consecutive, the first after ``parent``) go out for saving;
        ``token_ids`` are theirs, ``block_size`` per block."""
        bs = self.block_size
        for i, h in enumerate(block_hashes):
            if h in self._planned:
                continue
            self._planned[h] = _Planned(h, parent if i == 0 else block_hashes[i - 1],
                                        list(token_ids[i * bs:(i + 1) * bs]), lora_id, lora_name)
        while len(self._planned) > self.max_pending:
            self._planned.popitem(last=False)
            self.dropped += 1

    def reported(self, report: PeerCacheKVEvents) -> None:
        """Workers' reports: a block every worker stored becomes an event."""
        for h in report.stored_hashes():
            p = self._planned.get(h)
            if p is None:
                continue  # not planned here (a tail page), or forgotten
            p.stored_by += 1
            if p.stored_by >= self.workers:
                del self._planned[h]
                self._ready.append(BlockStored(
                    block_hashes=[maybe_convert_block_hash(p.block_hash)],
                    parent_block_hash=maybe_convert_block_hash(p.parent) if p.parent is not None else None,
                    token_ids=p.token_ids, block_size=self.block_size, lora_id=p.lora_id, medium=MEDIUM,
                    lora_name=p.lora_name))

    def take(self) -> List[KVCacheEvent]:
        """The events ready since the last call."""
        out, self._ready = self._ready, []
        return out

    def pending(self) -> int:
        """Blocks planned and not yet stored by every worker."""
        return len(self._planned)

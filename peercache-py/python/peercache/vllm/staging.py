"""Host staging for KV caches the node cannot read or write in place: vLLM's caches in GPU
memory (or any cache when ``kv_staging`` is ``always``). A host mirror holds a few blocks of
every layer in the same per-block layout, so a page staged here has exactly the bytes a page
read in place from a host cache has: engines of both kinds share pages.

A load reads its pages into mirror slots in one transport batch, then copies the slots into
the blocks with one ``index_copy_`` per layer; a save copies the blocks into slots with one
``index_select`` per layer, then publishes the slots (on the save thread: the slots stay taken
until the put ends). Slots are taken from a bounded pool; a batch larger than the pool moves in
pool-sized chunks.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..core import Segments
from .blocks import BlockTable, KVTensor, block_dim


class DeviceTensor(KVTensor, Protocol):
    """What staging uses of a KV tensor (a ``torch.Tensor``)."""

    @property
    def device(self) -> object: ...

    @property
    def dtype(self) -> object: ...


class SlotsTimeout(TimeoutError):
    """No mirror slots came free within the wait (saves in flight held them all)."""


class HostMirror:
    """``slots`` blocks of every distinct layer of ``kv_caches`` in host memory (pinned when
    CUDA is available), with the block table of those slots and a pool of free slots."""

    def __init__(self, kv_caches: Mapping[str, DeviceTensor], num_blocks: int, slots: int) -> None:
        import torch  # noqa: PLC0415

        if slots < 1:
            raise ValueError(f"peercache: {slots} staging slots: expected 1 or more")
        self._torch = torch
        self.slots = slots
        pin = bool(torch.cuda.is_available())
        # The distinct layers, as the block table keeps them (layers sharing one tensor once).
        self._device: Dict[str, DeviceTensor] = {}
        self._dims: Dict[str, int] = {}
        host: Dict[str, DeviceTensor] = {}
        seen = set()
        for name in sorted(kv_caches):
            t = kv_caches[name]
            d = block_dim(t, num_blocks)
            key = (int(t.data_ptr()), int(t.stride()[d]))
            if key in seen:
                continue
            seen.add(key)
            shape = list(t.shape)
            shape[d] = slots
            self._device[name] = t
            self._dims[name] = d
            host[name] = torch.empty(shape, dtype=t.dtype, device="cpu", pin_memory=pin)
        self.host = host
        self.table = BlockTable(host, slots, self._dims)
        self._free: List[int] = list(range(slots))
        self._cv = threading.Condition()

    def storages(self) -> List[Tuple[int, int]]:
        """(address, bytes) of each host tensor, to register with the node once."""
        out = []
        for t in self.host.values():
            s = t.untyped_storage()  # type: ignore[attr-defined]
            out.append((int(s.data_ptr()), int(s.nbytes())))
        return out

    def take(self, n: int, wait_s: float) -> List[int]:
        """``n`` free slots (at most the pool), waiting up to ``wait_s`` for saves to release
        some; :class:`SlotsTimeout` if they do not."""
        n = min(n, self.slots)
        deadline = time.monotonic() + wait_s
        with self._cv:
            while len(self._free) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SlotsTimeout(f"peercache: {n} staging slots not free within {wait_s:.0f} s")
                self._cv.wait(left)
            out, self._free = self._free[:n], self._free[n:]
        return out

    def give(self, slots: Sequence[int]) -> None:
        """Returns slots to the pool."""
        with self._cv:
            self._free.extend(slots)
            self._cv.notify_all()

    def segments(self, slots: Sequence[int]) -> Segments:
        """The page segments of ``slots``, in order."""
        return self.table.segments(slots)

    def _indices(self, ids: Sequence[int]) -> Dict[str, object]:
        """``ids`` as an index tensor on every device of the mirrored layers (built once per
        batch, not per layer)."""
        base = self._torch.tensor(list(ids), dtype=self._torch.long)
        out: Dict[str, object] = {"cpu": base}
        for t in self._device.values():
            key = str(t.device)
            if key not in out:
                out[key] = base.to(t.device)
        return out

    def gather(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """Copies blocks ``block_ids`` of every layer into ``slots`` (returns once the bytes are
        in host memory)."""
        blocks, at = self._indices(block_ids), self._indices(slots)["cpu"]
        for name, t in self._device.items():
            d, h = self._dims[name], self.host[name]
            rows = t.index_select(d, blocks[str(t.device)])  # type: ignore[attr-defined]
            h.index_copy_(d, at, rows.to("cpu"))  # type: ignore[attr-defined]

    def scatter(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copies ``slots`` into blocks ``block_ids`` of every layer (on the current stream; it
        has ended when this returns, so the slots may be reused)."""
        blocks, at = self._indices(block_ids), self._indices(slots)["cpu"]
        cuda = False
        for name, t in self._device.items():
            d, h = self._dims[name], self.host[name]
            dev = t.device
            rows = h.index_select(d, at)  # type: ignore[attr-defined]
            t.index_copy_(d, blocks[str(dev)], rows.to(dev, non_blocking=True))  # type: ignore[attr-defined]
            cuda = cuda or str(getattr(dev, "type", dev)) == "cuda"
        if cuda:
            self._torch.cuda.current_stream().synchronize()

"""Host staging for KV caches the node cannot read or write in place: vLLM's caches in GPU
memory (or any cache when ``kv_staging`` is ``always``). A host mirror holds a few blocks of
every layer in the same per-block layout, so a page staged here has exactly the bytes a page
read in place from a host cache has: engines of both kinds share pages.

A load reads its pages into mirror slots in one transport batch, then copies the slots into
the blocks with one ``index_copy_`` per layer part and run of adjacent slots (straight from
pinned memory on CUDA); a save copies the blocks into slots with one ``index_select`` per layer
part and run, then publishes the slots (on the save thread: the slots stay taken
until the put ends). Slots are taken from a bounded pool; a batch larger than the pool moves in
pool-sized chunks.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..core import Segments
from .blocks import BlockTable, KVTensor, kept_layers


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
        self._pinned = bool(torch.cuda.is_available())
        self._cuda = any(str(getattr(t.device, "type", t.device)) == "cuda" for t in kv_caches.values())
        # The layers a page holds, as a block table of the caches keeps them. The caches may be
        # laid out in any stride order (FlashInfer's HND is a permuted view): the mirror holds
        # each block in the caches' logical order, so a staged page's bytes do not depend on
        # the backend's physical layout.
        self._dims: Dict[str, int] = kept_layers(kv_caches, num_blocks)
        self._device: Dict[str, DeviceTensor] = {name: kv_caches[name] for name in self._dims}
        host: Dict[str, DeviceTensor] = {}
        for name, d in self._dims.items():
            t = kv_caches[name]
            shape = list(t.shape)
            shape[d] = slots
            host[name] = torch.empty(shape, dtype=t.dtype, device="cpu", pin_memory=self._pinned)
        self.host = host
        self.table = BlockTable(host, slots, self._dims)
        self._free: List[int] = list(range(slots))
        self._cv = threading.Condition()

    @staticmethod
    def block_bytes(kv_caches: Mapping[str, DeviceTensor], num_blocks: int) -> int:
        """Bytes of one staged page (one block of every layer a page holds), before any mirror
        is allocated."""
        total = 0
        for name, d in kept_layers(kv_caches, num_blocks).items():
            t = kv_caches[name]
            n = int(t.element_size())
            for k, size in enumerate(t.shape):
                n *= 1 if k == d else int(size)
            total += n
        return total

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
            self._free.sort()  # so later takes are runs of adjacent slots: one copy per run
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

    def _parts(self, name: str) -> List[Tuple[object, object]]:
        """(device view, host view) pairs of layer ``name`` with the block dimension first: one
        pair per index of the dimensions before it (none on the CPU backend's layout, K and V
        on CUDA backends'). Views, never copies, so writes land in the caches."""
        t, h, d = self._device[name], self.host[name], self._dims[name]
        lead = [range(n) for n in list(t.shape)[:d]]
        return [(t[idx], h[idx]) for idx in itertools.product(*lead)]  # type: ignore[index]

    def _sync(self) -> None:
        if self._cuda:
            self._torch.cuda.current_stream().synchronize()

    def gather(self, block_ids: Sequence[int], slots: Sequence[int]) -> None:
        """Copies blocks ``block_ids`` of every layer into ``slots`` (returns once the bytes are
        in host memory). Each run of adjacent slots is one copy per layer part, straight into
        the (pinned) mirror."""
        blocks, runs = self._indices(block_ids), slot_runs(slots)
        for name, t in self._device.items():
            ids = blocks[str(t.device)]
            for dev, host in self._parts(name):
                for at, first, n in runs:
                    rows = dev.index_select(0, ids.narrow(0, at, n))  # type: ignore[attr-defined]
                    host.narrow(0, first, n).copy_(rows, non_blocking=self._pinned)  # type: ignore[attr-defined]
        self._sync()

    def scatter(self, slots: Sequence[int], block_ids: Sequence[int]) -> None:
        """Copies ``slots`` into blocks ``block_ids`` of every layer (on the current stream; it
        has ended when this returns, so the slots may be reused). Each run of adjacent slots
        moves from the (pinned) mirror in one copy per layer part."""
        blocks, runs = self._indices(block_ids), slot_runs(slots)
        for name, t in self._device.items():
            ids = blocks[str(t.device)]
            for dev, host in self._parts(name):
                for at, first, n in runs:
                    src = host.narrow(0, first, n).to(t.device, non_blocking=True)  # type: ignore[attr-defined]
                    dev.index_copy_(0, ids.narrow(0, at, n), src)  # type: ignore[attr-defined]
        self._sync()


def slot_runs(slots: Sequence[int]) -> List[Tuple[int, int, int]]:
    """``slots`` as runs of adjacent slots: (position in ``slots``, first slot, length).

    >>> slot_runs([4, 5, 6, 0, 1, 9])
    [(0, 4, 3), (3, 0, 2), (5, 9, 1)]
    """
    out: List[Tuple[int, int, int]] = []
    for i, s in enumerate(slots):
        if out and out[-1][1] + out[-1][2] == s:
            at, first, n = out[-1]
            out[-1] = (at, first, n + 1)
        else:
            out.append((i, s, 1))
    return out

"""Where vLLM's KV blocks live in memory: for each registered KV tensor, the bytes of block
``b`` as a few (address, size) segments, so one PeerCache page holds one block of every layer
and a batch of blocks moves in one transport call, straight into vLLM's tensors."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from ..core import Segments


class KVTensor(Protocol):
    """What is read of a KV cache tensor (a ``torch.Tensor``)."""

    @property
    def shape(self) -> Sequence[int]: ...

    def stride(self) -> Tuple[int, ...]: ...

    def data_ptr(self) -> int: ...

    def element_size(self) -> int: ...


class LayoutError(ValueError):
    """A KV tensor whose blocks are not laid out as whole strided slices."""


@dataclass(frozen=True)
class LayerBlocks:
    """Block ``b`` of one layer: ``len(offsets)`` segments of ``block_bytes`` at
    ``base + offset + b * block_stride``."""

    base: int
    block_stride: int
    offsets: Tuple[int, ...]
    block_bytes: int


def block_dim(t: KVTensor, num_blocks: int) -> int:
    """The block dimension of a KV tensor: the first of size ``num_blocks`` (the CPU backend
    puts it first, CUDA backends after a K/V dimension of 2)."""
    dims = [d for d, n in enumerate(t.shape) if n == num_blocks]
    if not dims:
        raise LayoutError(f"peercache: a KV tensor of shape {tuple(t.shape)} has no dimension of "
                          f"{num_blocks} blocks")
    return dims[0]


def layer_blocks(t: KVTensor, num_blocks: int, dim: Optional[int] = None) -> LayerBlocks:
    """How the blocks of one KV tensor are laid out. The block dimension is ``dim`` (default:
    :func:`block_dim`); everything after it must be one dense slice per block."""
    shape = list(t.shape)
    strides = list(t.stride())
    elem = int(t.element_size())
    d = block_dim(t, num_blocks) if dim is None else dim
    if not 0 <= d < len(shape) or shape[d] != num_blocks:
        raise LayoutError(f"peercache: dimension {d} of a KV tensor of shape {tuple(shape)} is not "
                          f"its {num_blocks} blocks")
    inner = 1
    for k in range(len(shape) - 1, d, -1):
        if strides[k] != inner:
            raise LayoutError(f"peercache: a KV tensor of shape {tuple(shape)}, strides "
                              f"{tuple(strides)}: a block is not one dense slice")
        inner *= shape[k]
    if strides[d] < inner:
        raise LayoutError(f"peercache: KV blocks overlap (shape {tuple(shape)}, strides {tuple(strides)})")
    outer = [range(shape[k]) for k in range(d)]
    offsets = tuple(sum(i * strides[k] for k, i in enumerate(idx)) * elem
                    for idx in itertools.product(*outer))
    return LayerBlocks(base=int(t.data_ptr()), block_stride=strides[d] * elem,
                       offsets=offsets, block_bytes=inner * elem)


def kept_layers(kv_caches: Mapping[str, KVTensor], num_blocks: int,
                dims: Optional[Mapping[str, int]] = None) -> Dict[str, int]:
    """The block dimension of each layer a page holds, by name, in page order (sorted names):
    layers that share one tensor (KV sharing: the same data pointer and block stride) are
    stored once, under the first of their names. Reads only shapes, strides and pointers, so
    it holds for any stride order (a backend's physical layout, such as FlashInfer's HND)."""
    out: Dict[str, int] = {}
    seen = set()
    for name in sorted(kv_caches):
        t = kv_caches[name]
        d = block_dim(t, num_blocks) if dims is None else dims[name]
        key = (int(t.data_ptr()), int(t.stride()[d]) * int(t.element_size()))
        if key in seen:
            continue
        seen.add(key)
        out[name] = d
    return out


class BlockTable:
    """Every layer's blocks, in one fixed layer order: block ``b`` is the page made of each
    layer's segments of ``b``, in that order."""

    def __init__(self, kv_caches: Mapping[str, KVTensor], num_blocks: int,
                 dims: Optional[Mapping[str, int]] = None) -> None:
        if not kv_caches:
            raise LayoutError("peercache: vLLM registered no KV cache tensors")
        self.num_blocks = num_blocks
        self.layer_names: List[str] = sorted(kv_caches)
        #: The block dimension of each layer a page holds (:func:`kept_layers`).
        self.kept: Dict[str, int] = kept_layers(kv_caches, num_blocks, dims)
        self.layers: List[LayerBlocks] = [layer_blocks(kv_caches[name], num_blocks, d)
                                          for name, d in self.kept.items()]
        self._segs: List[Tuple[int, int, int]] = [
            (lb.base + off, lb.block_stride, lb.block_bytes) for lb in self.layers for off in lb.offsets]

    @property
    def segments_per_block(self) -> int:
        """Segments of one page."""
        return len(self._segs)

    @property
    def block_bytes(self) -> int:
        """Bytes of one page (one block of every layer)."""
        return sum(n for _, _, n in self._segs)

    def segments(self, block_ids: Sequence[int]) -> Segments:
        """The segments of the pages of ``block_ids``, in order."""
        out = Segments()
        per = len(self._segs)
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise LayoutError(f"peercache: block id {b} outside 0..{self.num_blocks - 1}")
            out.ptrs.extend(base + b * stride for base, stride, _ in self._segs)
            out.sizes.extend(n for _, _, n in self._segs)
            out.counts.append(per)
        return out

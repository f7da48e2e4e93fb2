"""What the SGLang adapters read of SGLang's objects, as structural types.

SGLang is not installed where the package is type-checked, and its classes change between
releases, so :mod:`peercache.store` and :mod:`peercache.linker` name the few attributes and
methods they use here instead of importing the classes. Each Protocol lists exactly what the
adapter touches; anything read with ``getattr`` and a default (attributes that only some
releases or pool kinds have) is left out and read from an ``object``.
"""

from __future__ import annotations

from typing import Hashable, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union

from .core import ConfigValue

#: A pool's name: SGLang's ``PoolName`` enum member (``PoolName.KV``) or a plain string.
PoolKey = Hashable

#: The free-form JSON object of ``--hicache-storage-backend-extra-config``.
ExtraConfig = Mapping[str, ConfigValue]


class IndexTensor(Protocol):
    """Host (or device) slot indices of a batch: a 1-D ``torch.Tensor`` of int64."""

    def numel(self) -> int: ...

    def __iter__(self) -> Iterator[int]: ...


#: Slot indices as SGLang passes them (a tensor), or a plain list in tests and tools.
Indices = Union[IndexTensor, Sequence[int]]


class HostPool(Protocol):
    """A host KV pool (``HostKVCache`` and its MHA/MLA/Mamba/indexer kinds): tokens per page
    and each page's buffers as (address, size) segments. ``kv_buffer``, ``size_per_token``,
    ``layout``, ``dtype`` and ``storage_format_tag`` are read with defaults."""

    @property
    def page_size(self) -> int: ...

    def get_page_buffer_meta(self, indices: Indices) -> Tuple[Sequence[int], Sequence[int]]: ...


class PoolEntry(Protocol):
    """One entry of a ``HostPoolGroup``: a named host pool."""

    @property
    def name(self) -> PoolKey: ...

    @property
    def host_pool(self) -> HostPool: ...


class HostPoolGroup(Protocol):
    """SGLang's ``HostPoolGroup`` (DeepSeek-V4 and other multi-pool models): named host pools,
    one of them the anchor whose geometry the KV pages follow."""

    @property
    def anchor_entry(self) -> PoolEntry: ...

    @property
    def entries(self) -> Sequence[PoolEntry]: ...


class PoolTransfer(Protocol):
    """SGLang's ``PoolTransfer`` (v2 interface): one pool's page hashes and slot indices.
    ``hit_policy``, ``group_pages`` and ``block_pages`` are read with defaults."""

    @property
    def name(self) -> PoolKey: ...

    @property
    def keys(self) -> Optional[Sequence[str]]: ...

    @property
    def host_indices(self) -> Optional[Indices]: ...


class TransferResult(Protocol):
    """SGLang's ``PoolTransferResult``: what ``batch_exists_v2`` answers."""

    @property
    def kv_hit_pages(self) -> int: ...

    @property
    def extra_pool_hit_pages(self) -> Mapping[PoolKey, int]: ...

    @property
    def restorable_prefix_pages(self) -> Optional[List[int]]: ...


class ExtraInfo(Protocol):
    """``HiCacheStorageExtraInfo``: per-call extras; only its free-form dict is read."""

    @property
    def extra_info(self) -> Optional[Mapping[str, ConfigValue]]: ...


class StorageMetrics(Protocol):
    """SGLang's ``StorageMetrics`` (its collector checks the real class, so one is built)."""

    prefetch_pgs: List[float]
    backup_pgs: List[float]
    prefetch_bandwidth: List[float]
    backup_bandwidth: List[float]


class Tensor(Protocol):
    """What the direct linker does with a ``torch.Tensor``: its memory, shape and the copies
    between a device pool and the host staging arena."""

    @property
    def shape(self) -> Sequence[int]: ...

    @property
    def dtype(self) -> object: ...

    @property
    def device(self) -> "Device": ...

    def data_ptr(self) -> int: ...

    def numel(self) -> int: ...

    def element_size(self) -> int: ...

    def is_contiguous(self) -> bool: ...

    def reshape(self, *shape: int) -> "Tensor": ...

    def view(self, *shape: object) -> "Tensor": ...

    def __getitem__(self, index: object) -> "Tensor": ...

    def to(self, device: object, non_blocking: bool = ...) -> "Tensor": ...

    def copy_(self, src: "Tensor", non_blocking: bool = ...) -> "Tensor": ...

    def index_copy_(self, dim: int, index: "Tensor", source: "Tensor") -> "Tensor": ...

    def index_select(self, dim: int, index: "Tensor") -> "Tensor": ...


class Device(Protocol):
    """A ``torch.device``: its kind (``"cpu"``, ``"cuda"``…)."""

    @property
    def type(self) -> str: ...


class DevicePoolEntry(Protocol):
    """SGLang's ``DevicePoolEntry`` (direct linker): one device pool's buffers, their page
    geometry (``buffer_meta``: per component, (base, row stride, bytes) per buffer), which
    buffers each transfer layer covers, and the slot check for a transfer's indices."""

    name: PoolKey
    page_size: int
    kv_buffer: Sequence[Tensor]
    buffer_meta: Sequence[Sequence[Tuple[int, int, int]]]
    components: Sequence[Sequence[Tensor]]
    layer_mapping: Mapping[int, Union[int, Sequence[int]]]
    _row_span: int

    def prepare_locations(self, indices: Indices) -> Sequence[int]: ...


class LinkerTransfer(PoolTransfer, Protocol):
    """A linker transfer after SGLang's ``resolve_transfers``: one pool's page hashes and
    device slot indices (always present)."""

    @property
    def host_indices(self) -> Indices: ...


class DevicePoolGroup(Protocol):
    """SGLang's ``DevicePoolGroup``: the device pools of one model and how transfers resolve."""

    entry_map: Mapping[PoolKey, DevicePoolEntry]
    num_layers: int
    rank_replicated: bool

    def resolve_transfers(self, transfers: Sequence[LinkerTransfer], allow_partial: bool = ...,
                          allow_missing_kv: bool = ...) -> List[LinkerTransfer]: ...


class Event(Protocol):
    """A device event (``torch.cuda.Event``, or the CPU module's stand-in)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class DeviceKVCache(Protocol):
    """A device KV pool (``MHATokenToKVPool``, ``MLATokenToKVPool``, hybrid pools): its layer
    count; per-kind buffers are read through :class:`MHAKVCache` / :class:`MLAKVCache`."""

    @property
    def layer_num(self) -> int: ...


class MHAKVCache(DeviceKVCache, Protocol):
    """``MHATokenToKVPool``: one K and one V buffer per layer."""

    @property
    def k_buffer(self) -> Sequence[Tensor]: ...

    @property
    def v_buffer(self) -> Sequence[Tensor]: ...


class MLAKVCache(DeviceKVCache, Protocol):
    """``MLATokenToKVPool``: one latent buffer per layer."""

    @property
    def kv_buffer(self) -> Sequence[Tensor]: ...


class KVAllocator(Protocol):
    """The token-to-KV allocator: hands out the device KV pool."""

    def get_kvcache(self) -> DeviceKVCache: ...


class LinkerParams(Protocol):
    """The linker's construction parameters (``UnifiedCacheLinkerParams``): page size and the
    allocator of the device KV cache. Parallel ranks, cache groups, draft pools and
    ``req_to_token_pool`` are read with defaults."""

    @property
    def page_size(self) -> int: ...

    @property
    def token_to_kv_pool_allocator(self) -> KVAllocator: ...


__all__ = [
    "PoolKey", "ExtraConfig", "IndexTensor", "Indices", "HostPool", "PoolEntry", "HostPoolGroup", "PoolTransfer",
    "TransferResult", "ExtraInfo", "StorageMetrics", "Tensor", "Device", "DevicePoolEntry",
    "LinkerTransfer", "DevicePoolGroup", "Event", "DeviceKVCache", "MHAKVCache", "MLAKVCache", "KVAllocator", "LinkerParams",
]

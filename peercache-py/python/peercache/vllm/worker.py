"""The worker side of the vLLM connector: registers vLLM's KV tensors with the node, loads the
step's pages straight into their blocks before the forward pass (one batch), publishes the
step's new full blocks and prompt tails after it (one batch, on a background thread unless
``save_async`` is off), and reports blocks that failed to load so vLLM recomputes them —
never a wrong token. KV caches the node cannot reach in place (GPU memory) move through a
host mirror (``staging.py``); with ``kv_gpudirect = peermem`` pages other nodes hold land in
them over RDMA first (GPUDirect), and only the rest is staged."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from ..core import KeyScheme, Segments
from .blocks import BlockTable, LayoutError
from .loader import LoadQueue
from .meta import BlockIO, PeerCacheMeta
from .saver import SaveJob, SaveQueue
from .staging import DeviceTensor, HostMirror, SlotsTimeout

logger = logging.getLogger("vllm.peercache")

# Stored page hashes kept for the next events report at most.
MAX_STORED = 1 << 16


class Pages(Protocol):
    """What the worker needs of the node (a :class:`peercache.core.PageStore`)."""

    def register_host(self, ptr: int, nbytes: int) -> bool: ...

    def put(self, keys: Sequence[str], segs: Segments) -> List[bool]: ...

    def get(self, keys: Sequence[str], segs: Segments, hint: Optional[str] = None) -> List[bool]: ...

    def register_device_spans(self, spans: Mapping[int, int]) -> Optional[str]: ...

    def get_device(self, keys: Sequence[str], segs: Segments) -> List[bool]: ...


class StorageTensor(DeviceTensor, Protocol):
    """A KV tensor with its device and storage."""

    def untyped_storage(self) -> object: ...


@dataclass
class StepCounts:
    """Counters since the last stats report."""

    lookups_blocks: int = 0
    loaded_blocks: int = 0
    load_failed_blocks: int = 0
    load_seconds: float = 0.0
    load_bytes: int = 0
    saved_blocks: int = 0
    save_failed_blocks: int = 0
    save_seconds: float = 0.0
    save_bytes: int = 0

    def as_dict(self) -> Dict[str, float]:
        """A plain dict (it crosses processes)."""
        return dict(self.__dict__)


class WorkerSide:
    """One worker rank's connector state."""

    def __init__(self, pages: Pages, scheme: KeyScheme, num_blocks: int, save_async: bool = True,
                 save_wait_s: float = 60.0, events: bool = False, rank: int = 0, staging: str = "auto",
                 staging_bytes: int = 256 << 20, gpudirect: str = "off") -> None:
        self.pages = pages
        self.rank = rank  # this worker's rank in the engine (a per-rank hint names <base>-r<rank>)
        self.scheme = scheme
        self.num_blocks = num_blocks
        self.table: Optional[BlockTable] = None
        # Staged caches: one mirror for loads (used under the lock, by the step and the load
        # thread in turn) and one for saves (slots held until their put ends).
        self.staging = staging
        self.staging_bytes = staging_bytes
        self._load_mirror: Optional[HostMirror] = None
        self._save_mirror: Optional[HostMirror] = None
        # GPUDirect (``kv_gpudirect = peermem``): asked for, and on once the caches registered.
        self.gpudirect_mode = gpudirect
        self.gpudirect = False
        self._device_table: Optional[BlockTable] = None
        self._load_lock = threading.Lock()
        self._errors: Set[int] = set()
        # Requests with a failed load: they publish nothing until they finish.
        self._tainted: Set[str] = set()
        self._lock = threading.Lock()
        self.counts = StepCounts()
        self.save_wait_s = save_wait_s
        self._saves: Optional[SaveQueue] = SaveQueue(pages.put, self._saved) if save_async else None
        self._delayed: List[str] = []
        self._loads = LoadQueue(self._load_ios)
        # Page hashes stored since the last events report (``events``: the engine publishes KV
        # events); bounded like the scheduler's half.
        self.events = events
        self._stored: List[str] = []

    def register(self, kv_caches: Mapping[str, StorageTensor]) -> None:
        """``register_kv_caches``: the block table, and every tensor's storage registered
        once as a zero-copy source and destination (host memory on the CPU platform). Caches
        elsewhere (GPU memory), or any with ``kv_staging = always``, get two host mirrors of
        ``staging_size`` in all instead, registered in their place."""
        devices = {str(getattr(t.device, "type", t.device)) for t in kv_caches.values()}
        staged = self.staging == "always" or devices != {"cpu"}
        if staged and self.staging == "never":
            raise NotImplementedError(
                f"peercache: KV caches on {sorted(devices)} and kv_staging = never: the node "
                "reads and writes host memory in place only; set kv_staging to auto")
        if staged:
            # A page's layout is the mirror's: each block in the caches' logical order.
            block_bytes = HostMirror.block_bytes(kv_caches, self.num_blocks)
            slots = min(max(1, self.staging_bytes // 2 // block_bytes), self.num_blocks)
            self._load_mirror = HostMirror(kv_caches, self.num_blocks, slots)
            self._save_mirror = HostMirror(kv_caches, self.num_blocks, slots)
            self.table = self._load_mirror.table
            for m in (self._load_mirror, self._save_mirror):
                for ptr, n in m.storages():
                    self.pages.register_host(ptr, n)
            logger.info("peercache: %d KV layers on %s staged through host memory: %d blocks of "
                        "%d bytes each way", len(self.table.layers), sorted(devices), slots,
                        self.table.block_bytes)
            if self.gpudirect_mode == "peermem":
                self.gpudirect = self._register_device(kv_caches)
            return
        self.table = BlockTable(kv_caches, self.num_blocks)
        if self.gpudirect_mode != "off":
            logger.info("peercache: kv_gpudirect = %s has nothing to do: the KV caches are host memory, "
                        "read and written in place", self.gpudirect_mode)
        for t in kv_caches.values():
            storage = t.untyped_storage()
            ptr = int(storage.data_ptr())  # type: ignore[attr-defined]
            n = int(storage.nbytes())  # type: ignore[attr-defined]
            self.pages.register_host(ptr, n)
        logger.info("peercache: %d KV layers registered, %d segments and %d bytes a block",
                    len(self.table.layers), self.table.segments_per_block, self.table.block_bytes)

    def _register_device(self, kv_caches: Mapping[str, StorageTensor]) -> bool:
        """Registers every distinct KV storage with the node as device memory
        (``nvidia-peermem`` addresses), so pages other nodes hold land in the blocks over RDMA;
        False, with one warning, where the node cannot (TCP, no peermem)."""
        try:
            # Pages land as raw bytes in the blocks, so a block must be one dense slice in the
            # caches' logical order, the order staged pages hold.
            self._device_table = BlockTable(kv_caches, self.num_blocks)
        except LayoutError as e:
            logger.warning("peercache: GPUDirect unavailable (%s: the caches' physical layout is not "
                           "their logical one); loads stage through host memory", e)
            return False
        spans: Dict[int, int] = {}
        for t in kv_caches.values():
            storage = t.untyped_storage()
            spans.setdefault(int(storage.data_ptr()), int(storage.nbytes()))  # type: ignore[attr-defined]
        why = self.pages.register_device_spans(spans)
        if why is not None:
            logger.warning("peercache: GPUDirect unavailable (%s); loads stage through host memory", why)
            return False
        logger.info("peercache: GPUDirect on: %d KV storages registered; pages of other nodes land in "
                    "the blocks over RDMA", len(spans))
        return True

    def load(self, meta: PeerCacheMeta) -> None:
        """Reads the step's synchronous loads into their blocks, before the forward pass, and
        queues its asynchronous ones (``load_async``) for the load thread."""
        self._load_ios(meta.loads)
        self._loads.submit(list(meta.async_loads))

    def _load_ios(self, ios: List[BlockIO]) -> None:
        """Reads the pages of ``ios`` into their blocks, one batch per router hint (one batch
        when no request carries a hint)."""
        groups: Dict[Optional[str], List[BlockIO]] = {}
        for io in ios:
            groups.setdefault(io.hint_for(self.rank), []).append(io)
        for hint, group in groups.items():
            self._load_group(group, hint)

    def _load_group(self, ios: List[BlockIO], hint: Optional[str]) -> None:
        """Reads the pages of ``ios`` into their blocks in one batch (asking the node ``hint``
        names first); every block that did not land is remembered for :meth:`take_errors`, and
        its request publishes nothing more (what a forward pass computed over a missing block
        is discarded and recomputed, and a step already scheduled behind it may have read it
        too)."""
        hashes, block_ids = PeerCacheMeta(loads=ios).load_pairs()
        if not hashes:
            return
        if self.table is None:
            self._fail(block_ids, "no KV caches registered", ios)
            return
        t0 = time.perf_counter()
        try:
            keys = self.scheme.keys(hashes)
            if self.gpudirect:
                ok = self._get_direct(keys, block_ids, hint)
            elif self._load_mirror is not None:
                ok = self._get_staged(self._load_mirror, keys, block_ids, hint)
            else:
                ok = self.pages.get(keys, self.table.segments(block_ids), hint)
        except Exception as e:  # node down, timeout, bad secret: recompute, never raise
            self._fail(block_ids, str(e), ios)
            return
        dt = time.perf_counter() - t0
        bad = [b for b, good in zip(block_ids, ok) if not good]
        logger.debug("peercache: loaded %d of %d block(s) in %.4f s", len(block_ids) - len(bad), len(block_ids), dt)
        with self._lock:
            self.counts.loaded_blocks += len(block_ids) - len(bad)
            self.counts.load_bytes += (len(block_ids) - len(bad)) * self.table.block_bytes
            self.counts.load_seconds += dt
        if bad:
            failed = set(bad)
            self._fail(bad, f"{len(bad)} of {len(block_ids)} pages missing",
                       [io for io in ios if failed.intersection(io.block_ids)])

    def _get_direct(self, keys: List[str], block_ids: List[int], hint: Optional[str]) -> List[bool]:
        """GPUDirect: one node call lands every page other nodes hold straight in the blocks
        over RDMA (each checked by its header before and after); the rest (this node's own
        pages, peers reached without RDMA, misses) go through the load mirror."""
        assert self._device_table is not None and self._load_mirror is not None
        ok = self.pages.get_device(keys, self._device_table.segments(block_ids))
        rest = [i for i, good in enumerate(ok) if not good]
        if rest:
            got = self._get_staged(self._load_mirror, [keys[i] for i in rest], [block_ids[i] for i in rest], hint)
            for i, good in zip(rest, got):
                ok[i] = good
        return ok

    def _get_staged(self, m: HostMirror, keys: List[str], block_ids: List[int],
                    hint: Optional[str]) -> List[bool]:
        """Reads pages into the load mirror, a mirror-full at a time, and copies the ones that
        landed into their blocks."""
        ok: List[bool] = []
        slots = list(range(m.slots))
        for i in range(0, len(keys), m.slots):
            ks, bs = keys[i:i + m.slots], block_ids[i:i + m.slots]
            with self._load_lock:
                got = self.pages.get(ks, m.segments(slots[:len(ks)]), hint)
                landed = [(s, b) for s, b, g in zip(slots, bs, got) if g]
                if landed:
                    m.scatter([s for s, _ in landed], [b for _, b in landed])
            ok.extend(got)
        return ok

    def _fail(self, block_ids: Sequence[int], why: str, ios: Sequence[BlockIO]) -> None:
        logger.warning("peercache: %d block(s) not loaded (%s); vLLM recomputes them", len(block_ids), why)
        with self._lock:
            self._tainted.update(io.req_id for io in ios)
            self._errors.update(block_ids)
            self.counts.load_failed_blocks += len(block_ids)

    def begin_step(self, meta: PeerCacheMeta) -> None:
        """Before the step's loads: preempted requests' saves end (their blocks may be reused
        now), and finished requests vLLM waits on are noted for :meth:`finished`."""
        self.preempted(meta.preempted)
        self._delayed.extend(meta.delayed)

    def preempted(self, req_ids: Sequence[str]) -> None:
        """``handle_preemptions``: waits until no save of ``req_ids`` is in flight."""
        if self._saves is None or not req_ids:
            return
        if not self._saves.wait_for(req_ids, self.save_wait_s):
            logger.warning("peercache: saves of %d preempted request(s) still running after %.0f s",
                           len(req_ids), self.save_wait_s)

    def save(self, meta: PeerCacheMeta) -> None:
        """Publishes the step's new full blocks and prompt tails, after the forward pass wrote
        them: queued for the save thread, or here with ``save_async`` off."""
        with self._lock:
            tainted = set(self._tainted)
        if tainted:
            meta = PeerCacheMeta(saves=[io for io in meta.saves if io.req_id not in tainted])
        hashes, block_ids = meta.save_pairs()
        if not hashes or self.table is None:
            return
        keys = self.scheme.keys(hashes)
        req_ids = [io.req_id for io in meta.saves]
        m = self._save_mirror
        if m is None:
            self._submit(SaveJob(keys, self.table.segments(block_ids), req_ids, hashes))
            return
        # Staged: the blocks are copied out now (vLLM may reuse them once this step's saves
        # are reported), and the mirror slots stay taken until their put ends.
        for i in range(0, len(keys), m.slots):
            bs = block_ids[i:i + m.slots]
            try:
                slots = m.take(len(bs), self.save_wait_s)
            except SlotsTimeout as e:
                logger.warning("peercache: %d block(s) not published (%s)", len(keys) - i, e)
                with self._lock:
                    self.counts.save_failed_blocks += len(keys) - i
                return
            try:
                m.gather(bs, slots)
            except Exception as e:  # a device error costs these pages, never the step
                m.give(slots)
                logger.warning("peercache: %d block(s) not published (staging: %s)", len(keys) - i, e)
                with self._lock:
                    self.counts.save_failed_blocks += len(keys) - i
                return
            self._submit(SaveJob(keys[i:i + m.slots], m.segments(slots), req_ids, hashes[i:i + m.slots],
                                 slots=slots))

    def _submit(self, job: SaveJob) -> None:
        """Runs a save batch on the save thread, or here with ``save_async`` off."""
        if self._saves is not None:
            self._saves.submit(job)
            return
        keys = job.keys
        t0 = time.perf_counter()
        try:
            ok = self.pages.put(keys, job.segs)
        except Exception as e:  # a full pool or a node down costs future hits, nothing else
            logger.warning("peercache: %d block(s) not published (%s)", len(keys), e)
            ok = [False] * len(keys)
        self._saved(job, ok, time.perf_counter() - t0)

    def _saved(self, job: SaveJob, ok: List[bool], seconds: float) -> None:
        if job.slots and self._save_mirror is not None:
            self._save_mirror.give(job.slots)
        block_bytes = self.table.block_bytes if self.table is not None else 0
        saved = sum(ok)
        with self._lock:
            self.counts.saved_blocks += saved
            self.counts.save_failed_blocks += len(ok) - saved
            self.counts.save_bytes += saved * block_bytes
            self.counts.save_seconds += seconds
            if self.events:
                self._stored.extend(h for h, stored in zip(job.hashes, ok) if stored)
                if len(self._stored) > MAX_STORED:
                    # Nobody took the reports (no scheduler reads them): keep the newest.
                    del self._stored[:len(self._stored) - MAX_STORED]

    def take_stored(self) -> List[str]:
        """Page hashes stored since the last call (for the connector's KV events)."""
        with self._lock:
            out, self._stored = self._stored, []
        return out

    def finished(self, req_ids: Set[str]) -> Tuple[Set[str], Set[str]]:
        """``get_finished``: forgets requests that ended; returns the finished requests vLLM
        waits on whose saves have all ended, and the requests whose asynchronous load ended
        (each once; a load's failed blocks are in :meth:`take_errors` by then)."""
        with self._lock:
            self._tainted.difference_update(req_ids)
        received = self._loads.finished()
        if self._saves is None:
            return set(), received
        delayed, self._delayed = self._delayed, []
        return self._saves.finished(delayed), received

    def close(self) -> None:
        """Lets queued loads and saves end (bounded), then stops their threads."""
        if not self._loads.close(self.save_wait_s):
            logger.warning("peercache: loads still running at shutdown after %.0f s", self.save_wait_s)
        if self._saves is not None and not self._saves.close(self.save_wait_s):
            logger.warning("peercache: saves still running at shutdown after %.0f s", self.save_wait_s)

    def take_errors(self) -> Set[int]:
        """Blocks that failed to load since the last call."""
        with self._lock:
            out, self._errors = self._errors, set()
        return out

    def take_counts(self) -> Dict[str, float]:
        """Counters since the last call."""
        with self._lock:
            out, self.counts = self.counts, StepCounts()
        return out.as_dict()

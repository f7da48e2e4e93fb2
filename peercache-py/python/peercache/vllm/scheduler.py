"""The scheduler side of the vLLM connector: how many of a request's tokens the cluster holds
(one batched leading-run lookup), which blocks to load after allocation, which full blocks to
publish after each step. It holds no engine memory; its node only asks the directory."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from .. import policy
from ..core import KeyScheme
from .meta import BlockIO, PeerCacheMeta

logger = logging.getLogger("vllm.peercache")


class EngineRequest(Protocol):
    """What is read of vLLM's ``Request``."""

    @property
    def request_id(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def block_hashes(self) -> Sequence[bytes]: ...

    @property
    def num_prompt_tokens(self) -> int: ...

    @property
    def prompt_token_ids(self) -> Optional[Sequence[int]]: ...

    @property
    def lora_request(self) -> object: ...

    @property
    def mm_features(self) -> Sequence[object]: ...

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def kv_transfer_params(self) -> Optional[Mapping[str, object]]: ...


# The ``kv_transfer_params`` field a router sets to the node id that holds a request's KV.
HINT_PARAM = "holder_node"
# The field a router sets to the engine whose ranks hold it: the connector's ``node_id`` base,
# so that worker rank r asks ``<base>-r<r>`` (with TP/PP > 1 every rank saved its own share).
ENGINE_HINT_PARAM = "holder_engine"


@dataclass(frozen=True)
class HolderHint:
    """Who a router says holds a request's KV: one node (``per_rank`` False), or an engine whose
    rank r is node ``<name>-r<r>``."""

    name: str
    per_rank: bool = False

    def node_for(self, rank: int) -> str:
        """The node worker rank ``rank`` asks."""
        return f"{self.name}-r{rank}" if self.per_rank else self.name


# The action of a typed KV-hint envelope (vLLM's ``Request.kv_hints``, ``KvHintsEnvelope``) that
# names the holder: its ``action_type``, the major ``action_version`` understood, and a payload
# of ``{"node": id}`` or ``{"engine": node id base}``. Other actions are left to whoever owns them.
HINT_ACTION = "peercache.holder"
HINT_ACTION_MAJOR = "1"


def _field(obj: object, name: str) -> object:
    """``obj.name``, or ``obj[name]`` for a mapping (an envelope decoded to builtins)."""
    if isinstance(obj, Mapping):
        value: object = obj.get(name)
        return value
    found: object = getattr(obj, name, None)
    return found


def _named(node: object, engine: object) -> Optional[HolderHint]:
    """A node id wins over an engine; None when neither is a non-empty string."""
    if isinstance(node, str) and node:
        return HolderHint(node)
    if isinstance(engine, str) and engine:
        return HolderHint(engine, per_rank=True)
    return None


def envelope_hint(envelope: object) -> Optional[HolderHint]:
    """The holder named by the first ``peercache.holder`` action of a KV-hint envelope whose
    major version is understood (None: no such action, or its payload names nobody)."""
    actions = _field(envelope, "actions")
    if not isinstance(actions, (list, tuple)):
        return None
    for action in actions:
        version = _field(action, "action_version")
        if _field(action, "action_type") != HINT_ACTION or not isinstance(version, str):
            continue
        if version.split(".")[0] != HINT_ACTION_MAJOR:
            continue
        payload = _field(action, "payload")
        if isinstance(payload, Mapping):
            hint = _named(payload.get("node"), payload.get("engine"))
            if hint is not None:
                return hint
    return None


def holder_hint(request: EngineRequest) -> Optional[HolderHint]:
    """The holder a router named for the request: the typed KV-hint envelope's
    ``peercache.holder`` action first (``Request.kv_hints`` where vLLM has it), else the
    ``kv_transfer_params`` fields — ``holder_node`` (one node id) wins over ``holder_engine``
    (an engine's node id base). None when nobody is named."""
    found = envelope_hint(getattr(request, "kv_hints", None))
    if found is not None:
        return found
    params = request.kv_transfer_params
    if not isinstance(params, Mapping):
        return None
    return _named(params.get(HINT_PARAM), params.get(ENGINE_HINT_PARAM))


class PlannedBlocks(Protocol):
    """Where the blocks sent for saving are noted for the connector's KV events (a
    :class:`peercache.vllm.events.StoredBlocks`)."""

    def planned(self, block_hashes: Sequence[bytes], parent: Optional[bytes], token_ids: Sequence[int],
                lora_id: Optional[int] = None, lora_name: Optional[str] = None) -> None: ...


class Directory(Protocol):
    """What the scheduler asks of the cluster (a :class:`peercache.core.PageStore`)."""

    def leading(self, keys: Sequence[str], hint: Optional[str] = None) -> int: ...


def hash_hex(h: object) -> str:
    """vLLM's block hash (bytes, or an int in older releases) as the page hash."""
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    return format(h, "x") if isinstance(h, int) else str(h)


@dataclass
class _ReqState:
    request: EngineRequest
    block_ids: List[int] = field(default_factory=list)
    saved_upto: int = 0          # blocks [0, saved_upto) are held by the cluster or the engine
    matched: Tuple[int, int] = (0, 0)  # (engine's own tokens, cluster tokens) at the last ask
    first_ask: float = 0.0
    pending_load: Optional[Tuple[int, int]] = None  # block range to load next step
    tail: Optional[Tuple[int, str]] = None  # (block index, page hash) of the prompt's partial tail
    tail_hit: bool = False     # the cluster's tail page was promised to vLLM (loaded, not saved)
    tail_done: bool = False    # the tail was published (or can no longer be)
    had_saves: bool = False    # a save was sent to the workers (they may still be running it)


class SchedulerSide:
    """Per-engine scheduler state; every method is called from vLLM's scheduler thread."""

    def __init__(self, directory: Optional[Directory], scheme: KeyScheme, block_size: int,
                 load: bool, save: bool, prefix_wait_s: float, tails: bool = True,
                 save_async: bool = True, load_async: bool = False,
                 events: Optional[PlannedBlocks] = None) -> None:
        self.directory = directory
        self.scheme = scheme
        self.block_size = block_size
        self.load = load and directory is not None
        self.save = save
        self.prefix_wait_s = prefix_wait_s
        self.tails = tails
        self.save_async = save_async
        self.load_async = load_async
        self.events = events
        self.reqs: Dict[str, _ReqState] = {}
        self._delayed: List[str] = []
        self._async_loads: List[str] = []  # requests whose load goes out with the next meta
        self.lookup_errors = 0
        self._last_error_log = 0.0

    def _state(self, request: EngineRequest) -> _ReqState:
        st = self.reqs.get(request.request_id)
        if st is None:
            st = _ReqState(request=request, first_ask=time.monotonic())
            self.reqs[request.request_id] = st
        st.request = request
        return st

    def _tail(self, st: _ReqState) -> Optional[Tuple[int, str]]:
        """The prompt's partial tail page: ``(block index, page hash)``, or None when it has
        none worth a page or its key could alias (LoRA, multimodal inputs, no token ids)."""
        if st.tail is not None or not self.tails:
            return st.tail
        r = st.request
        ids = r.prompt_token_ids
        if ids is None or r.lora_request is not None or r.mm_features:
            return None
        found = policy.prompt_tail(r.num_prompt_tokens, self.block_size, len(r.block_hashes))
        if found is None:
            return None
        index, _ = found
        st.tail = (index, policy.tail_hash(hash_hex(r.block_hashes[index - 1]),
                                           ids[index * self.block_size:r.num_prompt_tokens]))
        return st.tail

    def _page_hashes(self, st: _ReqState, a: int, b: int) -> List[str]:
        """Page hashes of blocks ``[a, b)``: full blocks by vLLM's hash, the tail by its own."""
        hashes = st.request.block_hashes
        out = [hash_hex(h) for h in hashes[a:min(b, len(hashes))]]
        if st.tail_hit and st.tail is not None and a <= st.tail[0] < b and len(out) == st.tail[0] - a:
            out.append(st.tail[1])
        return out

    def matched_tokens(self, request: EngineRequest, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        """``get_num_new_matched_tokens``: the tokens past ``num_computed_tokens`` whose blocks
        the cluster holds as one leading run, the prompt's partial tail included when every
        full block before it is held (then vLLM computes only the last prompt token). ``None``
        while a consumer waits for a prefix (``prefix_wait_s``). A lookup that fails is a miss
        (logged at most once a minute)."""
        st = self._state(request)
        st.matched = (num_computed_tokens, 0)
        st.tail_hit = False
        if not self.load or self.directory is None:
            return 0, False
        bs = self.block_size
        n = policy.loadable_blocks(request.num_tokens, bs, len(request.block_hashes))
        start = num_computed_tokens // bs
        # A fresh request's prompt is its whole sequence: its tail page can complete the hit.
        tail = self._tail(st) if request.num_tokens == request.num_prompt_tokens else None
        if tail is not None and (tail[0] != n or num_computed_tokens > n * bs):
            tail = None
        if n <= start and tail is None:
            return 0, False
        hashes = [hash_hex(h) for h in request.block_hashes[start:n]]
        if tail is not None:
            hashes.append(tail[1])
        try:
            # The scheduler asks about rank 0's pages: rank 0's holder answers.
            hint = holder_hint(request)
            held = self.directory.leading(self.scheme.keys(hashes), hint=hint.node_for(0) if hint else None)
        except Exception as e:  # a node down or a timeout: the engine computes
            self.lookup_errors += 1
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                logger.warning("peercache: lookup failed (%s); computing instead", e)
            return 0, False
        if held < len(hashes) and self.prefix_wait_s > 0 and time.monotonic() - st.first_ask < self.prefix_wait_s:
            return None, False  # a producer is still publishing this prefix: ask again
        if tail is not None and held == len(hashes):
            st.tail_hit = True
            tokens = request.num_prompt_tokens - 1 - num_computed_tokens
        else:
            tokens = policy.external_hit_tokens(start + min(held, max(0, n - start)), bs, num_computed_tokens)
        st.matched = (num_computed_tokens, tokens)
        return tokens, self.load_async and tokens > 0

    def after_alloc(self, request: EngineRequest, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """``update_state_after_alloc``: remembers the request's blocks; with external tokens,
        the block range to load in the next step. Blocks the engine or the cluster already
        holds are never published again."""
        st = self._state(request)
        st.block_ids = list(block_ids)
        local, _ = st.matched
        if num_external_tokens > 0:
            st.pending_load = policy.load_range(local, num_external_tokens, self.block_size)
            if self.load_async:
                # vLLM does not schedule the request until its load ended: the load goes
                # out with the next meta on its own.
                self._async_loads.append(request.request_id)
        else:
            st.tail_hit = False
        if st.tail_hit:
            st.tail_done = True  # the cluster holds it already
        st.saved_upto = max(st.saved_upto, (local + num_external_tokens) // self.block_size)

    def build_meta(self, new_reqs: Sequence[Tuple[str, Sequence[int], int]],
                   cached_reqs: Sequence[Tuple[str, Optional[Sequence[int]], bool, int]],
                   scheduled: Dict[str, int], finished: Sequence[str],
                   preempted: Sequence[str] = ()) -> PeerCacheMeta:
        """``build_connector_meta``. ``new_reqs``: (id, block ids, computed tokens);
        ``cached_reqs``: (id, new block ids or None, resumed, computed tokens); ``scheduled``:
        tokens scheduled per request this step; ``finished``: requests that ended;
        ``preempted``: requests whose blocks vLLM took back this step."""
        meta = PeerCacheMeta(delayed=self._delayed, preempted=list(preempted))
        self._delayed = []
        for req_id, block_ids, computed in new_reqs:
            st = self.reqs.get(req_id)
            if st is None:
                continue
            st.block_ids = list(block_ids)
            self._plan(meta, req_id, st, computed, scheduled.get(req_id, 0))
        for req_id, new_ids, resumed, computed in cached_reqs:
            st = self.reqs.get(req_id)
            if st is None:
                continue
            if resumed:
                st.block_ids = list(new_ids or [])
            elif new_ids:
                st.block_ids.extend(new_ids)
            self._plan(meta, req_id, st, computed, scheduled.get(req_id, 0))
        for req_id in self._async_loads:
            st = self.reqs.get(req_id)
            if st is not None and st.pending_load is not None:
                ios = self._load_io(req_id, st)
                if ios is not None:
                    meta.async_loads.append(ios)
        self._async_loads = []
        for req_id in finished:
            self.reqs.pop(req_id, None)
        return meta

    def _load_io(self, req_id: str, st: _ReqState) -> Optional[BlockIO]:
        """The request's pending load as one :class:`BlockIO` (None when it has no page)."""
        assert st.pending_load is not None
        a, b = st.pending_load
        st.pending_load = None
        b = min(b, len(st.block_ids))
        page_hashes = self._page_hashes(st, a, b)
        if not page_hashes:
            return None
        hint = holder_hint(st.request)
        return BlockIO(req_id, page_hashes, list(st.block_ids[a:a + len(page_hashes)]),
                       hint=hint.name if hint else None, hint_per_rank=bool(hint and hint.per_rank))

    def _plan(self, meta: PeerCacheMeta, req_id: str, st: _ReqState, computed: int, scheduled: int) -> None:
        hashes = st.request.block_hashes
        if computed < st.saved_upto * self.block_size:
            # The engine recomputes blocks it had (a failed load, a preemption): what it
            # computes now was never published.
            st.saved_upto = computed // self.block_size
        tokens_done = computed + scheduled
        if st.pending_load is not None and req_id not in self._async_loads:
            ios = self._load_io(req_id, st)
            if ios is not None:
                meta.loads.append(ios)
        if not self.save:
            return
        a, b = policy.new_full_blocks(st.saved_upto, tokens_done, self.block_size, len(hashes))
        b = min(b, len(st.block_ids))
        if b > a:
            meta.saves.append(BlockIO(req_id, [hash_hex(h) for h in hashes[a:b]], list(st.block_ids[a:b])))
            st.saved_upto = b
            st.had_saves = True
            if self.events is not None and isinstance(hashes[a], (bytes, bytearray)):
                bs = self.block_size
                self.events.planned([bytes(h) for h in hashes[a:b]], bytes(hashes[a - 1]) if a > 0 else None,
                                    st.request.all_token_ids[a * bs:b * bs])
        if not st.tail_done and tokens_done >= st.request.num_prompt_tokens:
            # The step that writes the prompt's last rows publishes its partial tail block.
            st.tail_done = True
            tail = self._tail(st)
            if tail is not None and tail[0] < len(st.block_ids):
                meta.saves.append(BlockIO(req_id, [tail[1]], [st.block_ids[tail[0]]]))
                st.had_saves = True

    def finished(self, req_id: str) -> bool:
        """``request_finished``: the request's state goes. True when its saves may still be
        running on the workers: vLLM then keeps its blocks until they report it done."""
        st = self.reqs.pop(req_id, None)
        if st is None or not (st.had_saves and self.save_async):
            return False
        self._delayed.append(req_id)
        return True

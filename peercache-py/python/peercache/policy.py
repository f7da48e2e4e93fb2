"""Pure page policy shared by the engine adapters: which pages to load, which to publish.
No sockets, no engine objects; ``peercache-py/tests/test_policy.py`` drives every function.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Iterable, Optional, Sequence, Set, Tuple


def leading(flags: Iterable[bool]) -> int:
    """The length of the leading run of true flags."""
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


def loadable_blocks(num_prompt_tokens: int, block_size: int, num_hashes: int) -> int:
    """Full blocks of a prompt an engine may load rather than compute: the last prompt token is
    always computed (the engine needs its logits), so a prompt of exactly ``k`` blocks loads at
    most ``k - 1``; never more than the blocks that have a hash."""
    if block_size <= 0 or num_prompt_tokens <= 1:
        return 0
    return max(0, min((num_prompt_tokens - 1) // block_size, num_hashes))


def external_hit_tokens(hit_blocks: int, block_size: int, num_computed_tokens: int) -> int:
    """Tokens a connector can supply beyond what the engine already has: the cluster's leading
    run of ``hit_blocks`` blocks, minus the ``num_computed_tokens`` the engine's own prefix
    cache holds; 0 when the cluster holds no more than that."""
    return max(0, hit_blocks * block_size - num_computed_tokens)


def load_range(num_computed_tokens: int, num_external_tokens: int, block_size: int) -> Tuple[int, int]:
    """Block indices ``[start, end)`` a load fills: from the first block the engine does not
    hold to the block holding the external hit's last token (a hit that ends inside a block,
    a partial tail, loads that block too)."""
    start = num_computed_tokens // block_size
    end = -(-(num_computed_tokens + num_external_tokens) // block_size)
    return start, max(start, end)


def tail_hash(parent_hash: str, tail_tokens: Sequence[int]) -> str:
    """The page hash of a prompt's partial last block: the hash of the full block before it
    (which chains every earlier token, the cache salt and LoRA) and the tail's own token ids.
    The same on every process and host (SHA-256, no seed); ``t`` + 32 hex digits, so it never
    equals an engine's full-block hash."""
    h = hashlib.sha256(b"peercache-tail\0")
    h.update(parent_hash.encode())
    h.update(b"\0")
    h.update(array("q", tail_tokens).tobytes())
    return "t" + h.hexdigest()[:32]


def prompt_tail(num_prompt_tokens: int, block_size: int, num_hashes: int) -> Optional[Tuple[int, int]]:
    """``(block index, tokens)`` of a prompt's partial last block when it is worth a page of
    its own: it follows at least one full hashed block (whose hash keys it) and holds at least
    2 tokens (a 1-token tail gains nothing: the engine computes the last prompt token anyway).
    None otherwise."""
    if block_size <= 0:
        return None
    full = num_prompt_tokens // block_size
    tokens = num_prompt_tokens - full * block_size
    if full < 1 or tokens < 2 or num_hashes < full:
        return None
    return full, tokens


def new_full_blocks(saved_upto: int, tokens_done: int, block_size: int, num_hashes: int) -> Tuple[int, int]:
    """Block indices ``[saved_upto, end)`` that became full (and hashed) and are not yet
    published, once ``tokens_done`` tokens of the request have KV."""
    end = min(tokens_done // block_size, num_hashes)
    return saved_upto, max(saved_upto, end)


def leading_groups_cover(present: Sequence[bool], group: int, block: int) -> int:
    """Pages covered by the leading complete key groups of a ``block_groups`` pool: group ``g``
    is the ``group`` keys starting at page ``g * block``; the cover is ``block`` pages per
    complete group, from the span start, up to the span's length."""
    n = len(present)
    group, block = max(1, group), max(1, block)
    g = 0
    while g * block + group <= n and all(present[g * block:g * block + group]):
        g += 1
    return min(n, g * block)


def trailing_restorable(present: Sequence[bool], kv_pages: int, window: int) -> Set[int]:
    """Prefix lengths ``p`` (1..``kv_pages``) a ``trailing_pages`` pool can restore: the
    ``window`` pages ending at ``p`` are all present (a sliding-window layer reads no more)."""
    window = max(1, window)
    ok: Set[int] = set()
    missing = 0  # missing pages in the window ending at p
    for p in range(1, kv_pages + 1):
        missing += not present[p - 1]
        if p - window - 1 >= 0:
            missing -= not present[p - window - 1]
        if missing == 0:
            ok.add(p)
    return ok

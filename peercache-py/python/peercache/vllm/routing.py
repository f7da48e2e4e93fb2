"""What a router needs to ask PeerCache about a vLLM request before sending it anywhere: the
page keys the connector of an engine will use for the prompt's token ids.

A key is ``<namespace>|<block hash>`` (docs/vllm.md, "What a key is"). The block hashes are
vLLM's own, computed here with vLLM's own functions (``hash_block_tokens`` over the root hash
vLLM derives for the algorithm), so a router process with vLLM installed agrees with every
engine that uses the same ``--prefix-caching-hash-algo`` and ``PYTHONHASHSEED``. The namespace
is the one each engine's connector logs at start (``layout vllm-…``), or
:func:`namespace` of the engine's :class:`~peercache.vllm.config.Layout`.

With the keys, a router asks any node ``POST /prefix`` (or follows the nodes' KV events with
:class:`peercache.router.ClusterView`), picks the node holding the longest leading run, and
sends the request to that node's engine, or names the node in the request's
``kv_transfer_params`` (``{"holder_node": …}``) so the engine that serves it reads from there
without a directory lookup::

    from peercache.vllm.routing import RequestKeys

    keys = RequestKeys("vllm-0123456789abcdef", block_size=32)
    page_keys = keys.keys(prompt_token_ids)     # one per full block, in order

Only plain token prompts map this way: a request with a LoRA, multimodal inputs or prompt
embeddings has extra hash inputs a router does not see. A prompt's partial last block (its tail
page) is left out: the leading run of full blocks is what routing needs.
"""

from __future__ import annotations

import os
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..core import KeyScheme
from .config import ConfigError, Layout, check_hash_algo

HashFn = Callable[[object], bytes]


def namespace(layout: Layout) -> str:
    """The key namespace of the engine rank whose blocks have ``layout``: what its connector
    logs at start, ``vllm-<layout fingerprint>``."""
    return f"vllm-{layout.fingerprint()}"


def _vllm_hashing(hash_algo: str, env: Mapping[str, str]) -> Tuple[HashFn, bytes]:
    """vLLM's hash function named ``hash_algo`` and the root hash its engines chain the first
    block to (derived from ``PYTHONHASHSEED`` when set, else vLLM's fixed default)."""
    check_hash_algo(hash_algo, env)
    try:
        from vllm.utils.hashing import get_hash_fn_by_name  # noqa: PLC0415
        from vllm.v1.core import kv_cache_utils  # noqa: PLC0415
    except ImportError as e:
        raise ConfigError(f"peercache: computing vLLM block hashes needs vLLM installed ({e})") from None
    try:
        fn: HashFn = get_hash_fn_by_name(hash_algo)
    except ValueError as e:
        raise ConfigError(f"peercache: prefix hash algorithm {hash_algo!r}: {e}") from None
    # The same seed rule as the engine's `init_none_hash`, without changing this process's own.
    root = bytes(fn(kv_cache_utils.resolve_none_hash_seed(fn)))
    return fn, root


def block_hashes(token_ids: Sequence[int], block_size: int, hash_algo: str = "sha256",
                 cache_salt: Optional[str] = None, env: Optional[Mapping[str, str]] = None) -> List[bytes]:
    """vLLM's block hash of every full block of ``token_ids`` (``request.block_hashes`` of a
    plain token prompt), chained from the first block. ``cache_salt`` is the request's salt
    (it enters the first block's hash). Raises :class:`ConfigError` for a block size below 1,
    an unknown algorithm, or a non-cryptographic one without a shared ``PYTHONHASHSEED``
    (its root hash is random per process, so no router could agree with an engine)."""
    if block_size < 1:
        raise ConfigError(f"peercache: block_size = {block_size}: expected 1 or more")
    from vllm.v1.core.kv_cache_utils import hash_block_tokens  # noqa: PLC0415

    fn, parent = _vllm_hashing(hash_algo, os.environ if env is None else env)
    out: List[bytes] = []
    for i in range(len(token_ids) // block_size):
        extra = (("cache_salt", cache_salt),) if i == 0 and cache_salt else None
        h = bytes(hash_block_tokens(fn, parent, list(token_ids[i * block_size:(i + 1) * block_size]), extra))
        out.append(h)
        parent = h
    return out


class RequestKeys:
    """The page keys an engine's connector uses for a prompt: ``namespace`` is that engine's
    (its start-up log line, or :func:`namespace`), ``block_size`` and ``hash_algo`` its
    ``--block-size`` and ``--prefix-caching-hash-algo``."""

    def __init__(self, namespace: str, block_size: int, hash_algo: str = "sha256") -> None:
        if not namespace:
            raise ConfigError("peercache: an empty namespace names no engine's pages")
        if block_size < 1:
            raise ConfigError(f"peercache: block_size = {block_size}: expected 1 or more")
        self.scheme = KeyScheme(namespace)
        self.block_size = block_size
        self.hash_algo = hash_algo

    def keys(self, token_ids: Sequence[int], cache_salt: Optional[str] = None) -> List[str]:
        """One key per full block of ``token_ids``, in order (see :func:`block_hashes`)."""
        hashes = block_hashes(token_ids, self.block_size, self.hash_algo, cache_salt)
        return self.scheme.keys([h.hex() for h in hashes])

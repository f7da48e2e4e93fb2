"""PeerCache: a decentralized peer-to-peer KV-cache store for LLM inference.

``peercache.PageStore`` (``peercache.core``) is the page store every engine adapter sits on:
``peercache.PeerCacheStore`` (``peercache.store``) is an SGLang HiCache L3 storage backend,
``peercache.linker.PeerCacheLinker`` SGLang's direct linker, and
``peercache.vllm.PeerCacheConnector`` a vLLM KV connector. ``peercache.Node`` is the Rust node
underneath; ``peercache.Client`` talks to a running node's client API (``client_enabled``) from
a process that does not run a node. ``peercache.page_hash(key)`` is the block hash a node's KV
events (docs/operations.md, "KV events"; ``peercache.router`` follows them) carry for a key; ``peercache.read_only_token(secret)`` the token a
``Client`` that may only read proves instead of the secret.

Errors: a bad argument raises ``ValueError``; a failure of the cluster raises a
``PeerCacheError`` (a ``RuntimeError``) of its kind — ``DirectoryError``, ``TransportError``,
``DiscoveryError`` or ``ShutdownError``.
"""

from ._peercache import (
    Client,
    DirectoryError,
    DiscoveryError,
    Node,
    PeerCacheError,
    ShutdownError,
    TransportError,
    __version__,
    page_hash,
    read_only_token,
)
from .core import PageStore
from .store import PeerCacheStore

__all__ = [
    "Client", "DirectoryError", "DiscoveryError", "Node", "PageStore", "PeerCacheError",
    "PeerCacheStore", "ShutdownError", "TransportError", "__version__", "page_hash", "read_only_token",
]

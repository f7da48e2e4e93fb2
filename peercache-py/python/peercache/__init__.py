"""PeerCache: a decentralized peer-to-peer KV-cache store for LLM inference.

``peercache.PeerCacheStore`` (also ``peercache.store.PeerCacheStore``) is an SGLang HiCache L3
storage backend; ``peercache.Node`` is the Rust node underneath; ``peercache.Client`` talks to a
running node's client API (``client_enabled``) from a process that does not run a node.
"""

from ._peercache import Client, Node, __version__
from .store import PeerCacheStore

__all__ = ["Client", "Node", "PeerCacheStore", "__version__"]

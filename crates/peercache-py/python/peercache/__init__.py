"""PeerCache: a decentralized peer-to-peer KV-cache store for LLM inference.

``peercache.PeerCacheStore`` (also ``peercache.store.PeerCacheStore``) is an SGLang HiCache L3
storage backend; ``peercache.Node`` is the Rust node underneath.
"""

from ._peercache import Node, __version__
from .store import PeerCacheStore

__all__ = ["Node", "PeerCacheStore", "__version__"]

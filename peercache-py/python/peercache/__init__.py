"""PeerCache: a decentralized peer-to-peer KV-cache store for LLM inference.

``peercache.PageStore`` (``peercache.core``) is the page store every engine adapter sits on:
``peercache.PeerCacheStore`` (``peercache.store``) is an SGLang HiCache L3 storage backend,
``peercache.linker.PeerCacheLinker`` SGLang's direct linker, and
``peercache.vllm.PeerCacheConnector`` a vLLM KV connector. ``peercache.Node`` is the Rust node
underneath; ``peercache.Client`` talks to a running node's client API (``client_enabled``) from
a process that does not run a node.
"""

from ._peercache import Client, Node, __version__
from .core import PageStore
from .store import PeerCacheStore

__all__ = ["Client", "Node", "PageStore", "PeerCacheStore", "__version__"]

"""PeerCache as a vLLM KV connector.

Load it by module path::

    --kv-transfer-config '{"kv_connector": "PeerCacheConnector",
        "kv_connector_module_path": "peercache.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"discovery_addr": "10.0.0.1:31998"}}'

or, with the wheel installed, by name alone (the ``vllm.general_plugins`` entry point
``peercache`` registers it). docs/vllm.md lists every key.
"""

from __future__ import annotations

__all__ = ["PeerCacheConnector", "register"]


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers ``PeerCacheConnector`` by name with
    vLLM's connector factory (lazily: the module loads when a config names it)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: PLC0415

    if "PeerCacheConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("PeerCacheConnector", "peercache.vllm.connector", "PeerCacheConnector")


def __getattr__(name: str) -> object:
    # `kv_connector_module_path = "peercache.vllm"` makes vLLM read `PeerCacheConnector` here;
    # importing it lazily keeps `import peercache.vllm` cheap and vLLM-free until then.
    if name == "PeerCacheConnector":
        from .connector import PeerCacheConnector  # noqa: PLC0415

        return PeerCacheConnector
    raise AttributeError(name)

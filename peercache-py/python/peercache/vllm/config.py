"""What the vLLM connector reads from ``kv_connector_extra_config`` and vLLM's own config:
the node config of each side, the connector's own knobs, and the layout fingerprint that keys
every page. Pure functions over plain values; ``test_vllm_config.py`` drives them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from ..core import ConfigValue, as_bool, layout_fingerprint

# Connector keys; every other key of `kv_connector_extra_config` is a node config key
# (docs/configuration.md), passed through as the SGLang backend does.
CONNECTOR_KEYS = ("model_name", "prefix_wait_s", "load", "save", "scheduler_pool_size", "save_async",
                  "load_async", "tail_pages", "kv_staging", "staging_size", "kv_gpudirect")

STAGING_MODES = ("auto", "always", "never")
GPUDIRECT_MODES = ("off", "peermem")

# vLLM's non-cryptographic prefix hashes: their root is random per process unless
# PYTHONHASHSEED is shared, so two engines would never agree on a block hash.
NON_CRYPTO_HASHES = ("xxhash", "xxhash_cbor")


class ConfigError(ValueError):
    """A connector setting that cannot work, with the fix in its message."""


@dataclass(frozen=True)
class ConnectorSettings:
    """The connector's own settings."""

    load: bool
    save: bool
    prefix_wait_s: float
    model_name: Optional[str]
    scheduler_pool_size: str
    save_async: bool = True
    tails: bool = True
    load_async: bool = False
    staging: str = "auto"
    staging_bytes: int = 256 << 20
    gpudirect: str = "off"


def parse_bytes(v: object, name: str) -> int:
    """A byte count: an integer, or a string with an optional ``kb``/``mb``/``gb`` suffix
    (powers of 1024, as the node's sizes)."""
    units = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "b": 1}
    text = str(v).strip().lower()
    mult = 1
    for suffix, m in units.items():
        if text.endswith(suffix):
            text, mult = text[:-len(suffix)].strip(), m
            break
    try:
        n = int(text) * mult
    except ValueError:
        raise ConfigError(f"peercache: {name} = {v!r}: expected bytes, like 256mb") from None
    if n <= 0:
        raise ConfigError(f"peercache: {name} = {v!r}: expected more than 0 bytes")
    return n


def settings(extra: Mapping[str, object], kv_role: str) -> ConnectorSettings:
    """The connector settings from ``extra`` and the engine's ``kv_role``: a ``kv_producer``
    saves and does not load, a ``kv_consumer`` loads and does not save, ``kv_both`` does both
    (``load``/``save`` override)."""
    if kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise ConfigError(f"peercache: kv_role = {kv_role!r}: expected kv_producer, kv_consumer or kv_both")
    load = as_bool(extra.get("load", kv_role != "kv_producer"), "load")
    save = as_bool(extra.get("save", kv_role != "kv_consumer"), "save")
    raw_wait = extra.get("prefix_wait_s", 0.0)
    try:
        wait = float(raw_wait)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"peercache: prefix_wait_s = {raw_wait!r}: expected seconds") from None
    if not 0.0 <= wait <= 3600.0:
        raise ConfigError(f"peercache: prefix_wait_s = {wait}: expected 0..3600 seconds")
    name = extra.get("model_name")
    staging = str(extra.get("kv_staging", "auto"))
    if staging not in STAGING_MODES:
        raise ConfigError(f"peercache: kv_staging = {staging!r}: expected auto, always or never")
    gpudirect = str(extra.get("kv_gpudirect", "off"))
    if gpudirect not in GPUDIRECT_MODES:
        raise ConfigError(f"peercache: kv_gpudirect = {gpudirect!r}: expected off or peermem")
    return ConnectorSettings(load=load, save=save, prefix_wait_s=wait,
                             model_name=str(name) if name else None,
                             scheduler_pool_size=str(extra.get("scheduler_pool_size", "16mb")),
                             save_async=as_bool(extra.get("save_async", True), "save_async"),
                             tails=as_bool(extra.get("tail_pages", True), "tail_pages"),
                             load_async=as_bool(extra.get("load_async", False), "load_async"),
                             staging=staging,
                             staging_bytes=parse_bytes(extra.get("staging_size", "256mb"), "staging_size"),
                             gpudirect=gpudirect)


def check_hash_algo(algo: str, env: Mapping[str, str] = os.environ) -> None:
    """Refuses a prefix hash that two processes cannot agree on: a non-cryptographic one
    (``xxhash``) without a shared ``PYTHONHASHSEED``."""
    if algo in NON_CRYPTO_HASHES and env.get("PYTHONHASHSEED") is None:
        raise ConfigError(
            f"peercache: --prefix-caching-hash-algo {algo} draws a random root hash per process, so "
            "no other engine could find this one's pages: set the same PYTHONHASHSEED in every "
            "engine's environment, or use sha256 (the default)")


def node_configs(extra: Mapping[str, object], engine_id: str, rank: int) -> Tuple[Dict[str, ConfigValue], Dict[str, ConfigValue]]:
    """The node configs of the scheduler side and of worker ``rank``: the extra config's node
    keys, each node with its own ``node_id`` (``<node_id>-sched`` and ``<node_id>-r<rank>``; the
    base is ``vllm-<engine id>`` unless ``node_id`` is set). The scheduler's node only asks the
    directory: a small pool, no metrics port of its own, no client API."""
    node: Dict[str, ConfigValue] = {}
    for k, v in extra.items():
        if k in CONNECTOR_KEYS:
            continue
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise ConfigError(f"peercache: {k} = {v!r}: expected a string, number or boolean")
        node[k] = v
    base = str(node.pop("node_id", "") or f"vllm-{engine_id[:12]}")
    sched = dict(node)
    sched.update({"node_id": f"{base}-sched",
                  "global_segment_size": str(extra.get("scheduler_pool_size", "16mb")),
                  "metrics_enabled": False, "client_enabled": False, "disk_enabled": False})
    worker = dict(node)
    worker["node_id"] = f"{base}-r{rank}"
    return sched, worker


@dataclass(frozen=True)
class Layout:
    """The shape of one engine rank's KV blocks: everything that must match for a block saved
    by one engine to be loaded by another."""

    model: str
    dtype: str
    block_size: int
    num_kv_heads: int
    head_size: int
    num_layers: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    hash_algo: str
    # The platform's device type: a CPU engine's blocks and a CUDA engine's are laid out
    # differently, so their pages never meet.
    device: str = "cpu"

    def fingerprint(self) -> str:
        """A 16-hex-digit tag of every field."""
        return layout_fingerprint(self.__dict__)

"""PeerCacheStore against the real SGLang 0.5.23 classes (CPU only): the `dynamic` backend
factory, HiCacheStorageConfig as SGLang builds it, real device and host KV pools in every
layout, and byte-exact round trips through get_page_buffer_meta between two nodes.

Run by scripts/sglang-contract.sh in a venv that has sglang installed; skipped (loudly) without.
"""

import ctypes
import os
import socket

import pytest

torch = pytest.importorskip("torch", reason="the SGLang contract venv (scripts/sglang-contract.sh)")
pytest.importorskip("sglang", reason="the SGLang contract venv (scripts/sglang-contract.sh)")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from peercache.store import PeerCacheStore  # noqa: E402

PAGE = 4
LAYERS = 3
TOKENS = 256


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def extra(n: int, seed: int, port: int) -> dict:
    host = f"127.0.0.{n}"
    return {
        # What SGLang passes through for a dynamic backend ...
        "backend_name": "peercache",
        "module_path": "peercache.store",
        "class_name": "PeerCacheStore",
        "interface_v1": 1,
        # ... and PeerCache's own settings.
        "discovery_addr": f"127.0.0.{seed}:{port}",
        "protocol": "tcp",
        "local_hostname": host, "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
        "global_segment_size": "32mb",
        "heartbeat_interval": 0.2, "member_ttl": 0.6, "op_timeout": 1.0,
        "metrics_enabled": False, "startup_timeout": 10,
    }


def config(extra_config: dict, tp_rank=0, tp_size=1, mla=False, page_first=True) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
        attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=True, is_page_first_layout=page_first,
        model_name="toy-model", extra_config=extra_config,
    )


def mha_host(layout: str) -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.float16, head_num=2,
                           head_dim=8, layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), host_to_device_ratio=2.0, host_size=0,
                                page_size=PAGE, layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def mla_host(layout: str) -> MLATokenToKVPoolHost:
    dev = MLATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.float16, kv_lora_rank=16,
                           qk_rope_head_dim=8, layer_num=LAYERS, device="cpu",
                           enable_memory_saver=False)
    return MLATokenToKVPoolHost(dev._mla_buffer_info(), host_to_device_ratio=2.0, host_size=0,
                                page_size=PAGE, layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS,
                                target_layer_num=LAYERS)


def page_bytes(host, first_token: int) -> bytes:
    """Every byte of the page starting at `first_token`, through SGLang's own pointer table."""
    ptrs, sizes = host.get_page_buffer_meta(torch.arange(first_token, first_token + PAGE))
    return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


def fill(host, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    flat = host.kv_buffer.view(torch.uint8).reshape(-1)
    flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))


def make(n, seed, port, **kw):
    cfg = config(extra(n, seed, port), **kw)
    backend = StorageBackendFactory.create_backend("dynamic", cfg, None)
    return backend


def test_the_factory_builds_peercache_by_module_path():
    port = free_port()
    b = make(60, 60, port)
    try:
        assert isinstance(b, PeerCacheStore)
        assert isinstance(b, HiCacheStorage)
        # The v1 zero-copy methods are really overridden (SGLang's defaults return None).
        assert PeerCacheStore.batch_get_v1 is not HiCacheStorage.batch_get_v1
        assert PeerCacheStore.batch_set_v1 is not HiCacheStorage.batch_set_v1
    finally:
        b.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_mha_round_trip_is_byte_exact_across_nodes(layout):
    port = free_port()
    a, b = make(61, 61, port, page_first=layout == "page_first"), make(62, 61, port, page_first=layout == "page_first")
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        ha, hb = mha_host(layout), mha_host(layout)
        a.register_mem_pool_host(ha)
        b.register_mem_pool_host(hb)
        fill(ha, 1)
        keys = [f"{layout}-hash-{i}" for i in range(5)]
        src = torch.arange(0, 5 * PAGE)
        assert a.batch_set_v1(keys, src) == [True] * 5
        assert b.batch_exists(keys) == 5
        dst = torch.arange(16 * PAGE, 21 * PAGE)
        assert b.batch_get_v1(keys, dst) == [True] * 5
        for i in range(5):
            assert page_bytes(hb, 16 * PAGE + i * PAGE) == page_bytes(ha, i * PAGE), f"page {i}"
        stats = b.get_stats()
        from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: PLC0415

        assert isinstance(stats, StorageMetrics)
    finally:
        a.close()
        b.close()


def test_a_hole_cuts_the_leading_count_with_real_pools():
    port = free_port()
    a, b = make(63, 63, port), make(64, 63, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        ha, hb = mha_host("page_first"), mha_host("page_first")
        a.register_mem_pool_host(ha)
        b.register_mem_pool_host(hb)
        fill(ha, 2)
        keys = [f"chain-{i}" for i in range(5)]
        for i in (0, 1, 3, 4):
            assert a.batch_set_v1([keys[i]], torch.arange(i * PAGE, (i + 1) * PAGE)) == [True]
        assert b.batch_exists(keys) == 2
        assert b.batch_get_v1(keys, torch.arange(0, 5 * PAGE)) == [True, True, False, True, True]
    finally:
        a.close()
        b.close()


def test_a_host_pool_group_resolves_to_its_anchor():
    # DeepSeek-V4-style registration: SGLang hands the backend a HostPoolGroup, whose anchor
    # pool carries the page geometry (the group itself has no get_page_buffer_meta).
    from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: PLC0415
    from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: PLC0415

    port = free_port()
    a, b = make(69, 69, port), make(70, 69, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        groups = []
        for backend in (a, b):
            host = mha_host("page_first")
            group = HostPoolGroup([PoolEntry(name=PoolName.KV, host_pool=host, device_pool=None,
                                             layer_mapper=lambda l: l, is_primary_index_anchor=True)])
            backend.register_mem_pool_host(group)
            groups.append(host)
        fill(groups[0], 5)
        keys = [f"group-{i}" for i in range(3)]
        assert a.batch_set_v1(keys, torch.arange(0, 3 * PAGE)) == [True] * 3
        assert b.batch_get_v1(keys, torch.arange(4 * PAGE, 7 * PAGE)) == [True] * 3
        for i in range(3):
            assert page_bytes(groups[1], 4 * PAGE + i * PAGE) == page_bytes(groups[0], i * PAGE)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "page_first_direct"])
def test_mla_rank_one_reads_what_rank_zero_wrote(layout):
    port = free_port()
    r0 = make(65, 65, port, tp_rank=0, tp_size=2, mla=True)
    r1 = make(66, 65, port, tp_rank=1, tp_size=2, mla=True)
    try:
        assert r0.core.wait_members(2, 10) and r1.core.wait_members(2, 10)
        h0, h1 = mla_host(layout), mla_host(layout)
        r0.register_mem_pool_host(h0)
        r1.register_mem_pool_host(h1)
        fill(h0, 3)
        keys = [f"mla-{layout}-{i}" for i in range(4)]
        assert r0.batch_set_v1(keys, torch.arange(0, 4 * PAGE)) == [True] * 4
        assert r1.batch_exists(keys) == 4
        assert r1.batch_get_v1(keys, torch.arange(8 * PAGE, 12 * PAGE)) == [True] * 4
        for i in range(4):
            assert page_bytes(h1, 8 * PAGE + i * PAGE) == page_bytes(h0, i * PAGE)
    finally:
        r0.close()
        r1.close()


def test_under_sglangs_failure_injector_every_reported_hit_is_byte_exact(monkeypatch):
    # SGLang's own test wrapper fails calls at random (SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE);
    # whatever it lets through must still be right, page by page.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageFailureInjector  # noqa: PLC0415

    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    port = free_port()
    a, b = make(67, 67, port), make(68, 67, port)
    try:
        assert isinstance(a, HiCacheStorageFailureInjector)
        ha, hb = mha_host("page_first"), mha_host("page_first")
        a.register_mem_pool_host(ha)
        b.register_mem_pool_host(hb)
        fill(ha, 4)
        outcomes = []
        for r in range(20):
            keys = [f"inj-{r}-{i}" for i in range(4)]
            a.batch_set_v1(keys, torch.arange(0, 4 * PAGE))
            got = b.batch_get_v1(keys, torch.arange(20 * PAGE, 24 * PAGE))
            outcomes.extend(bool(x) for x in (got or [False] * 4))
            for i, ok in enumerate(got or []):
                if ok:
                    assert page_bytes(hb, 20 * PAGE + i * PAGE) == page_bytes(ha, i * PAGE)
        assert any(outcomes) and not all(outcomes), "the injector should both fail and pass calls"
    finally:
        a.close()
        b.close()

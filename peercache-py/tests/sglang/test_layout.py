"""A page knows its shape: SGLang deployments of one model sharing one PeerCache cluster under
the same keys — bf16, fp16 and fp8 KV caches; MHA at TP 2 and at TP 4 — never
read each other's pages, with SGLang's real host pools. The layout comes from the registered
pools alone (no configuration), mismatches are counted, and each deployment keeps hitting its
own pages.

Run by scripts/sglang-contract.sh.
"""

import pytest

torch = pytest.importorskip("torch", reason="the SGLang contract venv (scripts/sglang-contract.sh)")
pytest.importorskip("sglang", reason="the SGLang contract venv (scripts/sglang-contract.sh)")

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

from peercache.core import Segments  # noqa: E402
from test_contract import LAYERS, PAGE, TOKENS, config, extra, fill, free_port, page_bytes  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402


def host(dtype, heads=2, layout="page_first") -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=dtype, head_num=heads,
                           head_dim=8, layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), host_to_device_ratio=2.0, host_size=0,
                                page_size=PAGE, layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def make(n, seed, port, kv_cache_dtype=None, **kw):
    e = extra(n, seed, port)
    if kv_cache_dtype is not None:
        e["kv_cache_dtype"] = kv_cache_dtype
    return StorageBackendFactory.create_backend("dynamic", config(e, **kw), None)


def test_bf16_fp16_and_fp8_deployments_never_read_each_others_pages():
    """bf16 and fp16 pages have the same size, so only the layout tells them apart (each
    refusal counted); an fp8 page is half the size and refused before any byte moves."""
    port = free_port()
    bf16_w, bf16_r = make(100, 100, port), make(101, 100, port)
    fp16_w, fp16_r = make(102, 100, port), make(103, 100, port)
    fp8_r = make(104, 100, port, "fp8_e4m3")
    stores = [bf16_w, bf16_r, fp16_w, fp16_r, fp8_r]
    try:
        for s in stores:
            assert s.core.wait_members(5, 10)
        hosts = [host(torch.bfloat16), host(torch.bfloat16), host(torch.float16),
                 host(torch.float16), host(torch.float8_e4m3fn)]
        for s, h in zip(stores, hosts):
            s.register_mem_pool_host(h)
            s.on_host_pools_registered()
        spec = bf16_w.layout_spec()
        assert spec["kv_dtype"] == "torch.bfloat16" and spec["tp"] == [0, 1], spec
        assert fp16_w.layout_spec()["pools"] == spec["pools"], "same geometry, another dtype"
        # SGLang's host pool stores fp8 as uint8; the deployment's kv_cache_dtype names it.
        assert fp8_r.layout_spec()["kv_dtype"] == "fp8_e4m3"
        assert fp8_r.layout_spec()["pools"][0]["bytes_per_page"] * 2 == spec["pools"][0]["bytes_per_page"]
        layouts = [s.stats()["layout"] for s in stores]
        assert layouts[0] == layouts[1] != layouts[2] == layouts[3] != layouts[4], layouts

        fill(hosts[0], 1)
        fill(hosts[2], 2)
        keys = [f"shared-prompt-{i}" for i in range(4)]
        src, dst = torch.arange(0, 4 * PAGE), torch.arange(16 * PAGE, 20 * PAGE)
        # bf16 writes; fp16 and fp8 get no page, their pools untouched. The directory keeps
        # each owner's layout, so their batch_exists does not count bf16 pages either (no
        # prefetch SGLang would plan and the get refuse).
        assert bf16_w.batch_set_v1(keys, src) == [True] * 4
        assert bf16_r.batch_exists(keys) == 4
        assert fp16_r.batch_exists(keys) == 0 and fp8_r.batch_exists(keys) == 0
        for s, h in ((fp16_r, hosts[3]), (fp8_r, hosts[4])):
            before = [page_bytes(h, 16 * PAGE + i * PAGE) for i in range(4)]
            assert s.batch_get_v1(keys, dst) == [False] * 4
            assert [page_bytes(h, 16 * PAGE + i * PAGE) for i in range(4)] == before
        assert fp16_r.stats()["layout_mismatches"] == 4, "same size: the layout refused each"
        # fp16 writes the same keys; each deployment reads its own bytes.
        assert fp16_w.batch_set_v1(keys, src) == [True] * 4
        assert fp16_r.batch_exists(keys) == 4 and fp8_r.batch_exists(keys) == 0
        assert fp16_r.batch_get_v1(keys, dst) == [True] * 4
        assert bf16_r.batch_get_v1(keys, dst) == [True] * 4
        for i in range(4):
            assert page_bytes(hosts[3], 16 * PAGE + i * PAGE) == page_bytes(hosts[2], i * PAGE)
            assert page_bytes(hosts[1], 16 * PAGE + i * PAGE) == page_bytes(hosts[0], i * PAGE)
    finally:
        for s in stores:
            s.close()


def test_mha_tp2_and_tp4_rank_zero_are_different_layouts():
    """TP 2 rank 0 and TP 4 rank 0 name their pages alike once the key scheme is the same
    (as across two deployments sharing a model name and a prefix); the layout tells them apart:
    a TP 4 rank holds half the heads per page a TP 2 rank holds."""
    port = free_port()
    tp2 = make(104, 104, port, tp_rank=0, tp_size=2)
    tp4 = make(105, 104, port, tp_rank=0, tp_size=4)
    try:
        for s in (tp2, tp4):
            assert s.core.wait_members(2, 10)
        h2, h4 = host(torch.bfloat16, heads=4), host(torch.bfloat16, heads=2)
        tp2.register_mem_pool_host(h2)
        tp4.register_mem_pool_host(h4)
        assert tp2.layout_spec()["tp"] == [0, 2] and tp4.layout_spec()["tp"] == [0, 4]
        assert tp2.stats()["layout"] != tp4.stats()["layout"]
        fill(h4, 3)
        keys = [f"tp-page-{i}" for i in range(3)]
        # Write under the raw node keys both ranks compute alike, to show the layout (not the
        # key scheme) is what refuses the page.
        ptrs, sizes = h4.get_page_buffer_meta(torch.arange(0, 3 * PAGE))
        assert tp4.core.put(keys, Segments(list(map(int, ptrs)), list(map(int, sizes)),
                                           [len(ptrs) // 3] * 3)) == [True] * 3
        # tp2 asks for pages of exactly that length, into memory of its own: refused.
        out = torch.zeros(sum(map(int, sizes)), dtype=torch.uint8)
        offs, at = [], out.data_ptr()
        for z in sizes:
            offs.append(at)
            at += int(z)
        got = tp2.core.get(keys, Segments(offs, list(map(int, sizes)), [len(ptrs) // 3] * 3))
        assert got == [False] * 3
        assert tp2.stats()["layout_mismatches"] == 3
        assert int(out.sum()) == 0, "a refused page leaves no bytes behind"
    finally:
        tp2.close()
        tp4.close()

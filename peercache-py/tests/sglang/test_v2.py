"""The v2 HiCache interface against SGLang 0.5.23's own classes (CPU only): side pools with
several buffers per page (a real ``MambaPoolHost``: temporal + two conv states; a real
``DeepSeekV4PagedHostPool`` in ``layer_first``: one buffer per layer), byte-exact across two
nodes with no staging copy, and ``batch_exists_v2`` checked against SGLang's own
``HiCacheFile`` backend as the oracle for every hit policy it implements.

Run by scripts/sglang-contract.sh; skipped (loudly) without the venv.
"""

import ctypes
import random

import pytest

torch = pytest.importorskip("torch", reason="the SGLang contract venv (scripts/sglang-contract.sh)")
pytest.importorskip("sglang", reason="the SGLang contract venv (scripts/sglang-contract.sh)")

from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheFile,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from sglang.srt.mem_cache.memory_pool_host import DeepSeekV4PagedHostPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost  # noqa: E402

from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from test_contract import PAGE, config, extra, fill, free_port, make, mha_host, mla_host, page_bytes  # noqa: E402

SLOTS = 16  # Mamba checkpoints / DeepSeek-V4 pages per host pool


def mamba_host() -> MambaPoolHost:
    info = MambaStateBufferInfo(
        temporal=torch.zeros(2, SLOTS, 4, 8, dtype=torch.float32),
        conv=(torch.zeros(2, SLOTS, 3, 16, dtype=torch.bfloat16), torch.zeros(2, SLOTS, 2, 4, dtype=torch.bfloat16)),
    )
    return MambaPoolHost(info, 2.0, 0, device_capacity=SLOTS, pin_memory=False, device="cpu", layout="page_first")


def dsv4_host() -> DeepSeekV4PagedHostPool:
    layers = [torch.zeros(SLOTS * PAGE, 64, dtype=torch.uint8) for _ in range(3)]
    return DeepSeekV4PagedHostPool(str(PoolName.DEEPSEEK_V4_C4), layers, item_bytes=64, num_host_pages=SLOTS,
                                   slot_page_size=PAGE, layout="layer_first", device="cpu", pin_memory=False)


def randomize(pool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    seen = set()
    for t in [*pool.kv_buffer] if isinstance(pool.kv_buffer, (list, tuple)) else [pool.kv_buffer]:
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        flat = t.view(torch.uint8).reshape(-1)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))


def pool_page(pool, indices) -> bytes:
    ptrs, sizes = pool.get_page_buffer_meta(indices)
    return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


def mamba_idx(slot: int):
    return torch.tensor([slot])


def dsv4_idx(page: int):
    return torch.arange(page * PAGE, (page + 1) * PAGE)


def test_side_pools_with_several_buffers_per_page_round_trip_without_packing():
    port = free_port()
    a, b = make(71, 71, port), make(72, 71, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        pools = {}
        for backend in (a, b):
            kv, mamba, c4 = mha_host("page_first"), mamba_host(), dsv4_host()
            backend.register_mem_pool_host(kv)
            backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
            backend.register_mem_host_pool_v2(c4, PoolName.DEEPSEEK_V4_C4)
            pools[backend] = (mamba, c4)
        m_a, c_a = pools[a]
        m_b, c_b = pools[b]
        assert len(m_a.get_page_buffer_meta(mamba_idx(0))[0]) == 3  # temporal + 2 conv
        assert len(c_a.get_page_buffer_meta(dsv4_idx(0))[0]) == 3  # one per layer
        randomize(m_a, 1)
        randomize(c_a, 2)
        keys = [f"v2-{i}" for i in range(4)]
        written = a.batch_set_v2([
            PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(0, 4), keys=keys),
            PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(0, 4 * PAGE), keys=keys),
        ])
        assert written == {PoolName.MAMBA: [True] * 4, PoolName.DEEPSEEK_V4_C4: [True] * 4}
        got = b.batch_get_v2([
            PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(8, 12), keys=keys),
            PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(8 * PAGE, 12 * PAGE), keys=keys),
        ])
        assert got == {PoolName.MAMBA: [True] * 4, PoolName.DEEPSEEK_V4_C4: [True] * 4}
        for i in range(4):
            assert pool_page(m_b, mamba_idx(8 + i)) == pool_page(m_a, mamba_idx(i))
            assert pool_page(c_b, dsv4_idx(8 + i)) == pool_page(c_a, dsv4_idx(i))
        # Every byte landed straight in SGLang's registered buffers: no packing copy.
        assert b.stats()["staged_reads"] == 0
        # A pool's pages are its own: the Mamba keys do not answer for the C4 pool.
        miss = b.batch_get_v2([PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=dsv4_idx(9),
                                            keys=["v2-never-written"])])
        assert miss == {PoolName.DEEPSEEK_V4_C4: [False]}
    finally:
        a.close()
        b.close()


def test_draft_pools_follow_their_own_shape_across_tp_ranks():
    # An MLA target with two draft pools: an MHA-shaped one (K and V split by head, so each
    # rank's bytes differ) stays per rank; an MLA-shaped one is shared like the target's KV.
    port = free_port()
    r0 = make(76, 76, port, tp_rank=0, tp_size=2, mla=True)
    r1 = make(77, 76, port, tp_rank=1, tp_size=2, mla=True)
    try:
        assert r0.core.wait_members(2, 10) and r1.core.wait_members(2, 10)
        hosts = {}
        for backend in (r0, r1):
            backend.register_mem_pool_host(mla_host("page_first"))
            mha_draft, mla_draft = mha_host("page_first"), mla_host("page_first")
            backend.register_mem_host_pool_v2(mha_draft, PoolName.DRAFT)
            backend.register_mem_host_pool_v2(mla_draft, PoolName.DRAFT_SWA)
            hosts[backend] = (mha_draft, mla_draft)
        fill(hosts[r0][0], 12)
        fill(hosts[r0][1], 13)
        assert len(hosts[r0][0].get_page_buffer_meta(torch.arange(0, PAGE))[0]) == 2  # K and V
        keys = [f"draft-{i}" for i in range(3)]
        idx = torch.arange(0, 3 * PAGE)
        w = r0.batch_set_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=idx, keys=keys),
                             PoolTransfer(name=PoolName.DRAFT_SWA, host_indices=idx, keys=keys)])
        assert w == {PoolName.DRAFT: [True] * 3, PoolName.DRAFT_SWA: [True] * 3}
        dst = torch.arange(8 * PAGE, 11 * PAGE)
        got = r1.batch_get_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=dst, keys=keys),
                               PoolTransfer(name=PoolName.DRAFT_SWA, host_indices=dst, keys=keys)])
        assert got == {PoolName.DRAFT: [False] * 3, PoolName.DRAFT_SWA: [True] * 3}
        for i in range(3):
            assert page_bytes(hosts[r1][1], 8 * PAGE + i * PAGE) == page_bytes(hosts[r0][1], i * PAGE)
        # Rank 0 reads its own MHA draft pages back (K and V gathered and scattered).
        back = r0.batch_get_v2([PoolTransfer(name=PoolName.DRAFT, host_indices=dst, keys=keys)])
        assert back == {PoolName.DRAFT: [True] * 3}
        for i in range(3):
            assert page_bytes(hosts[r0][0], 8 * PAGE + i * PAGE) == page_bytes(hosts[r0][0], i * PAGE)
    finally:
        r0.close()
        r1.close()


def test_side_pools_in_slotmap_mode():
    # Directory-free placement: v2 pages go through the slotmap's verified reads too.
    port = free_port()
    backends = []
    for n in (78, 79):
        e = extra(n, 78, port)
        e.update({"mode": "slotmap", "slot_max_page_bytes": "64kb", "slot_ways": 4})
        backends.append(StorageBackendFactory.create_backend("dynamic", config(e), None))
    a, b = backends
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        pools = {}
        for backend in (a, b):
            backend.register_mem_pool_host(mha_host("page_first"))
            m, c = mamba_host(), dsv4_host()
            backend.register_mem_host_pool_v2(m, PoolName.MAMBA)
            backend.register_mem_host_pool_v2(c, PoolName.DEEPSEEK_V4_C4)
            pools[backend] = (m, c)
        randomize(pools[a][0], 21)
        randomize(pools[a][1], 22)
        keys = [f"slot-v2-{i}" for i in range(6)]
        w = a.batch_set_v2([
            PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(0, 6), keys=keys),
            PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(0, 6 * PAGE), keys=keys),
        ])
        assert w == {PoolName.MAMBA: [True] * 6, PoolName.DEEPSEEK_V4_C4: [True] * 6}
        r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.MAMBA, keys=keys[-2:],
                                                  hit_policy=PoolHitPolicy.TRAILING_PAGES)])
        # No KV pages were written: nothing is restorable, whatever the side pools hold.
        assert r.kv_hit_pages == 0
        got = b.batch_get_v2([
            PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(8, 14), keys=keys),
            PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(8 * PAGE, 14 * PAGE), keys=keys),
        ])
        assert got == {PoolName.MAMBA: [True] * 6, PoolName.DEEPSEEK_V4_C4: [True] * 6}
        for i in range(6):
            assert pool_page(pools[b][0], mamba_idx(8 + i)) == pool_page(pools[a][0], mamba_idx(i))
            assert pool_page(pools[b][1], dsv4_idx(8 + i)) == pool_page(pools[a][1], dsv4_idx(i))
    finally:
        a.close()
        b.close()


def test_bad_v2_input_misses_with_no_exception():
    port = free_port()
    a = make(73, 73, port)
    try:
        a.register_mem_pool_host(mha_host("page_first"))
        a.register_mem_host_pool_v2(mamba_host(), PoolName.MAMBA)
        # Wrong number of host indices, and a pool that was never registered.
        r = a.batch_set_v2([
            PoolTransfer(name=PoolName.MAMBA, host_indices=torch.arange(0, 3), keys=["x", "y"]),
            PoolTransfer(name=PoolName.SWA, host_indices=torch.arange(0, 2), keys=["x", "y"]),
        ])
        assert r == {PoolName.MAMBA: [False, False], PoolName.SWA: [False, False]}
        with pytest.raises(ValueError, match="hit policy"):
            a.batch_exists_v2(["k"], [PoolTransfer(name=PoolName.MAMBA, keys=["k"], hit_policy="bogus")])
    finally:
        a.close()


def _oracle_case(rng: random.Random, n: int):
    """Which pages of each pool exist, drawn so that holes land everywhere."""
    kv = [rng.random() < 0.9 for _ in range(n)]
    side = {name: [rng.random() < 0.75 for _ in range(n)] for name in (PoolName.MAMBA, PoolName.DEEPSEEK_V4_C4)}
    return kv, side


def test_exists_v2_agrees_with_sglangs_file_backend(tmp_path):
    # SGLang's HiCacheFile implements ALL_PAGES and TRAILING_PAGES; both backends get the same
    # pages, then must report the same kv_hit_pages, per-pool boundaries and restorable sets.
    port = free_port()
    ours = make(74, 74, port)
    ref = HiCacheFile(config({"file_storage_path": str(tmp_path)}), file_path=str(tmp_path))
    try:
        kv, mamba, c4 = mha_host("page_first"), mamba_host(), dsv4_host()
        for backend in (ours, ref):
            backend.register_mem_pool_host(kv)
            backend.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
            backend.register_mem_host_pool_v2(c4, PoolName.DEEPSEEK_V4_C4)
        fill(kv, 9)
        randomize(mamba, 10)
        randomize(c4, 11)
        rng = random.Random(7)
        n = 8
        seen = set()
        for case in range(12):
            keys = [f"oracle-{case}-{i}" for i in range(n)]
            kv_has, side_has = _oracle_case(rng, n)
            for i in range(n):
                if kv_has[i]:
                    assert ours.batch_set_v1([keys[i]], torch.arange(0, PAGE)) == [True]
                    assert ref.set(keys[i], kv.get_data_page(0, flat=True))
                for name, idx in ((PoolName.MAMBA, mamba_idx(i)), (PoolName.DEEPSEEK_V4_C4, dsv4_idx(i))):
                    if side_has[name][i]:
                        t = [PoolTransfer(name=name, host_indices=idx, keys=[keys[i]])]
                        assert ours.batch_set_v2(t) == {name: [True]}
                        assert ref.batch_set_v2(t) == {name: [True]}
            for window in (1, 2, 3):
                transfers = [
                    PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES),
                    PoolTransfer(name=PoolName.MAMBA, keys=keys[-window:], hit_policy=PoolHitPolicy.TRAILING_PAGES),
                ]
                got = ours.batch_exists_v2(keys, transfers)
                want = ref.batch_exists_v2(keys, transfers)
                seen.add(want.kv_hit_pages)
                assert isinstance(got, PoolTransferResult)
                assert got.kv_hit_pages == want.kv_hit_pages, (case, window)
                assert sorted(got.restorable_prefix_pages) == sorted(want.restorable_prefix_pages), (case, window)
                assert {str(k): v for k, v in got.extra_pool_hit_pages.items()} == \
                    {str(k): v for k, v in want.extra_pool_hit_pages.items()}, (case, window)
                # SGLang reads the KV verdict with PoolName.KV as the key.
                assert got.extra_pool_hit_pages.get(PoolName.KV, 0) == want.extra_pool_hit_pages.get(PoolName.KV, 0)
        assert len(seen) >= 3, f"the drawn cases should give varied hits, got {seen}"
    finally:
        ours.close()


def test_block_groups_reports_whole_groups_and_never_gates_the_kv_hit():
    port = free_port()
    a = make(75, 75, port)
    try:
        kv, c4 = mha_host("page_first"), dsv4_host()
        a.register_mem_pool_host(kv)
        a.register_mem_host_pool_v2(c4, PoolName.DEEPSEEK_V4_C4)
        keys = [f"bg-{i}" for i in range(8)]
        assert a.batch_set_v1(keys, torch.arange(0, 8 * PAGE)) == [True] * 8
        # Blocks of 4 pages, each a group of 2 keys; the second block's group is incomplete.
        have = [0, 1, 4]
        for i in have:
            assert a.batch_set_v2([PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=dsv4_idx(i), keys=[keys[i]])])
        t = PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=keys, hit_policy=PoolHitPolicy.BLOCK_GROUPS,
                         block_pages=4, group_pages=2)
        r = a.batch_exists_v2(keys, [t])
        assert r.kv_hit_pages == 8  # not gated
        assert r.restorable_prefix_pages == list(range(1, 9))
        assert r.extra_pool_hit_pages[PoolName.DEEPSEEK_V4_C4] == 4  # one complete group
    finally:
        a.close()

"""SGLang's direct linker (``peercache.linker.PeerCacheLinker``) against SGLang 0.5.23's own
classes on CPU: built by SGLang's linker factory over real ``MHATokenToKVPool``,
``MLATokenToKVPool`` and ``DSATokenToKVPool`` device pools (CPU tensors), two nodes on loopback,
offload → lookup → layer-wise load byte-exact on both transfer paths (in place and staged through
the host arena, as CUDA pools are), pages shared with ``PeerCacheStore`` over a ``layer_first``
host pool both ways, cancellation and failure reporting.

Run by scripts/sglang-contract.sh (and scripts/sglang-linker-gpu.sh on a CUDA device).
"""

import json
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="the SGLang contract venv (scripts/sglang-contract.sh)")
pytest.importorskip("sglang", reason="the SGLang contract venv (scripts/sglang-contract.sh)")

from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer  # noqa: E402
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.linker_factory import create_unified_cache_linker  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from peercache.linker import PeerCacheLinker  # noqa: E402
from test_contract import LAYERS, PAGE, TOKENS, free_port, make, mha_host, page_bytes  # noqa: E402

DEVICE = os.environ.get("PEERCACHE_LINKER_DEVICE", "cpu")
MODEL = "toy-model"  # the model name test_contract's PeerCacheStore keys on


@pytest.fixture(scope="module", autouse=True)
def sglang_context(tmp_path_factory):
    """SGLang's process context, published from a local model config (no hub access)."""
    model = tmp_path_factory.mktemp("model")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 2, "num_hidden_layers": LAYERS,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 256,
        "torch_dtype": "float16"}))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = ServerArgs(model_path=str(model), skip_tokenizer_init=True, device=DEVICE)
    reset_context()
    publish(args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    yield args
    reset_context()


def linker_extra(n: int, seed: int, port: int, **kw) -> dict:
    host = f"127.0.0.{n}"
    cfg = {"discovery_addr": f"127.0.0.{seed}:{port}", "protocol": "tcp", "local_hostname": host,
           "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
           "global_segment_size": "32mb", "heartbeat_interval": 0.2, "member_ttl": 0.6, "op_timeout": 1.0,
           "metrics_enabled": False, "startup_timeout": 10, "model_name": MODEL}
    cfg.update(kw)
    return cfg


def mha_pool(size=TOKENS, page=PAGE):
    return MHATokenToKVPool(size=size, page_size=page, dtype=torch.float16, head_num=2, head_dim=8,
                            layer_num=LAYERS, device=DEVICE, enable_memory_saver=False)


def mla_pool():
    return MLATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=32,
                            qk_rope_head_dim=16, layer_num=LAYERS, device=DEVICE, enable_memory_saver=False)


DSA_PAGE = 64  # DSA's indexer buffer holds whole 64-token pages


def dsa_pool():
    return DSATokenToKVPool(size=4 * DSA_PAGE, page_size=DSA_PAGE, kv_lora_rank=32, dtype=torch.bfloat16,
                            qk_rope_head_dim=16, layer_num=2, device=DEVICE, index_head_dim=128,
                            enable_memory_saver=False, kv_cache_dim=48)


def build(args, kvcache, n, seed, port, **kw):
    page = int(kvcache.page_size)
    alloc = PagedTokenToKVPoolAllocator(int(kvcache.size), page, kvcache.dtype, DEVICE, kvcache, False)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc, page_size=page)
    config = {"linker": "PeerCacheLinker", "linker_module_path": "peercache.linker",
              "linker_extra_config": linker_extra(n, seed, port, **kw)}
    return create_unified_cache_linker(args, params, backend="dynamic", config=config,
                                       components={ComponentType.FULL})


def buffers(kvcache):
    if isinstance(kvcache, DSATokenToKVPool):
        return [*kvcache.kv_buffer, *kvcache.index_k_with_scale_buffer]
    if isinstance(kvcache, MHATokenToKVPool):
        return [*kvcache.k_buffer, *kvcache.v_buffer]
    return list(kvcache.kv_buffer)


def randomize(kvcache, seed):
    g = torch.Generator().manual_seed(seed)
    for t in buffers(kvcache):
        flat = t.view(torch.uint8).reshape(-1)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g).to(flat.device))


def slots(first_page, pages, page=PAGE):
    return torch.arange(first_page * page, (first_page + pages) * page, device=DEVICE)


def rows(kvcache, t, idx):
    """What buffer ``t`` of ``kvcache`` holds for the token slots ``idx``: one row per token, or
    one row per page for page-row buffers (DSA's indexer)."""
    page = int(kvcache.page_size)
    if t.shape[0] <= int(kvcache.size) // page + 1:
        return t[idx[::page].div(page, rounding_mode="floor")]
    return t[idx]


def same_pages(a, a_idx, b, b_idx):
    # As bytes: random bits make NaNs, which never compare equal as floats.
    return all(torch.equal(rows(a, x, a_idx).cpu().view(torch.uint8), rows(b, y, b_idx).cpu().view(torch.uint8))
               for x, y in zip(buffers(a), buffers(b)))


def wait_offloads(linker, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while linker.num_completed_offloads() < count:
        assert time.monotonic() < deadline, "offload did not complete in time"
        time.sleep(0.005)
    return [linker.pop_completed_offload() for _ in range(count)]


def kv(keys, idx=None):
    return [PoolTransfer(name=PoolName.KV, keys=list(keys), device_indices=idx)]


def load_all(linker, rid, keys, idx):
    """Queues, starts and finishes one load as SGLang's forward does, waiting on each layer."""
    assert linker.load(rid, kv(keys, idx))
    index = linker.start_layer_wise_loading()
    assert index >= 0
    linker.layer_done_counter.set_consumer(index)
    for layer in range(linker.num_layers):
        linker.layer_done_counter.wait_until(layer)
    return linker.finish_layer_wise_loading(index)


@pytest.fixture
def pair(sglang_context):
    made = []

    def _pair(pool, n, **kw):
        port = free_port()
        a_kv, b_kv = pool(), pool()
        a = build(sglang_context, a_kv, n, n, port, **kw)
        made.append(a)
        b = build(sglang_context, b_kv, n + 1, n, port, **kw)
        made.append(b)
        assert a.store.core.wait_members(2, 10) and b.store.core.wait_members(2, 10)
        return a_kv, a, b_kv, b

    yield _pair
    for linker in made:
        linker.close()


def test_the_factory_builds_the_linker_by_module_path(pair):
    _, a, _, _ = pair(mha_pool, 80)
    assert isinstance(a, PeerCacheLinker) and isinstance(a, UnifiedCacheLinker)
    assert not PeerCacheLinker.__abstractmethods__
    assert a.num_layers == LAYERS and set(a.pools) == {PoolName.KV}
    assert a.store.layout_spec()["pools"][0]["host_layout"] == "layer_first"


@pytest.mark.parametrize("staging", ["auto", "always"])
@pytest.mark.parametrize("pool", [mha_pool, mla_pool], ids=["mha", "mla"])
def test_offload_lookup_load_is_byte_exact_across_nodes(pair, pool, staging):
    kw = {"linker_staging": staging}
    if staging == "always":  # 3 pages of arena per direction: the 5-page batch moves in two chunks
        kw["linker_staging_bytes"] = 3 * sum(b[0:PAGE].nbytes for b in buffers(pool()))
    a_kv, a, b_kv, b = pair(pool, 82 if pool is mha_pool else 84, **kw)
    assert a.staging == (staging == "always" or DEVICE != "cpu")  # device pools always stage
    randomize(a_kv, 1)
    keys = [f"h{i}" for i in range(5)]
    src = slots(2, 5)
    assert a.offload(kv(keys, src), "session-1")
    assert wait_offloads(a, 1) == [True]
    # Every prefix length is restorable; a hole at page 3 leaves only lengths 1 and 2.
    assert b.lookup("r1", kv(keys)) == [1, 2, 3, 4, 5]
    assert b.lookup("r1", kv(keys[:2] + ["absent"] + keys[3:])) == [1, 2]
    dst = slots(20, 5)
    assert load_all(b, "r1", keys, dst) is True
    assert same_pages(a_kv, src, b_kv, dst)


def test_a_two_pool_dsa_group_round_trips_and_the_indexer_gates_lookup(pair):
    a_kv, a, b_kv, b = pair(dsa_pool, 86)
    assert set(a.pools) == {PoolName.KV, PoolName.INDEXER}
    assert a.store.layout_spec()["pools"][0]["host_layout"] == "linker"
    randomize(a_kv, 2)
    keys = ["d0", "d1"]
    src = slots(0, 2, DSA_PAGE)
    assert a.offload(kv(keys, src)) and wait_offloads(a, 1) == [True]
    # A third page whose KV is stored but whose indexer page is not: the lookup stops before it.
    kv_only = a.pool_group.resolve_transfers(kv(["d2"], slots(2, 1, DSA_PAGE)))
    assert a.store.batch_set_v2([t for t in kv_only if t.name == PoolName.KV])[PoolName.KV] == [True]
    assert b.lookup("r", kv(keys + ["d2"])) == [1, 2]
    dst = slots(1, 2, DSA_PAGE)
    assert load_all(b, "r", keys, dst) is True
    assert same_pages(a_kv, src, b_kv, dst)


def test_linker_pages_and_hicache_pages_are_one_format(sglang_context):
    port = free_port()
    dev = mha_pool()
    linker = build(sglang_context, dev, 88, 88, port)
    store = make(89, 88, port, page_first=False)
    try:
        host = mha_host("layer_first")
        store.register_mem_pool_host(host)
        assert linker.store._layout == store._layout  # one layout fingerprint
        assert linker.store.core.wait_members(2, 10) and store.core.wait_members(2, 10)
        randomize(dev, 3)
        # Linker → HiCache: pages offloaded from the device pool read into a host pool.
        keys = ["x0", "x1", "x2"]
        src = slots(1, 3)
        assert linker.offload(kv(keys, src)) and wait_offloads(linker, 1) == [True]
        host_idx = torch.arange(0, 3 * PAGE)
        assert store.batch_get_v1(keys, host_idx) == [True] * 3
        for p in range(3):
            device_page = b"".join(
                t[(1 + p) * PAGE:(2 + p) * PAGE].cpu().numpy().tobytes()
                for layer in range(LAYERS) for t in (dev.k_buffer[layer], dev.v_buffer[layer]))
            assert page_bytes(host, p * PAGE) == device_page
        # HiCache → linker: host pages written by PeerCacheStore load into the device pool.
        g = torch.Generator().manual_seed(4)
        flat = host.kv_buffer.view(torch.uint8).reshape(-1)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))
        assert store.batch_set_v1(["y0", "y1"], torch.arange(4 * PAGE, 6 * PAGE)) == [True, True]
        assert linker.lookup("r", kv(["y0", "y1"])) == [1, 2]
        dst = slots(10, 2)
        assert load_all(linker, "r", ["y0", "y1"], dst) is True
        for p in range(2):
            device_page = b"".join(
                t[(10 + p) * PAGE:(11 + p) * PAGE].cpu().numpy().tobytes()
                for layer in range(LAYERS) for t in (dev.k_buffer[layer], dev.v_buffer[layer]))
            assert page_bytes(host, (4 + p) * PAGE) == device_page
    finally:
        linker.close()
        store.close()


def test_a_cancelled_load_never_touches_its_slots(pair):
    a_kv, a, b_kv, b = pair(mha_pool, 90)
    randomize(a_kv, 5)
    assert a.offload(kv(["c0"], slots(0, 1))) and wait_offloads(a, 1) == [True]
    dst = slots(7, 1)
    for t in buffers(b_kv):
        t.view(torch.uint8).fill_(0x5A)
    assert b.load("rc", kv(["c0"], dst))
    assert b.cancel_queued_load("rc") is True
    assert b.cancel_queued_load("rc") is False
    assert b.start_layer_wise_loading() == -1  # nothing left to start
    assert all(bool((rows(b_kv, t, dst).view(torch.uint8) == 0x5A).all()) for t in buffers(b_kv))


def test_pages_that_do_not_land_fail_the_batch_and_bad_slots_are_refused(pair):
    a_kv, a, b_kv, b = pair(mha_pool, 92, op_timeout=0.5)
    randomize(a_kv, 6)
    # Never written: the load runs, every layer resolves (the forward is not blocked) and the
    # batch reports failure.
    assert load_all(b, "rm", ["never-written"], slots(3, 1)) is False
    # Misaligned or out-of-range slots: the load and the offload are refused up front.
    assert b.load("rx", kv(["m0"], slots(3, 1) + 1)) is False
    assert b.load("ry", kv(["m0"], slots(10_000, 1))) is False
    assert a.offload(kv(["m0"], slots(3, 1) + 2)) is False
    assert "rx" not in b.pending_loads and b.start_layer_wise_loading() == -1
    # A duplicate rid in the same batch is a caller bug SGLang never makes: it is an error.
    assert b.load("rd", kv(["m0"], slots(4, 1)))
    with pytest.raises(RuntimeError, match="already queued"):
        b.load("rd", kv(["m0"], slots(5, 1)))
    b.reset()
    assert b.start_layer_wise_loading() == -1


def test_bad_linker_settings_are_refused(sglang_context):
    for bad in ({"linker_staging": "sometimes"}, {"linker_staging_bytes": 0}, {"linker_staging_bytes": "big"},
                {"linker_gpudirect": "dmabuf"}):
        with pytest.raises(ValueError, match="peercache linker"):
            build(sglang_context, mha_pool(), 94, 94, free_port(), **bad)


def test_reset_and_close_quiesce(pair):
    a_kv, a, _, _ = pair(mha_pool, 96)
    randomize(a_kv, 7)
    for i in range(4):
        assert a.offload(kv([f"q{i}"], slots(i, 1)))
    a.reset()  # waits for the four offloads, then forgets their results
    assert a.num_completed_offloads() == 0
    a.close()
    a.close()  # idempotent
    assert not a._load_thread.is_alive() and not a._offload_thread.is_alive()


def mamba_hybrid(args, n, seed, port, staging):
    """A FULL (MLA) + MAMBA hybrid as SGLang builds it: ``HybridLinearKVPool`` over a
    ``HybridReqToTokenPool``'s Mamba pool (full attention on layers 0 and 2, Mamba on 1 and 3)."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: PLC0415
    from sglang.srt.environ import envs  # noqa: PLC0415
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool  # noqa: PLC0415

    with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1, num_heads=2,
                                        head_dim=16, state_size=8, conv_kernel=4)
        cache_params = Mamba2CacheParams(shape=shape, layers=[1, 3])
    req = HybridReqToTokenPool(size=4, mamba_size=8, mamba_spec_state_size=4, max_context_len=256, device=DEVICE,
                               enable_memory_saver=False, cache_params=cache_params, mamba_layer_ids=[1, 3],
                               enable_mamba_extra_buffer=False, speculative_num_draft_tokens=3)
    kvcache = HybridLinearKVPool(size=TOKENS, dtype=torch.bfloat16, page_size=PAGE, head_num=1, head_dim=48,
                                 full_attention_layer_ids=[0, 2], device=DEVICE, mamba_pool=req.mamba_pool,
                                 use_mla=True, kv_lora_rank=32, qk_rope_head_dim=16)
    alloc = PagedTokenToKVPoolAllocator(TOKENS, PAGE, torch.bfloat16, DEVICE, kvcache, False)
    params = CacheInitParams(disable=False, req_to_token_pool=req, token_to_kv_pool_allocator=alloc, page_size=PAGE)
    config = {"linker": "PeerCacheLinker", "linker_module_path": "peercache.linker",
              "linker_extra_config": linker_extra(n, seed, port, linker_staging=staging)}
    linker = create_unified_cache_linker(args, params, backend="dynamic", config=config,
                                         components={ComponentType.FULL, ComponentType.MAMBA})
    cache = req.mamba_pool.mamba_cache
    states = [cache.temporal, *cache.conv]  # each [layer, slot, ...]
    return kvcache, states, linker


@pytest.mark.parametrize("staging", ["auto", "always"])
def test_a_mamba_hybrid_restores_only_at_offloaded_state_boundaries(sglang_context, staging):
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy  # noqa: PLC0415

    port = free_port()
    a_kv, a_states, a = mamba_hybrid(sglang_context, 74, 74, port, staging)
    b_kv, b_states, b = mamba_hybrid(sglang_context, 75, 74, port, staging)
    try:
        assert set(a.pools) == {PoolName.KV, PoolName.MAMBA}
        assert a.store.core.wait_members(2, 10) and b.store.core.wait_members(2, 10)
        g = torch.Generator().manual_seed(8)
        for t in [*a_kv.full_kv_pool.kv_buffer, *a_states]:
            flat = t.view(torch.uint8).reshape(-1)
            flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g).to(flat.device))

        def mamba(keys, slot=None):
            idx = None if slot is None else torch.tensor([slot], device=DEVICE)
            return PoolTransfer(name=PoolName.MAMBA, keys=keys, device_indices=idx,
                                hit_policy=PoolHitPolicy.TRAILING_PAGES)

        keys = [f"m{i}" for i in range(4)]
        # Two tree nodes, as SGLang offloads them: pages 0-1 with the state after page 1 (slot 2),
        # pages 2-3 with the state after page 3 (slot 5).
        assert a.offload([kv(keys[:2], slots(0, 2))[0], mamba([keys[1]], 2)])
        assert a.offload([kv(keys[2:], slots(2, 2))[0], mamba([keys[3]], 5)])
        assert wait_offloads(a, 2) == [True, True]
        # A Mamba state exists only at node ends: prefixes of 2 and 4 pages restore, 1 and 3 do not.
        assert b.lookup("r", [kv(keys)[0], mamba([keys[-1]])]) == [2, 4]
        dst = slots(8, 4)
        assert b.load("r", [kv(keys, dst)[0], mamba([keys[-1]], 6)])
        index = b.start_layer_wise_loading()
        b.layer_done_counter.set_consumer(index)
        for layer in range(b.num_layers):
            b.layer_done_counter.wait_until(layer)
        assert b.finish_layer_wise_loading(index) is True
        src = slots(0, 4)
        for x, y in zip(a_kv.full_kv_pool.kv_buffer, b_kv.full_kv_pool.kv_buffer):
            assert torch.equal(x[src].view(torch.uint8), y[dst].view(torch.uint8))
        for x, y in zip(a_states, b_states):
            assert torch.equal(x[:, 5].contiguous().view(torch.uint8), y[:, 6].contiguous().view(torch.uint8))
    finally:
        a.close()
        b.close()


def test_gpudirect_lands_other_nodes_pages_in_the_pools_and_stages_the_rest(pair, caplog):
    """``linker_gpudirect=peermem`` on the software RDMA fabric, which takes a registered host
    address as device-visible memory: other nodes' pages land in the pools one-sided (checked by
    header before and after), this node's own pages come through the arena; byte-exact both.
    With the pools in GPU memory the fabric (which copies with the CPU) refuses their addresses:
    one warning, and every page is staged, byte-exact."""
    a_kv, a, b_kv, b = pair(mha_pool, 76, protocol="rdma", rdma_backend="soft", host_local=False,
                            linker_gpudirect="peermem")
    assert b.staging
    if DEVICE != "cpu":
        assert not a.gpudirect and not b.gpudirect
        assert any("GPUDirect unavailable" in r.getMessage() and "host memory" in r.getMessage()
                   for r in caplog.records)
        randomize(a_kv, 9)
        assert a.offload(kv(["gd0", "gd1"], slots(0, 2))) and wait_offloads(a, 1) == [True]
        dst = slots(12, 2)
        assert load_all(b, "rg", ["gd0", "gd1"], dst) is True
        assert same_pages(a_kv, slots(0, 2), b_kv, dst)
        return
    assert a.gpudirect and b.gpudirect
    randomize(a_kv, 9)
    randomize(b_kv, 10)
    theirs, mine = [f"g{i}" for i in range(4)], ["own0", "own1"]
    assert a.offload(kv(theirs, slots(0, 4))) and wait_offloads(a, 1) == [True]
    assert b.offload(kv(mine, slots(4, 2))) and wait_offloads(b, 1) == [True]
    before = b.store.stats()["rdma_read_bytes"]
    dst = slots(12, 6)
    assert load_all(b, "rg", theirs + mine, dst) is True
    assert same_pages(a_kv, slots(0, 4), b_kv, dst[:4 * PAGE])
    assert same_pages(b_kv, slots(4, 2), b_kv, dst[4 * PAGE:])
    page_bytes_ = sum(t[0:PAGE].nbytes for t in buffers(b_kv))
    assert b.store.stats()["rdma_read_bytes"] - before >= 4 * page_bytes_


def test_gpudirect_where_the_node_cannot_is_one_warning_and_staged_loads(pair, caplog):
    a_kv, a, b_kv, b = pair(mha_pool, 78, linker_gpudirect="peermem")  # TCP nodes
    assert not b.gpudirect and b.staging
    assert any("GPUDirect unavailable" in r.getMessage() for r in caplog.records)
    randomize(a_kv, 11)
    assert a.offload(kv(["t0", "t1"], slots(0, 2))) and wait_offloads(a, 1) == [True]
    dst = slots(9, 2)
    assert load_all(b, "rt", ["t0", "t1"], dst) is True
    assert same_pages(a_kv, slots(0, 2), b_kv, dst)

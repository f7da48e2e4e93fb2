"""PeerCacheConnector against vLLM's real classes, without running a model: a real
``VllmConfig`` (from ``EngineArgs``), real ``Request``s hashed by vLLM's own block hasher, real
``KVCacheBlocks`` and ``SchedulerOutput``s, and real KV tensors in the CPU backend's layout.
Two engines' connectors on two loopback nodes: what A's worker publishes, B's scheduler finds
and B's worker loads byte-exact into other blocks; every bad input is a miss."""

from __future__ import annotations

import os
import secrets
import tempfile

import pytest

# `vllm.config`, not `vllm`: without vLLM installed, this folder itself imports as a namespace
# package named `vllm`.
torch = pytest.importorskip("torch", reason="the vLLM venv (scripts/vllm-e2e.sh)")
pytest.importorskip("vllm.config", reason="the vLLM venv (scripts/vllm-e2e.sh)")

from vllm.config import KVEventsConfig, KVTransferConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_events import BlockStored  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheBlocks  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    KVCacheBlock,
    get_request_block_hasher,
    init_none_hash,
    maybe_convert_block_hash,
)
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from harness import Meta, free_port, prompts_sharing  # noqa: E402
from model import make_model  # noqa: E402

from peercache.vllm.config import ConfigError, check_hash_algo  # noqa: E402
from peercache.vllm.connector import PeerCacheConnector  # noqa: E402
from peercache.vllm.events import PeerCacheKVEvents, StoredBlocks  # noqa: E402
from peercache.vllm.routing import RequestKeys, block_hashes, namespace  # noqa: E402

BLOCK = 32
NUM_BLOCKS = 48
LAYERS = 2


@pytest.fixture(scope="module")
def env():
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="pc-contract-") as d:
        model = make_model(os.path.join(d, "model"), layers=LAYERS, hidden=256)
        secret = os.path.join(d, "secret")
        with open(secret, "w") as f:
            f.write(secrets.token_hex(16))
        os.chmod(secret, 0o600)
        meta = Meta("127.0.0.30", secret)
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        out = {"model": model, "meta": meta.addr, "secret": secret}
        with set_current_vllm_config(vllm_config(out, "127.0.0.30")):
            ensure_model_parallel_initialized(1, 1)
        try:
            yield out
        finally:
            meta.stop()


def vllm_config(env, host, dtype="bfloat16", block_size=BLOCK, secret=None, kv_events=False, **extra):
    extra_cfg = {"discovery_addr": env["meta"], "local_hostname": host, "protocol": "tcp",
                 "global_segment_size": "64mb", "cluster_secret_file": secret or env["secret"],
                 "metrics_enabled": False, "op_timeout": 1.0, "startup_timeout": 10,
                 "heartbeat_interval": 0.2, "member_ttl": 0.6}
    extra_cfg.update(extra)
    kv = KVTransferConfig(kv_connector="PeerCacheConnector", kv_connector_module_path="peercache.vllm",
                          kv_role="kv_both", kv_connector_extra_config=extra_cfg)
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None
    args = EngineArgs(model=env["model"], skip_tokenizer_init=True, block_size=block_size,
                      enforce_eager=True, dtype=dtype, max_model_len=4096, kv_transfer_config=kv,
                      kv_events_config=events)
    return args.create_engine_config()


class Engine:
    """One engine's two connectors (scheduler and worker) and its KV tensors."""

    def __init__(self, env, host, fill, **kw):
        self.cfg = vllm_config(env, host, **kw)
        kcc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[])
        with set_current_vllm_config(self.cfg):
            self.sched = PeerCacheConnector(self.cfg, KVConnectorRole.SCHEDULER, kcc)
            self.worker = PeerCacheConnector(self.cfg, KVConnectorRole.WORKER, kcc)
        mc = self.cfg.model_config
        heads, head = mc.get_num_kv_heads(self.cfg.parallel_config), mc.get_head_size()
        g = torch.Generator().manual_seed(fill)
        dtype = mc.dtype
        # The CPU backend's layout: [num_blocks, kv_heads, block_size, 2 * head_size].
        bs = self.cfg.cache_config.block_size
        shape = (NUM_BLOCKS, heads, bs, 2 * head)
        self.kv = {f"model.layers.{i}.self_attn.attn": (torch.randn(*shape, generator=g).to(dtype) if fill else
                                                        torch.zeros(*shape, dtype=dtype))
                   for i in range(LAYERS)}
        self.worker.register_kv_caches(self.kv)
        hash_fn = get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(self.cfg.cache_config.block_size, hash_fn)

    def request(self, rid, ids, kv_transfer_params=None, kv_hints=None):
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        return Request(rid, ids, SamplingParams(max_tokens=4, extra_args=extra), None, block_hasher=self.hasher,
                       kv_hints=kv_hints)

    def step(self, req, block_ids, computed, scheduled):
        """One scheduler step of a new request, then the worker's load, forward and save."""
        so = SchedulerOutput.make_empty()
        so.scheduled_new_reqs = [NewRequestData.from_request(req, (block_ids,), None)]
        so.num_scheduled_tokens = {req.request_id: scheduled}
        so.total_num_scheduled_tokens = scheduled
        so.scheduled_new_reqs[0].num_computed_tokens = computed
        meta = self.sched.build_connector_meta(so)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        return meta

    def alloc(self, req, block_ids, external):
        blocks = KVCacheBlocks(blocks=([KVCacheBlock(b) for b in block_ids],))
        self.sched.update_state_after_alloc(req, blocks, external)

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def settle(*engines):
    """Waits until every node of ``engines`` sees all of them: a page is published to, and
    looked up at, the directory shard each node's member view names."""
    for e in engines:
        for store in (e.sched.store, e.worker.store):
            assert store is not None and store.wait_members(2 * len(engines), 10), "the nodes never met"


def finish(e, req, deadline=10.0):
    """vLLM's end of a request whose saves may be running: ``request_finished`` says to keep
    its blocks, the next step tells the worker, and the worker reports it once its saves
    ended (the only time its blocks may be reused)."""
    import time  # noqa: PLC0415

    delay, _ = e.sched.request_finished(req, [])
    so = SchedulerOutput.make_empty()
    so.finished_req_ids = {req.request_id}
    e.worker.bind_connector_metadata(e.sched.build_connector_meta(so))
    e.worker.start_load_kv(None)
    e.worker.wait_for_save()
    sent, recving = e.worker.get_finished({req.request_id})
    until = time.monotonic() + deadline
    while delay and not sent and time.monotonic() < until:
        time.sleep(0.01)
        sent, recving = e.worker.get_finished(set())
    e.worker.clear_connector_metadata()
    assert recving is None
    assert sent == ({req.request_id} if delay else None), (delay, sent)
    return delay


def publish(a, rid, ids, block_ids):
    req = a.request(rid, ids)
    assert a.sched.get_num_new_matched_tokens(req, 0) == (0, False)
    a.alloc(req, block_ids, 0)
    a.step(req, block_ids, 0, len(ids))
    assert finish(a, req), "a request that saved keeps its blocks until its saves end"
    return req


def test_b_finds_and_loads_a_s_blocks_byte_exact_into_other_blocks(env):
    a = Engine(env, "127.0.0.31", fill=1)
    b = Engine(env, "127.0.0.32", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(10 * BLOCK + 5, 0, 1, seed=7)[0]
        src = list(range(3, 3 + 11))
        publish(a, "a1", ids, src)
        stats = a.worker.get_kv_connector_stats()
        assert stats is not None and stats.data["saved_blocks"] == 11, "10 full blocks and the 5-token tail"
        req = b.request("b1", ids)
        n, asynchronous = b.sched.get_num_new_matched_tokens(req, 0)
        # Every prompt token but the last: vLLM computes only that one.
        assert (n, asynchronous) == (10 * BLOCK + 4, False)
        # vLLM's own prefix cache holding the first 2 blocks: the cluster supplies the rest.
        assert b.sched.get_num_new_matched_tokens(req, 2 * BLOCK) == (8 * BLOCK + 4, False)
        dst = list(range(20, 31))
        b.alloc(req, dst, 8 * BLOCK + 4)
        meta = b.step(req, dst, 10 * BLOCK + 4, 1)
        assert sum(len(io.block_ids) for io in meta.loads) == 9
        assert b.worker.get_block_ids_with_load_errors() == set()
        for name in a.kv:
            assert torch.equal(b.kv[name][dst[2:11]], a.kv[name][src[2:11]]), name
            assert not b.kv[name][dst[:2]].any(), "blocks vLLM holds itself are not overwritten"
        loaded = b.worker.get_kv_connector_stats()
        assert loaded is not None and loaded.data["loaded_blocks"] == 9
        assert not meta.saves, "B publishes neither blocks nor a tail it loaded"
        assert not finish(b, req), "a request that saved nothing frees its blocks at once"
    finally:
        a.close()
        b.close()


def test_staged_caches_share_pages_with_in_place_ones_byte_exact(env):
    """``kv_staging``: the path GPU caches take (forced here on CPU tensors with ``always``).
    A publishes through a one-block save mirror (eleven chunks), B reads in place and C through
    its load mirror: both byte-exact; a page that went is a load error, and ``never`` refuses
    caches the node cannot reach in place."""
    a = Engine(env, "127.0.0.53", fill=3, kv_staging="always", staging_size="1kb")
    b = Engine(env, "127.0.0.54", fill=0)
    c = Engine(env, "127.0.0.55", fill=0, kv_staging="always")
    try:
        settle(a, b, c)
        assert a.worker._worker._save_mirror.slots == 1, "a 1 KiB budget is one block each way"
        ids = prompts_sharing(10 * BLOCK + 5, 0, 1, seed=37)[0]
        src = list(range(3, 3 + 11))
        publish(a, "s-a", ids, src)
        stats = a.worker.get_kv_connector_stats()
        assert stats is not None and stats.data["saved_blocks"] == 11
        for e, rid in ((b, "s-b"), (c, "s-c")):
            req = e.request(rid, ids)
            n, _ = e.sched.get_num_new_matched_tokens(req, 0)
            assert n == 10 * BLOCK + 4
            dst = list(range(20, 31))
            e.alloc(req, dst, n)
            e.step(req, dst, n, 1)
            assert e.worker.get_block_ids_with_load_errors() == set(), rid
            for name in a.kv:
                assert torch.equal(e.kv[name][dst[:10]], a.kv[name][src[:10]]), (rid, name)
            finish(e, req)
        # The pages go between C's lookup and its staged load: an error for each block (ten
        # full ones and the tail), never the bytes its mirror held from the last load.
        req = c.request("s-gone", ids)
        assert c.sched.get_num_new_matched_tokens(req, 0) == (10 * BLOCK + 4, False)
        a.worker.store.clear()
        dst = list(range(32, 43))
        c.alloc(req, dst, 10 * BLOCK + 4)
        c.step(req, dst, 10 * BLOCK + 4, 1)
        assert c.worker.get_block_ids_with_load_errors() == set(dst)
        finish(c, req)
    finally:
        for e in (a, b, c):
            e.close()
    from peercache.vllm.worker import WorkerSide  # noqa: PLC0415

    never = WorkerSide(None, a.worker.scheme, NUM_BLOCKS, save_async=False, staging="never")  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="kv_staging"):
        never.register({"l": torch.zeros(NUM_BLOCKS, 2, BLOCK, 8, device="meta")})
    with pytest.raises(ConfigError, match="kv_staging"):
        Engine(env, "127.0.0.56", fill=0, kv_staging="sometimes")
    with pytest.raises(ConfigError, match="staging_size"):
        Engine(env, "127.0.0.56", fill=0, staging_size="lots")


def test_gpudirect_lands_other_nodes_blocks_over_rdma_and_stages_its_own(env, caplog):
    """``kv_gpudirect = peermem`` on the software RDMA fabric, which takes a registered address
    as device-visible memory: blocks another node holds land in B's caches one-sided (counted
    in RDMA bytes), B's own pages come through its load mirror (no RDMA read); byte-exact both.
    Where the node has no RDMA path (TCP) it is one warning and staged loads."""
    rdma = {"protocol": "rdma", "rdma_backend": "soft", "host_local": False}
    a = Engine(env, "127.0.0.57", fill=4, **rdma)
    b = Engine(env, "127.0.0.58", fill=5, kv_staging="always", kv_gpudirect="peermem", **rdma)
    try:
        settle(a, b)
        worker = b.worker._worker
        assert worker.gpudirect and worker._load_mirror is not None
        ids = prompts_sharing(10 * BLOCK + 5, 0, 1, seed=41)[0]
        src = list(range(3, 3 + 11))
        publish(a, "g-a", ids, src)

        def load(rid, ids, src_kv, src, dst):
            """B loads the full blocks of ``ids`` into ``dst``; byte-exact against ``src``; the
            bytes it read over RDMA meanwhile."""
            before = b.worker.store.stats()["rdma_read_bytes"]
            req = b.request(rid, ids)
            n, _ = b.sched.get_num_new_matched_tokens(req, 0)
            assert n == len(ids) - 1
            b.alloc(req, dst, n)
            b.step(req, dst, n, 1)
            assert b.worker.get_block_ids_with_load_errors() == set()
            full = len(ids) // BLOCK
            for name in src_kv:
                assert torch.equal(b.kv[name][dst[:full]], src_kv[name][src[:full]]), (rid, name)
            finish(b, req)
            return b.worker.store.stats()["rdma_read_bytes"] - before

        assert load("g-b", ids, a.kv, src, list(range(20, 31))) >= 10 * worker.table.block_bytes
        # B's own pages: not read over RDMA, staged, byte-exact.
        own = prompts_sharing(4 * BLOCK + 3, 0, 1, seed=43)[0]
        own_src = list(range(32, 37))
        publish(b, "g-own", own, own_src)
        assert load("g-own-again", own, b.kv, own_src, list(range(40, 45))) == 0, "own pages are not read over RDMA"
        # Caches whose memory is not in their logical order (FlashInfer's HND view) stage, but
        # raw bytes landing one-sided would be in the wrong order: GPUDirect stays off, one warning.
        from peercache.vllm.worker import WorkerSide  # noqa: PLC0415

        hnd = {n: t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for n, t in a.kv.items()}
        w = WorkerSide(b.worker.store, b.worker.scheme, NUM_BLOCKS, save_async=False, staging="always",
                       gpudirect="peermem")
        w.register(hnd)
        assert not w.gpudirect and w._load_mirror is not None
        assert any("physical layout" in r.getMessage() for r in caplog.records)
    finally:
        a.close()
        b.close()
    c = Engine(env, "127.0.0.59", fill=0, kv_staging="always", kv_gpudirect="peermem")  # TCP
    try:
        assert not c.worker._worker.gpudirect
        assert any("GPUDirect unavailable" in r.getMessage() for r in caplog.records)
    finally:
        c.close()
    with pytest.raises(ConfigError, match="kv_gpudirect"):
        Engine(env, "127.0.0.59", fill=0, kv_gpudirect="dmabuf")
    # vLLM 0.33's sleep mode remaps the KV caches: fine for what the node knows as host memory,
    # not for device registrations.
    assert PeerCacheConnector.supports_sleep_mode(KVTransferConfig(kv_connector="PeerCacheConnector", kv_role="kv_both"))
    assert not PeerCacheConnector.supports_sleep_mode(KVTransferConfig(
        kv_connector="PeerCacheConnector", kv_role="kv_both", kv_connector_extra_config={"kv_gpudirect": "peermem"}))


def test_a_tail_is_found_only_for_the_same_tokens_and_never_without_its_blocks(env):
    a = Engine(env, "127.0.0.41", fill=1)
    b = Engine(env, "127.0.0.42", fill=0)
    off = Engine(env, "127.0.0.43", fill=0, tail_pages=False)
    try:
        settle(a, b, off)
        ids = prompts_sharing(6 * BLOCK + 9, 0, 1, seed=11)[0]
        publish(a, "a5", ids, list(range(0, 7)))
        other_tail = ids[:-1] + [ids[-1] % 3999 + 1]
        assert b.sched.get_num_new_matched_tokens(b.request("t1", other_tail), 0) == (6 * BLOCK, False), \
            "another tail after the same blocks: the blocks only"
        assert b.sched.get_num_new_matched_tokens(b.request("t2", ids[:-2]), 0) == (6 * BLOCK, False), \
            "a shorter tail is another page"
        assert off.sched.get_num_new_matched_tokens(off.request("t3", ids), 0) == (6 * BLOCK, False), \
            "tail_pages off: full blocks only"
        a.worker.store.clear()
        publish(a, "a6", ids[:3 * BLOCK] + [1] * (3 * BLOCK) + ids[6 * BLOCK:], list(range(10, 17)))
        assert b.sched.get_num_new_matched_tokens(b.request("t4", ids), 0) == (3 * BLOCK, False), \
            "the tail of other blocks is never found: its key chains every block before it"
    finally:
        for e in (a, b, off):
            e.close()


def received(e, req_id, deadline=10.0):
    """Polls the worker's ``get_finished`` until it reports ``req_id``'s load as ended."""
    import time  # noqa: PLC0415

    until = time.monotonic() + deadline
    while time.monotonic() < until:
        _, recving = e.worker.get_finished(set())
        if recving:
            assert recving == {req_id}
            return True
        time.sleep(0.01)
    return False


def async_load(e, req, dst, external):
    """vLLM's asynchronous load: the request waits (it is not scheduled) while the worker
    loads its blocks between steps; returns the step's meta once the worker reported it."""
    e.alloc(req, dst, external)
    meta = e.sched.build_connector_meta(SchedulerOutput.make_empty())
    e.worker.bind_connector_metadata(meta)
    e.worker.start_load_kv(None)
    e.worker.wait_for_save()
    assert received(e, req.request_id), "the load never ended"
    e.worker.clear_connector_metadata()
    return meta


def test_an_asynchronous_load_lands_between_steps_and_a_failed_one_is_still_reported(env):
    a = Engine(env, "127.0.0.45", fill=1)
    b = Engine(env, "127.0.0.46", fill=0, load_async=True)
    try:
        settle(a, b)
        ids = prompts_sharing(5 * BLOCK + 3, 0, 1, seed=13)[0]
        src = list(range(0, 6))
        publish(a, "a7", ids, src)
        req = b.request("b7", ids)
        assert b.sched.get_num_new_matched_tokens(req, 0) == (5 * BLOCK + 2, True)
        dst = list(range(40, 46))
        meta = async_load(b, req, dst, 5 * BLOCK + 2)
        assert not meta.loads and [len(io.block_ids) for io in meta.async_loads] == [6]
        assert b.worker.get_block_ids_with_load_errors() == set()
        for name in a.kv:
            assert torch.equal(b.kv[name][dst], a.kv[name][src]), name
        # Scheduled once loaded: nothing is loaded again, nothing it loaded is published.
        assert not b.step(req, dst, 5 * BLOCK + 2, 1).loads
        # The pages go between the lookup and the load: the request is reported all the same,
        # its blocks as load errors no later than that.
        req2 = b.request("b8", ids)
        assert b.sched.get_num_new_matched_tokens(req2, 0) == (5 * BLOCK + 2, True)
        a.worker.store.clear()
        dst2 = list(range(30, 36))
        async_load(b, req2, dst2, 5 * BLOCK + 2)
        assert b.worker.get_block_ids_with_load_errors() == set(dst2)
    finally:
        a.close()
        b.close()


def test_a_preempted_or_finished_request_s_blocks_are_held_until_its_saves_end(env):
    a = Engine(env, "127.0.0.44", fill=1)
    try:
        ids = prompts_sharing(8 * BLOCK, 0, 1, seed=12)[0]
        req = a.request("p1", ids)
        assert a.sched.get_num_new_matched_tokens(req, 0) == (0, False)
        a.alloc(req, list(range(0, 8)), 0)
        meta = a.step(req, list(range(0, 8)), 0, 8 * BLOCK)
        assert [len(io.block_ids) for io in meta.saves] == [8]
        so = SchedulerOutput.make_empty()
        so.preempted_req_ids = {"p1"}
        pmeta = a.sched.build_connector_meta(so)
        assert pmeta.preempted == ["p1"]
        a.worker.handle_preemptions(pmeta)  # returns once p1's saves ended: its blocks may go
        stats = a.worker.get_kv_connector_stats()
        assert stats is not None and stats.data["saved_blocks"] == 8, "every save ended before"
        assert finish(a, req)
    finally:
        a.close()


def test_a_layout_mismatch_is_a_miss(env):
    a = Engine(env, "127.0.0.33", fill=1)
    other_dtype = Engine(env, "127.0.0.34", fill=0, dtype="float16")
    other_block = Engine(env, "127.0.0.35", fill=0, block_size=64)
    try:
        settle(a, other_dtype, other_block)
        ids = prompts_sharing(4 * 64 + 3, 0, 1, seed=8)[0]
        publish(a, "a2", ids, list(range(0, 9)))
        for e in (other_dtype, other_block):
            assert e.sched.get_num_new_matched_tokens(e.request("x", ids), 0) == (0, False)
        # A CUDA engine of the same model lays its blocks out otherwise (a staged page holds
        # its blocks' bytes as they are): the device type is in the namespace too.
        import dataclasses  # noqa: PLC0415

        assert a.sched.layout.device == a.worker.layout.device == "cpu"
        assert namespace(dataclasses.replace(a.sched.layout, device="cuda")) != a.sched.scheme.namespace
    finally:
        for e in (a, other_dtype, other_block):
            e.close()


def test_a_missing_page_is_reported_for_recompute_never_loaded_wrong(env):
    a = Engine(env, "127.0.0.36", fill=1)
    b = Engine(env, "127.0.0.37", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(6 * BLOCK + 1, 0, 1, seed=9)[0]
        publish(a, "a3", ids, list(range(0, 7)))
        req = b.request("b3", ids)
        assert b.sched.get_num_new_matched_tokens(req, 0) == (6 * BLOCK, False)
        a.worker.store.clear()  # the pages go between the lookup and the load
        dst = list(range(10, 17))
        b.alloc(req, dst, 6 * BLOCK)
        b.step(req, dst, 6 * BLOCK, 1)
        assert b.worker.get_block_ids_with_load_errors() == set(dst[:6])
        assert b.worker.get_block_ids_with_load_errors() == set(), "reported once"
    finally:
        a.close()
        b.close()


def test_a_wrong_secret_and_a_dead_owner_are_misses_within_the_deadline(env, tmp_path):
    import time  # noqa: PLC0415

    a = Engine(env, "127.0.0.38", fill=1)
    ids = prompts_sharing(4 * BLOCK + 1, 0, 1, seed=10)[0]
    publish(a, "a4", ids, list(range(0, 5)))
    wrong = tmp_path / "wrong"
    wrong.write_text(secrets.token_hex(16))
    wrong.chmod(0o600)
    stranger = Engine(env, "127.0.0.39", fill=0, secret=str(wrong), startup_timeout=2)
    try:
        t0 = time.monotonic()
        assert stranger.sched.get_num_new_matched_tokens(stranger.request("s", ids), 0) == (0, False)
        assert time.monotonic() - t0 < 10
    finally:
        stranger.close()
    b = Engine(env, "127.0.0.40", fill=0)
    try:
        settle(a, b)
        req = b.request("b4", ids)
        assert b.sched.get_num_new_matched_tokens(req, 0) == (4 * BLOCK, False)
        a.close()  # the owner leaves between the lookup and the load
        dst = list(range(30, 35))
        b.alloc(req, dst, 4 * BLOCK)
        t0 = time.monotonic()
        b.step(req, dst, 4 * BLOCK, 1)
        assert time.monotonic() - t0 < 10
        assert b.worker.get_block_ids_with_load_errors() == set(dst[:4])
    finally:
        b.close()


def test_a_non_cryptographic_hash_without_a_shared_seed_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="PYTHONHASHSEED"):
        check_hash_algo("xxhash", env={})
    check_hash_algo("xxhash", env={"PYTHONHASHSEED": "0"})
    check_hash_algo("sha256", env={})


def events_of(e, deadline=10.0):
    """The worker's report handed to the scheduler, as vLLM does each step; the scheduler's
    events. Waits (bounded) for a report when the saves run on the save thread."""
    import time  # noqa: PLC0415

    until = time.monotonic() + deadline
    report = e.worker.get_kv_connector_kv_cache_events()
    while report is None and time.monotonic() < until:
        time.sleep(0.01)
        report = e.worker.get_kv_connector_kv_cache_events()
    e.sched.update_connector_output(KVConnectorOutput(kv_cache_events=report))
    return list(e.sched.take_events())


def test_stored_blocks_are_announced_as_vllm_block_stored_events_with_their_tokens(env):
    a = Engine(env, "127.0.0.37", fill=1, kv_events=True)
    try:
        settle(a)
        ids = prompts_sharing(3 * BLOCK + 5, 0, 1, seed=11)[0]
        req = publish(a, "ev-1", ids, [4, 5, 6, 7])
        got = events_of(a)
        # The three full blocks, chained as vLLM chains them; the tail page is no vLLM block.
        assert [type(e) for e in got] == [BlockStored] * 3, got
        for i, e in enumerate(got):
            # The engine's own events name blocks so (an int unless VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
            assert e.block_hashes == [maybe_convert_block_hash(req.block_hashes[i])]
            assert e.parent_block_hash == (maybe_convert_block_hash(req.block_hashes[i - 1]) if i else None)
            assert e.token_ids == ids[i * BLOCK:(i + 1) * BLOCK]
            assert (e.block_size, e.medium) == (BLOCK, "cpu")
        assert events_of(a, deadline=0.05) == [], "each block is announced once"
    finally:
        a.close()


def test_a_block_is_announced_only_once_every_worker_stored_it():
    block = 4
    hashes = [bytes([i]) * 32 for i in range(3)]
    s = StoredBlocks(workers=2, block_size=block, max_pending=8)
    s.planned(hashes, None, list(range(12)))
    one = PeerCacheKVEvents.of_hashes([h.hex() for h in hashes[:2]] + ["t0123"], block)
    s.reported(one)
    assert s.take() == [], "one of two ranks stored them"
    s.reported(PeerCacheKVEvents.of_hashes([hashes[0].hex()], block))
    got = s.take()
    assert [e.block_hashes for e in got] == [[maybe_convert_block_hash(hashes[0])]]
    assert got[0].token_ids == [0, 1, 2, 3] and got[0].parent_block_hash is None
    assert s.pending() == 2
    # Blocks whose saves never land everywhere are forgotten past the bound, oldest first.
    s.planned([bytes([9, i]) * 16 for i in range(10)], hashes[2], list(range(40)))
    assert s.pending() == 8 and s.dropped == 4
    s.reported(PeerCacheKVEvents.of_hashes([hashes[1].hex()] * 2, block))
    assert s.take() == [], "hashes[1] was forgotten: never announced half-stored"


def hint_counts(before, after):
    """(hint hits, hint misses, directory requests) a node counted between two ``stats()``."""
    return (after["read_hint_hits"] - before["read_hint_hits"], after["read_hint_misses"] - before["read_hint_misses"],
            after["directory_rpcs"] + after["directory_local_calls"]
            - before["directory_rpcs"] - before["directory_local_calls"])


def load_hinted(a, b, req, src):
    """One hinted request on engine ``b`` of the blocks ``a`` published from ``src``: the
    scheduler's lookup, then the worker's load into fresh blocks, checked byte for byte. Returns
    the step's meta and what the scheduler's and the worker's nodes counted (``hint_counts``)."""
    asked = b.sched.store.stats()
    n, _ = b.sched.get_num_new_matched_tokens(req, 0)
    assert n == 7 * BLOCK, "every full block but the one holding the last token"
    told = b.sched.store.stats()
    dst = list(range(20, 28))
    for name in b.kv:
        b.kv[name][dst] = 0
    b.alloc(req, dst, n)
    before = b.worker.store.stats()
    meta = b.step(req, dst, n, 1)
    after = b.worker.store.stats()
    assert b.worker.get_block_ids_with_load_errors() == set(), req.request_id
    for name in a.kv:
        # The last block is vLLM's own to compute (it holds the last token); the rest loaded.
        assert torch.equal(b.kv[name][dst[:7]], a.kv[name][src[:7]]), (req.request_id, name)
    finish(b, req)
    return meta, hint_counts(asked, told), hint_counts(before, after)


def test_a_router_hint_in_kv_transfer_params_loads_from_the_holder_without_the_directory(env):
    a = Engine(env, "127.0.0.33", fill=1)
    b = Engine(env, "127.0.0.34", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(8 * BLOCK, 0, 1, seed=23)[0]
        src = list(range(3, 11))
        publish(a, "h-a", ids, src)
        holder = a.worker.store.node_id
        for rid, params, hits, misses in [("h-1", {"holder_node": holder}, 7, 0),
                                          ("h-2", {"holder_node": b.worker.store.node_id}, 0, 7),
                                          ("h-3", {"holder_node": 17}, 0, 0)]:
            meta, sched, worker = load_hinted(a, b, b.request(rid, ids, kv_transfer_params=params), src)
            assert [io.hint_for(0) for io in meta.loads] == [params["holder_node"] if hits + misses else None]
            # The scheduler's lookup and the worker's load both ask the holder first: with a
            # right hint, no directory request at all.
            assert sched[:2] == (hits, misses) and worker[:2] == (hits, misses), (rid, sched, worker)
            if hits:
                assert sched[2] == 0 and worker[2] == 0, (rid, sched, worker)
    finally:
        a.close()
        b.close()


def test_an_engine_hint_names_each_worker_ranks_own_holder(env):
    """``holder_engine`` names an engine: worker rank r asks ``<engine>-r<r>`` (with TP/PP > 1
    every rank saved its own share on its own node). Rank 0 of the reader finds the holder's
    rank-0 node; the same hint read as rank 1 asks a node that does not exist and falls back to
    the directory — the same bytes either way."""
    a = Engine(env, "127.0.0.47", fill=1)
    b = Engine(env, "127.0.0.48", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(8 * BLOCK, 0, 1, seed=29)[0]
        src = list(range(3, 11))
        publish(a, "e-a", ids, src)
        holder = a.worker.store.node_id
        assert holder.endswith("-r0"), holder
        engine = holder[:-len("-r0")]
        for rank, hits, misses in [(0, 7, 0), (1, 0, 7)]:
            b.worker._worker.rank = rank
            req = b.request(f"e-{rank}", ids, kv_transfer_params={"holder_engine": engine})
            meta, sched, worker = load_hinted(a, b, req, src)
            # The scheduler asks about rank 0's pages, so rank 0's holder answers it.
            assert sched[:2] == (7, 0), (rank, sched)
            assert [(io.hint, io.hint_per_rank, io.hint_for(rank)) for io in meta.loads] == [
                (engine, True, f"{engine}-r{rank}")]
            assert worker[:2] == (hits, misses), (rank, worker)
    finally:
        a.close()
        b.close()


def test_a_router_computes_the_keys_the_engine_asks_for_and_finds_their_holder(env):
    """``peercache.vllm.routing``: from a prompt's token ids alone, a router gets the very keys
    the connector asks about for a real ``Request`` hashed by vLLM's own block hasher (with and
    without a ``cache_salt``), and ``prefix_locations`` of them names the engine that published
    the prompt; bad arguments are refused with a typed error."""
    a = Engine(env, "127.0.0.51", fill=1)
    b = Engine(env, "127.0.0.52", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(6 * BLOCK + 9, 0, 1, seed=31)[0]
        ns = a.sched.scheme.namespace
        assert ns == namespace(a.sched.layout) == b.worker.scheme.namespace
        router = RequestKeys(ns, BLOCK)
        keys = router.keys(ids)
        req = b.request("r-1", ids)
        assert len(keys) == 6 == len(req.block_hashes)
        assert keys == a.sched.scheme.keys([bytes(h).hex() for h in req.block_hashes])
        salted = Request("r-2", ids, SamplingParams(max_tokens=4), None, block_hasher=b.hasher, cache_salt="tenant-7")
        salted_keys = router.keys(ids, cache_salt="tenant-7")
        assert salted_keys == a.sched.scheme.keys([bytes(h).hex() for h in salted.block_hashes])
        assert not set(salted_keys) & set(keys), "the salt enters the first block, so every chained hash"
        assert router.keys(ids[:BLOCK - 1]) == []

        publish(a, "r-a", ids, list(range(3, 10)))
        runs = b.worker.store.prefix_locations(keys)
        assert [(r.node, r.leading) for r in runs] == [(a.worker.store.node_id, 6)]
        assert b.worker.store.prefix_locations(salted_keys) == []

        with pytest.raises(ConfigError, match="block_size"):
            RequestKeys(ns, 0)
        with pytest.raises(ConfigError, match="namespace"):
            RequestKeys("", BLOCK)
        with pytest.raises(ConfigError, match="PYTHONHASHSEED"):
            block_hashes(ids, BLOCK, "xxhash", env={})
        with pytest.raises(ConfigError, match="md5"):
            block_hashes(ids, BLOCK, "md5")
    finally:
        a.close()
        b.close()


def test_a_typed_kv_hint_envelope_names_the_holder_and_wins_over_transfer_params(env):
    """vLLM's ``KvHintsEnvelope`` on ``Request.kv_hints``: a ``peercache.holder`` action of a
    known major version names the holder (node or engine) and wins over ``kv_transfer_params``;
    other actions, an unknown major version and a payload that names nobody are passed over."""
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    from peercache.vllm.scheduler import HolderHint, envelope_hint

    def action(kind, version, payload):
        return KvHintAction(action_id="a", action_type=kind, action_version=version, payload=payload)

    def env_of(*actions):
        return KvHintsEnvelope(protocol_version="1.0", message_id="m", actions=list(actions))

    assert envelope_hint(None) is None
    assert envelope_hint(env_of(action("kv.fetch", "1.0", {"node": "x"}))) is None
    assert envelope_hint(env_of(action("peercache.holder", "2.0", {"node": "x"}))) is None
    assert envelope_hint(env_of(action("peercache.holder", "1.3", {"node": 7}))) is None
    assert envelope_hint(env_of(action("kv.fetch", "1.0", {}), action("peercache.holder", "1.1", {"engine": "e"}))) == \
        HolderHint("e", per_rank=True)
    # The same envelope decoded to builtins (how an engine may forward it) reads the same.
    built = {"protocol_version": "1.0", "message_id": "m",
             "actions": [{"action_id": "a", "action_type": "peercache.holder", "action_version": "1",
                          "payload": {"node": "n", "engine": "e"}}]}
    assert envelope_hint(built) == HolderHint("n")

    a = Engine(env, "127.0.0.49", fill=1)
    b = Engine(env, "127.0.0.50", fill=0)
    try:
        settle(a, b)
        ids = prompts_sharing(8 * BLOCK, 0, 1, seed=31)[0]
        src = list(range(3, 11))
        publish(a, "k-a", ids, src)
        holder = a.worker.store.node_id
        # The envelope names the holder; kv_transfer_params names a node without the pages.
        hints = env_of(action("peercache.holder", "1.0", {"node": holder}))
        req = b.request("k-1", ids, kv_transfer_params={"holder_node": b.worker.store.node_id}, kv_hints=hints)
        meta, sched, worker = load_hinted(a, b, req, src)
        assert [io.hint_for(0) for io in meta.loads] == [holder]
        assert sched == (7, 0, 0) and worker == (7, 0, 0), (sched, worker)
    finally:
        a.close()
        b.close()

"""SGLang 0.5.23's storage interface beyond the page calls, against its own classes (CPU only):
partial tail pages for the P/D hand-off, DeepSeek-V4's logical anchor in a real
``HostPoolGroup``, a bounded ``warmup``, SGLang's spellings of booleans, the validation
``on_host_pools_registered`` does, decode context parallelism (one writer per DCP shard) and
``HiCacheStorageExtraInfo.prefix_keys``.

Run by scripts/sglang-contract.sh; skipped (loudly) without the venv.
"""

import logging
import re
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the SGLang contract venv (scripts/sglang-contract.sh)")
pytest.importorskip("sglang", reason="the SGLang contract venv (scripts/sglang-contract.sh)")

from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.group import HostPoolGroup, PoolEntry  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from peercache.store import PeerCacheStore  # noqa: E402
from test_contract import PAGE, config, extra, fill, free_port, make, mha_host, mla_host, page_bytes  # noqa: E402
from test_v2 import SLOTS, dsv4_host, dsv4_idx, pool_page, randomize  # noqa: E402


def test_a_partial_tail_page_is_a_partial_hit_on_another_node():
    # A prefill rank publishes a prompt of 2 whole pages and 2 tokens of a third; a decode
    # rank on another node sees 10 tokens, then reads the pages with their valid counts.
    port = free_port()
    a, b = make(81, 81, port), make(82, 81, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        ha, hb = mha_host("page_first"), mha_host("page_first")
        a.register_mem_pool_host(ha)
        b.register_mem_pool_host(hb)
        fill(ha, 5)
        keys = ["pd-0", "pd-1", "pd-2"]
        info = HiCacheStorageExtraInfo(extra_info={"last_page_valid_tokens": 2})
        assert a.batch_set_v1(keys, torch.arange(0, 3 * PAGE), info) == [True] * 3
        assert b.wait_for_full_prefix(keys, 5.0) == 3
        assert b.batch_exists_tokens(keys) == 2 * PAGE + 2
        assert b.batch_exists(keys) == 3  # whole-page callers still see three pages
        dst = torch.arange(8 * PAGE, 11 * PAGE)
        assert b.batch_get_v1_valid(keys, dst) == [PAGE, PAGE, 2]
        for i in range(3):
            assert page_bytes(hb, 8 * PAGE + i * PAGE) == page_bytes(ha, i * PAGE), i
        # A whole page written the usual way reads back as whole; a miss as None.
        assert a.batch_set_v1(["pd-3"], torch.arange(3 * PAGE, 4 * PAGE)) == [True]
        assert b.wait_for_full_prefix(["pd-3"], 5.0) == 1
        assert b.batch_get_v1_valid(["pd-3", "pd-none"], torch.arange(0, 2 * PAGE)) == [PAGE, None]
        with pytest.raises(ValueError, match="last_page_valid_tokens"):
            a.batch_set_v1_partial(keys, torch.arange(0, 3 * PAGE), PAGE + 1)
    finally:
        a.close()
        b.close()


def v4_group():
    """A DeepSeek-V4-shaped ``HostPoolGroup``: a logical KV anchor and a compressed side pool."""
    anchor = LogicalHostPool(SLOTS * PAGE, PAGE)
    c4 = dsv4_host()
    group = HostPoolGroup([
        PoolEntry(name=PoolName.KV, host_pool=anchor, device_pool=None, layer_mapper=lambda l: l,
                  is_primary_index_anchor=True),
        PoolEntry(name=PoolName.DEEPSEEK_V4_C4, host_pool=c4, device_pool=None, layer_mapper=lambda l: l),
    ])
    return group, c4


def test_a_logical_anchor_misses_v1_once_warned_and_side_pools_resolve_by_name(caplog):
    port = free_port()
    a, b = make(83, 83, port), make(84, 83, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        (ga, c4a), (gb, c4b) = v4_group(), v4_group()
        # Only the group is registered: SGLang need not call register_mem_host_pool_v2 per entry.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="peercache"):
            a.register_mem_pool_host(ga)
            a.on_host_pools_registered()
            assert a.batch_set_v1(["v4-0", "v4-1"], torch.arange(0, 2 * PAGE)) == [False, False]
            assert a.batch_get_v1(["v4-0"], torch.arange(0, PAGE)) == [False]
        anchor_warnings = [r for r in caplog.records if "logical anchor" in r.getMessage()]
        assert len(anchor_warnings) == 1, [r.getMessage() for r in caplog.records]
        b.register_mem_pool_host(gb)
        b.on_host_pools_registered()
        randomize(c4a, 21)
        keys = ["v4-0", "v4-1"]
        t = [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(0, 2 * PAGE), keys=keys)]
        assert a.batch_set_v2(t) == {PoolName.DEEPSEEK_V4_C4: [True, True]}
        assert b.core.wait_for_full_prefix([b.pool_key("deepseek_v4_c4", c4b, k) for k in keys], 5.0) == 2
        got = b.batch_get_v2([PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, host_indices=torch.arange(4 * PAGE, 6 * PAGE),
                                           keys=keys)])
        assert got == {PoolName.DEEPSEEK_V4_C4: [True, True]}
        for i in range(2):
            assert pool_page(c4b, dsv4_idx(4 + i)) == pool_page(c4a, dsv4_idx(i))
        # With a logical anchor, the side pools decide the hit.
        r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DEEPSEEK_V4_C4, keys=keys)])
        assert r.kv_hit_pages == 2
    finally:
        a.close()
        b.close()


def test_warmup_is_bounded_when_the_meta_is_down():
    dead = free_port()  # nobody listens here
    cfg = extra(85, 85, dead)
    cfg.update({"startup_timeout": 1, "discovery_addr": f"127.0.0.86:{dead}", "meta_bind_host": "127.0.0.85"})
    t0 = time.monotonic()
    s = StorageBackendFactory.create_backend("dynamic", config(cfg), None)
    try:
        assert time.monotonic() - t0 < 10, "construction waits startup_timeout at most"
        t1 = time.monotonic()
        assert s.warmup() is False
        assert time.monotonic() - t1 < 5
        assert s.warmup(0.2) is False
        assert s.check_server() is False
    finally:
        s.close()
    # And against a cluster that is up, warmup says so at once.
    port = free_port()
    up = make(87, 87, port)
    try:
        t1 = time.monotonic()
        assert up.warmup() is True and time.monotonic() - t1 < 5
    finally:
        up.close()


def boolean_keys():
    """The boolean settings of docs/configuration.md (default `true` or `false`)."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    return [(m.group(1), m.group(2) == "true")
            for m in re.finditer(r"^\| `([a-z_0-9]+)` \| `(true|false)` \|", doc, re.M)]


@pytest.mark.parametrize("spelling,want", [(1, True), ("1", True), ("true", True), ("True", True), (True, True),
                                            (0, False), ("0", False), ("false", False), ("False", False)])
def test_interface_v1_takes_sglangs_spellings(spelling, want):
    cfg = extra(88, 88, free_port())
    cfg["interface_v1"] = spelling
    s = PeerCacheStore(config(cfg))
    try:
        assert s.interface_v1 is want
    finally:
        s.close()


def test_every_boolean_key_takes_sglangs_spellings_and_refuses_the_rest():
    keys = boolean_keys()
    assert len(keys) >= 8, keys
    cfg = extra(89, 89, free_port())
    # Each key at its own default, spelled the way SGLang's JSON or a shell may spell it.
    for i, (k, default) in enumerate(keys):
        cfg[k] = ("True" if default else "False") if i % 2 else ("1" if default else "0")
    s = PeerCacheStore(config(cfg))
    s.close()
    with pytest.raises(ValueError, match="interface_v1"):
        PeerCacheStore(config({**extra(90, 90, free_port()), "interface_v1": "maybe"}))
    with pytest.raises(Exception, match="host_local"):
        PeerCacheStore(config({**extra(90, 90, free_port()), "host_local": "maybe"}))


def test_on_host_pools_registered_fails_the_attach_for_a_bad_pool():
    port = free_port()
    a = make(91, 91, port)
    try:
        kv, c4 = mha_host("page_first"), dsv4_host()
        a.register_mem_pool_host(kv)
        a.register_mem_host_pool_v2(c4, PoolName.DEEPSEEK_V4_C4)
        a.on_host_pools_registered()  # a good set passes
        # A pool rebuilt after registration: its pages now live in memory the node never saw.
        c4.kv_buffer[0] = torch.zeros_like(c4.kv_buffer[0])
        with pytest.raises(ValueError, match="deepseek_v4_c4.*outside every registered host buffer"):
            a.on_host_pools_registered()
        # A pool with no page buffers registered as a side pool.
        b = make(92, 91, port)
        try:
            b.register_mem_pool_host(mha_host("page_first"))
            b.register_mem_host_pool_v2(LogicalHostPool(SLOTS * PAGE, PAGE), PoolName.SWA)
            with pytest.raises(ValueError, match="swa"):
                b.on_host_pools_registered()
        finally:
            b.close()
    finally:
        a.close()


def dcp_config(extra_config, tp_rank):
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=4, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=True, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="toy-model", extra_config=extra_config, dcp_size=2, dcp_rank=tp_rank % 2,
        logical_page_size=2 * PAGE,
    )


def test_dcp_shards_have_their_own_keys_and_one_writer_each():
    # TP 4 with DCP 2: ranks 0 and 2 hold shard 0 of every page, ranks 1 and 3 shard 1. The
    # first DCP group (ranks 0, 1) writes; ranks 2 and 3 read their shard's pages from them.
    port = free_port()
    ranks = [StorageBackendFactory.create_backend("dynamic", dcp_config(extra(93 + r, 93, port), r), None)
             for r in range(4)]
    try:
        for s in ranks:
            assert s.core.wait_members(4, 10)
        assert [s.is_storage_writer for s in ranks] == [True, True, False, False]
        hosts = [mla_host("page_first") for _ in ranks]
        for s, h in zip(ranks, hosts):
            s.register_mem_pool_host(h)
            s.on_host_pools_registered()
        for r, h in enumerate(hosts):
            fill(h, 30 + r)
        keys = ["dcp-0", "dcp-1"]
        for s in ranks:
            assert s.batch_set_v1(keys, torch.arange(0, 2 * PAGE)) == [True, True]
        # The non-writers published nothing; the writers one shard each.
        assert [s.stats()["pool_pages"] for s in ranks][2:] == [0, 0]
        assert ranks[0]._key("dcp-0") != ranks[1]._key("dcp-0")
        assert ranks[0]._key("dcp-0") == ranks[2]._key("dcp-0")
        for reader, writer in ((2, 0), (3, 1)):
            s = ranks[reader]
            assert s.wait_for_full_prefix(keys, 5.0) == 2
            assert s.batch_get_v1(keys, torch.arange(8 * PAGE, 10 * PAGE)) == [True, True]
            for i in range(2):
                assert page_bytes(hosts[reader], 8 * PAGE + i * PAGE) == page_bytes(hosts[writer], i * PAGE)
    finally:
        for s in ranks:
            s.close()


def test_prefix_keys_change_nothing():
    port = free_port()
    a = make(97, 97, port)
    try:
        kv = mha_host("page_first")
        a.register_mem_pool_host(kv)
        fill(kv, 40)
        keys = ["pk-0", "pk-1", "pk-2"]
        assert a.batch_set_v1(keys[:2], torch.arange(0, 2 * PAGE)) == [True, True]
        for info in (None, HiCacheStorageExtraInfo(prefix_keys=["before-0", "before-1"]),
                     HiCacheStorageExtraInfo(prefix_keys=[]), HiCacheStorageExtraInfo()):
            assert a.batch_exists(keys, info) == 2
            assert a.batch_get_v1(keys, torch.arange(4 * PAGE, 7 * PAGE), info) == [True, True, False]
            r = a.batch_exists_v2(keys, [], info)
            assert r.kv_hit_pages == 2
    finally:
        a.close()

"""PeerCacheStore through its SGLang-facing methods, two nodes on loopback in one process."""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import peercache
from peercache.core import PrefixRun, prefix_runs
from peercache.store import PeerCacheStore
from conftest import Config, HostPool, node_config


def make(n, seed, port, **kw):
    cfg = node_config(n, seed, port, interface_v1=1)
    extra = kw.pop("extra", {})
    cfg.update(extra)
    return PeerCacheStore(Config(cfg, **kw))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_v1_round_trip_is_byte_exact_across_nodes(port, layout):
    a, b = make(50, 50, port), make(51, 50, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        pa, pb = HostPool(layout=layout), HostPool(layout=layout)
        a.register_mem_pool_host(pa)
        b.register_mem_pool_host(pb)
        pa.fill(1)
        keys = [f"hash-{layout}-{i}" for i in range(5)]
        idx = np.arange(0, 5 * pa.page_size)
        assert a.batch_set_v1(keys, idx) == [True] * 5
        assert a.batch_set_v1(keys, idx) == [True] * 5, "re-setting stored pages is success"
        assert b.batch_exists(keys) == 5
        # Read into other slots of B's pool.
        dst = np.arange(8 * pb.page_size, 13 * pb.page_size)
        assert b.batch_get_v1(keys, dst) == [True] * 5
        assert pb.pages(dst) == pa.pages(idx)
        assert b.stats()["transport_read_bytes"] > 0
        # Both nodes share this host: after the first read B attaches to A's shared pool and
        # copies the pages out of it.
        deadline = time.monotonic() + 5
        while b.core.cluster()["transport"]["local_peers"] != 1:
            assert time.monotonic() < deadline, "B never attached to A"
            time.sleep(0.005)
        before = b.stats()
        dst = np.arange(2 * pb.page_size, 7 * pb.page_size)
        assert b.batch_get_v1(keys, dst) == [True] * 5
        assert pb.pages(dst) == pa.pages(idx)
        after = b.stats()
        local = after["transport_local_read_bytes"] - before["transport_local_read_bytes"]
        assert local == after["transport_read_bytes"] - before["transport_read_bytes"] > 0
    finally:
        a.close()
        b.close()


def test_host_local_off_reads_over_the_network(port):
    a = make(62, 62, port, extra={"host_local": False})
    b = make(63, 62, port, extra={"host_local": False})
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        pa, pb = HostPool(), HostPool()
        a.register_mem_pool_host(pa)
        b.register_mem_pool_host(pb)
        pa.fill(3)
        keys = [f"net-{i}" for i in range(4)]
        idx = np.arange(0, 4 * pa.page_size)
        assert a.batch_set_v1(keys, idx) == [True] * 4
        dst = np.arange(4 * pb.page_size, 8 * pb.page_size)
        assert b.batch_get_v1(keys, dst) == [True] * 4
        assert pb.pages(dst) == pa.pages(idx)
        st = b.stats()
        assert st["transport_read_bytes"] > 0 and st["transport_local_read_bytes"] == 0
    finally:
        a.close()
        b.close()


def test_a_hole_cuts_the_leading_count(port):
    a, b = make(52, 52, port), make(53, 52, port)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        pa, pb = HostPool(), HostPool()
        a.register_mem_pool_host(pa)
        b.register_mem_pool_host(pb)
        pa.fill(2)
        keys = [f"chain-{i}" for i in range(5)]
        ps = pa.page_size
        for i in (0, 1, 3, 4):
            assert a.batch_set_v1([keys[i]], np.arange(i * ps, (i + 1) * ps)) == [True]
        assert b.batch_exists(keys) == 2
        assert b.batch_get_v1(keys, np.arange(0, 5 * ps)) == [True, True, False, True, True]
    finally:
        a.close()
        b.close()


def test_decode_waits_for_the_prefill_prefix(port):
    prefill, decode = make(54, 54, port), make(55, 54, port)
    try:
        assert prefill.core.wait_members(2, 10) and decode.core.wait_members(2, 10)
        pp, pd = HostPool(), HostPool()
        prefill.register_mem_pool_host(pp)
        decode.register_mem_pool_host(pd)
        pp.fill(3)
        keys = [f"pd-{i}" for i in range(4)]
        idx = np.arange(0, 4 * pp.page_size)
        got = []
        waiter = threading.Thread(target=lambda: got.append(decode.wait_for_full_prefix(keys, 10.0)))
        waiter.start()
        assert prefill.batch_set_v1(keys, idx) == [True] * 4
        waiter.join(15)
        assert got == [4]
        t0 = time.monotonic()
        assert decode.wait_for_full_prefix(keys + ["pd-missing"], 0.1) == 4
        assert 0.1 <= time.monotonic() - t0 < 1.0
        with pytest.raises(ValueError):
            decode.core.wait_for_full_prefix(keys, -1.0)
    finally:
        prefill.close()
        decode.close()


def test_mla_ranks_read_what_rank_zero_wrote_and_mha_ranks_stay_apart(port):
    r0 = make(54, 54, port, tp_rank=0, tp_size=2, is_mla=True)
    r1 = make(55, 54, port, tp_rank=1, tp_size=2, is_mla=True)
    m0 = make(56, 54, port, tp_rank=0, tp_size=2)
    m1 = make(57, 54, port, tp_rank=1, tp_size=2)
    try:
        for s in (r0, r1, m0, m1):
            assert s.core.wait_members(4, 10)
        page = bytes(range(256)) * 16
        assert r0.batch_set(["h1"], [page])
        dst = bytearray(len(page))
        assert r1.batch_get(["h1"], [dst]) == [dst] and bytes(dst) == page
        assert m0.batch_set(["h1"], [page])
        assert m1.batch_exists(["h1"]) == 0, "MHA ranks hold different heads: never the same key"
    finally:
        for s in (r0, r1, m0, m1):
            s.close()


def test_generic_path_with_bytes_arrays_and_a_read_only_destination(port):
    a = make(58, 58, port)
    try:
        vals = [os.urandom(4096) for _ in range(3)]
        arr = np.frombuffer(os.urandom(4096), dtype=np.uint8).copy()
        assert a.batch_set(["g0", "g1", "g2"], vals)
        assert a.set("g3", arr)
        assert a.exists("g0") and a.batch_exists(["g0", "g1", "g2", "g3", "nope"]) == 4
        out = [bytearray(4096) for _ in range(3)] + [np.zeros(4096, dtype=np.uint8)]
        got = a.batch_get(["g0", "g1", "g2", "g3"], out)
        assert [bytes(x) for x in got[:3]] == vals and np.array_equal(got[3], arr)
        assert a.batch_get(["missing"], [bytearray(4096)]) == [None]
        with pytest.raises(ValueError, match="read-only"):
            a.batch_get(["g0"], [bytes(4096)])
        # One buffer per key, or a ValueError naming both counts (nothing is read or written).
        with pytest.raises(ValueError, match="2 keys but 1 destinations"):
            a.core.get_buffers(["g0", "g1"], [bytearray(4096)])
        with pytest.raises(ValueError, match="1 keys but 2 values"):
            a.core.put_buffers(["g9"], [vals[0], vals[1]])
        assert a.batch_exists(["g9"]) == 0
        assert a.check_server()
        a.clear()
        assert a.batch_exists(["g0"]) == 0
    finally:
        a.close()
        a.close()  # idempotent


def test_a_client_without_a_node_puts_and_gets_through_the_client_api(port):
    secret = "python client api secret, long enough"
    extra = {"client_enabled": True, "cluster_secret": secret}
    a, b = make(58, 58, port, extra=extra), make(59, 58, port, extra=extra)
    try:
        assert a.core.wait_members(2, 10) and b.core.wait_members(2, 10)
        assert a.core.client_endpoint and b.core.client_endpoint
        ca = peercache.Client(a.core.client_endpoint, cluster_secret=secret)
        cb = peercache.Client(b.core.client_endpoint, cluster_secret=secret, timeout=5)
        pages = [bytes([i]) * 8192 for i in range(6)]
        keys = [f"pyclient-{i}" for i in range(6)]
        assert ca.put(keys, pages) == [True] * 6
        # Read through the other node: its own pool is empty, so these are remote reads.
        got = cb.get(keys + ["never-written"], 8192)
        assert got[:6] == pages and got[6] is None
        assert cb.exists(["pyclient-0", "never-written"]) == [True, False]
        where = json.loads(cb.locate_json(["pyclient-0", "never-written"]))
        assert [o["node"] for o in where[0]] == [a.core.node_id] and where[0][0]["resident"]
        assert where[1] == []
        # Prefix location: the run each node holds, from the client and from a node alike.
        b.core.put_buffers(keys[:2], pages[:2])  # b holds a copy of the first two
        assert prefix_runs(cb.prefix_locations_json(keys + ["never-written"])) == [
            PrefixRun(a.core.node_id, 6, 6), PrefixRun(b.core.node_id, 2, 2)]
        assert b.core.prefix_locations(keys) == a.core.prefix_locations(keys)
        assert a.core.prefix_locations(["never-written"] + keys) == [], "nobody holds the first key"
        assert b.stats()["transport_read_bytes"] >= 6 * 8192
        # Numpy arrays and memoryviews work as pages too.
        arr = np.full(8192, 7, dtype=np.uint8)
        assert ca.put(["pyclient-np"], [memoryview(arr)]) == [True]
        assert cb.get(["pyclient-np"], 8192)[0] == arr.tobytes()
        # Bad input: clear errors, never a partial page.
        with pytest.raises(ValueError):
            ca.put(["x", "y"], [b"ab", b"abc"])
        with pytest.raises(ValueError):
            cb.get(["x"], 0)
        with pytest.raises(ValueError):
            peercache.Client("not an endpoint")
        with pytest.raises(RuntimeError, match="authenticat"):
            peercache.Client(a.core.client_endpoint).exists(["pyclient-0"])
        # The read-only client token: reads and lookups, no writes.
        token = peercache.read_only_token(secret)
        assert len(token) == 64 and token == peercache.read_only_token(secret) and secret not in token
        ro = peercache.Client(b.core.client_endpoint, cluster_secret=token, timeout=5)
        assert ro.get(keys, 8192) == pages and ro.exists(["pyclient-0"]) == [True]
        with pytest.raises(peercache.TransportError, match="read-only"):
            ro.put(["pyclient-ro"], [pages[0]])
        assert cb.exists(["pyclient-ro"]) == [False]
        with pytest.raises(ValueError):
            peercache.read_only_token("short")
    finally:
        a.close()
        b.close()


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="discovery_addr"):
        PeerCacheStore(Config({"interface_v1": 1}))
    with pytest.raises(ValueError, match="global_segment_size"):
        PeerCacheStore(Config({"discovery_addr": "127.0.0.1:1", "global_segment_size": "lots"}))


OWNER = textwrap.dedent(
    """
    import json, sys, time
    from peercache.store import PeerCacheStore
    sys.path.insert(0, {tests!r})
    from conftest import Config, node_config
    s = PeerCacheStore(Config(node_config(60, 60, {port})))
    s.core.wait_members(2, 10)
    assert s.batch_set(["stall-" + str(i) for i in range(64)], [bytes(4096)] * 64)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_a_get_waiting_on_a_stalled_peer_does_not_hold_the_gil(port):
    tests = os.path.dirname(__file__)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(tests=tests, port=port)], stdout=subprocess.PIPE, text=True
    )
    reader = None
    try:
        reader = make(61, 60, port)
        assert reader.core.wait_members(2, 10)
        assert owner.stdout.readline().strip() == "ready"
        keys = ["stall-" + str(i) for i in range(64)]
        assert reader.batch_exists(keys) == 64
        owner.send_signal(19)  # SIGSTOP: the owner accepts nothing and answers nothing
        ticks = 0
        stop = threading.Event()

        def spin():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                time.sleep(0.001)

        t = threading.Thread(target=spin)
        t.start()
        t0 = time.monotonic()
        got = reader.batch_get(keys, [bytearray(4096) for _ in keys])
        took = time.monotonic() - t0
        stop.set()
        t.join()
        assert all(g is None for g in got), "a stalled owner's pages are misses"
        assert took < 3.5, f"the read must give up near op_timeout (1 s), took {took:.2f} s"
        assert ticks > 100, f"another Python thread ran only {ticks} times during the wait"
    finally:
        owner.send_signal(18)  # SIGCONT, then kill
        owner.kill()
        owner.wait()
        if reader is not None:
            reader.close()


def test_import_without_sglang_is_silent():
    r = subprocess.run([sys.executable, "-c", "import peercache, peercache.store"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""
    assert peercache.__version__


# ----- v2 on SGLang releases without (all of) the v2 types: stub sglang packages -----

_STUB_BASE = '''
class HiCacheStorage:
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host
'''

# 0.5.19-style: v2 types exist, but the result has no restorable_prefix_pages yet.
_STUB_OLD_RESULT = _STUB_BASE + '''
import enum
from dataclasses import dataclass

class PoolName(str, enum.Enum):
    KV = "kv"
    MAMBA = "mamba"

@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict
'''

_V2_SCRIPT = '''
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from conftest import Config, HostPool, node_config
from peercache.store import PeerCacheStore

class T:  # a PoolTransfer as older releases shape it: name, host_indices, keys, hit_policy
    def __init__(self, name, keys, host_indices=None, hit_policy="all_pages"):
        self.name, self.keys, self.host_indices, self.hit_policy = name, keys, host_indices, hit_policy

s = PeerCacheStore(Config(node_config(90, 90, {port})))
kv, side = HostPool(), HostPool(pages=8, page_size=1)
side.fill(3)
s.register_mem_pool_host(kv)
s.register_mem_host_pool_v2(side, "mamba")
keys = ["a", "b", "c"]
assert s.batch_set_v1(keys, np.arange(0, 12)) == [True] * 3
w = s.batch_set_v2([T("mamba", keys[:2], np.arange(0, 2))])
r = s.batch_exists_v2(keys, [T("mamba", keys)])
print(json.dumps({{"cls": type(r).__module__ + "." + type(r).__name__, "kv": r.kv_hit_pages,
                   "hits": {{str(getattr(k, "value", k)): v for k, v in r.extra_pool_hit_pages.items()}},
                   "restorable": getattr(r, "restorable_prefix_pages", "absent"), "written": list(w.values())}}))
s.close()
'''


def _run_with_stub(tmp_path, port, stub_source):
    if stub_source is not None:
        mod = tmp_path / "sglang" / "srt" / "mem_cache"
        mod.mkdir(parents=True)
        for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", mod):
            (d / "__init__.py").write_text("")
        (mod / "hicache_storage.py").write_text(stub_source)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    script = _V2_SCRIPT.format(tests=os.path.dirname(__file__), port=port)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    import json
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_v2_on_a_release_whose_result_has_no_restorable_pages(tmp_path, port):
    out = _run_with_stub(tmp_path, port, _STUB_OLD_RESULT)
    assert out["cls"] == "sglang.srt.mem_cache.hicache_storage.PoolTransferResult"
    assert out["kv"] == 2 and out["hits"] == {"kv": 3, "mamba": 2}
    assert out["restorable"] == "absent" and out["written"] == [[True, True]]


def test_v2_on_a_release_without_v2_types_uses_the_stand_in(tmp_path, port):
    out = _run_with_stub(tmp_path, port, _STUB_BASE)  # 0.5.9–0.5.18: no PoolName, no result type
    assert out["cls"] == "peercache.store._PoolTransferResult"
    assert out["kv"] == 2 and out["hits"] == {"kv": 3, "mamba": 2} and out["restorable"] == [1, 2]


def test_v2_without_sglang_at_all(tmp_path, port):
    out = _run_with_stub(tmp_path, port, None)
    assert out["cls"] == "peercache.store._PoolTransferResult"
    assert out["kv"] == 2 and out["restorable"] == [1, 2] and out["written"] == [[True, True]]

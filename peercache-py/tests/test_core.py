"""peercache.core: the page store every adapter sits on, on loopback (the module's example)."""

import numpy as np
import pytest

import peercache
from peercache.core import KeyScheme, PageStore, Segments, as_bool, layout_fingerprint, ptr_len
from conftest import node_config


def test_the_module_example_round_trips_a_page(port):
    store = PageStore(node_config(60, 60, port), startup_timeout=10)
    try:
        assert store.wait_ready()
        page = bytearray(b"k" * 4096)
        assert store.put_buffers(["model|h0"], [page]) == [True]
        out = bytearray(4096)
        assert store.get_buffers(["model|h0"], [out]) == [True] and out == page
        # Registered host memory, two segments a page, one batch.
        mem = np.arange(4 * 4096, dtype=np.uint8)
        ptr, n = ptr_len(mem)
        assert store.register_host(ptr, n) is True
        assert store.register_host(ptr + 4096, 4096) is False, "inside a registered span"
        segs = Segments()
        segs.add_page([ptr, ptr + 2 * 4096], [4096, 4096])
        assert store.put(["model|h1"], segs) == [True]
        dst = np.zeros(2 * 4096, dtype=np.uint8)
        dptr, _ = ptr_len(dst)
        store.register_host(dptr, dst.nbytes)
        back = Segments()
        back.add_page([dptr, dptr + 4096], [4096, 4096])
        assert store.get(["model|h1"], back) == [True]
        assert (dst[:4096] == mem[:4096]).all() and (dst[4096:] == mem[2 * 4096:3 * 4096]).all()
        assert store.leading(["model|h0", "model|h1", "model|nope", "model|h0"]) == 2
        assert store.contains(["model|nope", "model|h1"]) == [False, True]
    finally:
        store.close()


def test_errors_raise_by_kind_the_callers_as_value_error_the_clusters_as_peercache_error(port):
    store = PageStore(node_config(62, 62, port), startup_timeout=10)
    assert store.wait_ready()
    with pytest.raises(ValueError, match="seconds"):
        store.wait_members(1, -1.0)  # the caller's mistake
    store.close()
    # A closed node: the cluster side, typed, and still a RuntimeError for older handlers.
    with pytest.raises(peercache.ShutdownError, match="shut down") as e:
        store._node.batch_exists(["model|a"])
    assert isinstance(e.value, peercache.PeerCacheError) and isinstance(e.value, RuntimeError)
    for kind in (peercache.DirectoryError, peercache.TransportError, peercache.DiscoveryError):
        assert issubclass(kind, peercache.PeerCacheError) and not issubclass(kind, ValueError)


def test_a_large_pool_serves_while_it_warms_and_says_how_far_it_is(port, caplog):
    # 2 GiB on one faulting thread: seconds of warming after the node is in the cluster.
    cfg = node_config(61, 61, port, global_segment_size="2gb", pool_fault_threads=1)
    store = PageStore(cfg, startup_timeout=10)
    try:
        with caplog.at_level("INFO", logger="peercache"):
            assert store.wait_ready()
        ready, total = store.pool_readiness()
        assert 0 < ready <= total and total >= 2 * 2**30 - 64 * 2**20
        page = bytearray(b"w" * 4096)
        assert store.put_buffers(["model|warm"], [page]) == [True]
        out = bytearray(4096)
        assert store.get_buffers(["model|warm"], [out]) == [True] and out == page
        if ready < total:
            assert "pool warming in the background" in caplog.text
    finally:
        store.close()


def test_keys_and_fingerprints_are_stable_and_distinct():
    s = KeyScheme("m", ("tp0of2", "pp1"))
    assert s.keys(["ab", "cd"]) == ["m|ab|tp0of2|pp1", "m|cd|tp0of2|pp1"]
    a = layout_fingerprint({"model": "x", "dtype": "bfloat16", "block_size": 32})
    assert a == layout_fingerprint({"block_size": 32, "dtype": "bfloat16", "model": "x"})
    assert a != layout_fingerprint({"model": "x", "dtype": "float16", "block_size": 32})
    assert len(a) == 16


def test_booleans_are_parsed_strictly():
    assert as_bool("Yes") is True and as_bool(0) is False and as_bool(None) is False
    with pytest.raises(ValueError, match="expected"):
        as_bool("maybe")


def test_page_hash_is_the_page_key_kv_events_carry():
    # The documented test vector of the key grammar (docs/architecture.md), big endian.
    assert peercache.page_hash("hello") == bytes.fromhex("b5e9c1ad071b3e7fc779cfaa5e523818")
    assert peercache.page_hash("abc", prefix="tenant-a") == peercache.page_hash("tenant-a_abc")
    assert len(peercache.page_hash("")) == 16

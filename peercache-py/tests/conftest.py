"""Shared helpers: free ports, node configs on loopback, and a stand-in SGLang host pool."""

import os
import secrets
import socket

import numpy as np
import pytest


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# The cluster secret every test node proves: generated per test session, and inherited by the
# node processes a test starts (they import this module too).
TEST_SECRET = os.environ.setdefault("PC_TEST_CLUSTER_SECRET", secrets.token_hex(16))


def node_config(n: int, seed: int, port: int, **extra):
    host = f"127.0.0.{n}"
    cfg = {
        "discovery_addr": f"127.0.0.{seed}:{port}",
        "protocol": "tcp",
        "local_hostname": host, "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
        "global_segment_size": "32mb",
        "heartbeat_interval": 0.2, "member_ttl": 0.6, "op_timeout": 1.0,
        "metrics_enabled": False,
        "startup_timeout": 10,
        "cluster_secret": TEST_SECRET,
    }
    cfg.update(extra)
    return cfg


class Config:
    """The fields of SGLang's HiCacheStorageConfig the backend reads."""

    def __init__(self, extra, tp_rank=0, tp_size=1, is_mla=False, model="toy-model"):
        self.tp_rank, self.tp_size, self.pp_rank, self.pp_size = tp_rank, tp_size, 0, 1
        self.is_mla_model = is_mla
        self.model_name = model
        self.extra_config = extra


class HostPool:
    """A stand-in for SGLang's host KV pool: a numpy kv_buffer and get_page_buffer_meta in the
    MHA layouts ``page_first`` ([K, V] per page) and ``layer_first`` ([L0.K, L0.V, …])."""

    def __init__(self, pages=16, page_size=4, layers=3, heads=2, dim=8, layout="page_first"):
        self.page_size, self.layers, self.layout = page_size, layers, layout
        self.size = pages * page_size
        self.tok = heads * dim * 2  # fp16 bytes per token per layer
        if layout == "page_first":
            self.kv_buffer = np.zeros((2, self.size, layers, heads * dim * 2), dtype=np.uint8)
        else:
            self.kv_buffer = np.zeros((2, layers, self.size, heads * dim * 2), dtype=np.uint8)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        base = self.kv_buffer.__array_interface__["data"][0]
        half = self.kv_buffer.nbytes // 2
        for first in indices[:: self.page_size]:
            if self.layout == "page_first":
                off = int(first) * self.layers * self.tok
                n = self.page_size * self.layers * self.tok
                ptrs += [base + off, base + half + off]
                sizes += [n, n]
            else:
                for layer in range(self.layers):
                    off = (layer * self.size + int(first)) * self.tok
                    n = self.page_size * self.tok
                    ptrs += [base + off, base + half + off]
                    sizes += [n, n]
        return ptrs, sizes

    def fill(self, seed):
        rng = np.random.default_rng(seed)
        self.kv_buffer[...] = rng.integers(0, 256, self.kv_buffer.shape, dtype=np.uint8)

    def pages(self, indices):
        """The bytes of each page (all segments, in meta order)."""
        ptrs, sizes = self.get_page_buffer_meta(indices)
        per = len(ptrs) // (len(indices) // self.page_size)
        flat = self.kv_buffer.reshape(-1)
        base = self.kv_buffer.__array_interface__["data"][0]
        out = []
        for p in range(0, len(ptrs), per):
            out.append(b"".join(flat[ptrs[i] - base: ptrs[i] - base + sizes[i]].tobytes() for i in range(p, p + per)))
        return out


@pytest.fixture
def port():
    return free_port()

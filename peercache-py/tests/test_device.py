"""Device (GPU) memory from Python on the software RDMA fabric: a memfd stands in for the GPU
driver's dma-buf, addressed by an iova this process never maps. Pages land there one-sided and
byte-exact; host read/write calls refuse device segments; a TCP node refuses device memory."""

import json
import os
import time

import numpy as np
import pytest

from peercache import _peercache
from conftest import node_config

PAGE = 64 << 10
LEN = 1 << 20
IOVA = 0x6300_0000_0000


def node(n, seed, port, **extra):
    return _peercache.Node(json.dumps(node_config(n, seed, port, host_local=False, **extra)))


def memfd():
    fd = os.memfd_create("peercache-py-dmabuf")
    os.ftruncate(fd, LEN)
    return fd


def test_pages_land_in_device_memory_and_host_calls_refuse_it(port):
    owner = node(110, 110, port, protocol="rdma", rdma_backend="soft")
    reader = node(111, 110, port, protocol="rdma", rdma_backend="soft")
    fd = memfd()
    try:
        assert owner.wait_members(2, 10) and reader.wait_members(2, 10)
        pages = [np.full(PAGE, i + 1, dtype=np.uint8) for i in range(4)]
        keys = [f"py-dev-{i}" for i in range(4)]
        assert owner.batch_set_ptrs(keys, [p.ctypes.data for p in pages], [PAGE] * 4, [1] * 4) == [True] * 4
        deadline = time.monotonic() + 10
        while reader.batch_exists(keys) < 4:
            assert time.monotonic() < deadline, "the reader never saw the pages"
            time.sleep(0.01)
        reader.register_device_dmabuf(fd, 0, LEN, IOVA)
        ptrs = [IOVA + i * PAGE for i in range(4)]
        assert reader.batch_get_device_ptrs(keys, ptrs, [PAGE] * 4, [1] * 4) == [True] * 4
        for i, p in enumerate(pages):
            assert os.pread(fd, PAGE, i * PAGE) == p.tobytes()
        # The host paths would touch device memory with the CPU: refused, nothing moves.
        with pytest.raises(ValueError, match="batch_get_device"):
            reader.batch_get_ptrs(keys[:1], ptrs[:1], [PAGE], [1])
        with pytest.raises(ValueError, match="device memory"):
            reader.batch_set_ptrs(["x"], ptrs[:1], [PAGE], [1])
        with pytest.raises(ValueError, match="outside every registered device region"):
            reader.batch_get_device_ptrs(keys[:1], [pages[0].ctypes.data], [PAGE], [1])
        with pytest.raises(ValueError):
            reader.register_device_dmabuf(fd, 0, 0, IOVA)
    finally:
        owner.close()
        reader.close()
        os.close(fd)


def test_a_tcp_node_refuses_device_memory(port):
    a = node(112, 112, port)
    fd = memfd()
    try:
        with pytest.raises(RuntimeError, match="only over RDMA"):
            a.register_device_dmabuf(fd, 0, LEN, IOVA)
    finally:
        a.close()
        os.close(fd)


def test_the_software_fabric_refuses_a_device_address_the_cpu_cannot_reach(port):
    """A plain device address (``nvidia-peermem`` style) on the software fabric is accessed by
    the CPU: an address reserved but not mapped readable and writable (as a CUDA allocation's
    is) is refused at registration, never faulted on at the first read."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_none = 0
    reserved = libc.mmap(None, LEN, prot_none, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert reserved not in (None, ctypes.c_void_p(-1).value)
    a = node(113, 113, port, protocol="rdma", rdma_backend="soft")
    host = np.zeros(LEN, dtype=np.uint8)
    try:
        with pytest.raises(RuntimeError, match="not host memory"):
            a.register_device_peermem(reserved, LEN)
        a.register_device_peermem(host.ctypes.data, LEN)  # host memory: taken (unified addressing)
    finally:
        a.close()
        libc.munmap(reserved, LEN)

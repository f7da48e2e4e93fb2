"""The host mirror of KV caches the node cannot reach in place (``peercache.vllm.staging``),
socket-free on CPU tensors in both of vLLM's layouts: a staged page has exactly the bytes of
the same block read in place, and blocks copied back land byte-exact where they belong."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch", reason="the vLLM venv (scripts/vllm-e2e.sh)")

from peercache.vllm.blocks import BlockTable, LayoutError  # noqa: E402
from peercache.vllm.staging import HostMirror, SlotsTimeout, slot_runs  # noqa: E402

BLOCKS = 12


def page_bytes(segs, i):
    """The bytes of page ``i`` of ``segs``, read from memory."""
    start = sum(segs.counts[:i])
    return b"".join(ctypes.string_at(p, n) for p, n in
                    zip(segs.ptrs[start:start + segs.counts[i]], segs.sizes[start:start + segs.counts[i]]))


def caches(shape):
    g = torch.Generator().manual_seed(5)
    t = {f"layer.{i}": torch.randn(*shape, generator=g).to(torch.bfloat16) for i in range(3)}
    t["layer.shared"] = t["layer.1"]  # KV sharing: one tensor under two names, stored once
    return t


@pytest.mark.parametrize("shape", [(BLOCKS, 2, 32, 16),      # the CPU backend's blocks first
                                   (2, BLOCKS, 32, 2, 8)])  # CUDA backends': K/V, then blocks
def test_a_staged_page_is_the_in_place_page_and_scatter_puts_blocks_back(shape):
    kv = caches(shape)
    table = BlockTable(kv, BLOCKS)
    m = HostMirror(kv, BLOCKS, 4)
    assert m.table.segments_per_block == table.segments_per_block
    assert m.table.block_bytes == table.block_bytes
    blocks = [7, 2, 11]
    slots = m.take(3, 1.0)
    m.gather(blocks, slots)
    staged, in_place = m.segments(slots), table.segments(blocks)
    for i in range(3):
        assert page_bytes(staged, i) == page_bytes(in_place, i), i
    # Back into other blocks: each lands whole, nothing else changes.
    before = {k: v.clone() for k, v in kv.items()}
    m.scatter(slots, [0, 4, 9])
    d = shape.index(BLOCKS)
    for name, t in kv.items():
        for src, dst in zip(blocks, [0, 4, 9]):
            assert torch.equal(t.select(d, dst), before[name].select(d, src)), (name, src, dst)
        for b in set(range(BLOCKS)) - {0, 4, 9}:
            assert torch.equal(t.select(d, b), before[name].select(d, b)), (name, b)
    m.give(slots)


def test_slots_are_a_bounded_pool_and_bad_layouts_are_refused():
    kv = caches((BLOCKS, 2, 32, 16))
    m = HostMirror(kv, BLOCKS, 2)
    taken = m.take(5, 1.0)  # at most the pool
    assert sorted(taken) == [0, 1]
    with pytest.raises(SlotsTimeout):
        m.take(1, 0.05)
    m.give(taken[:1])
    assert m.take(1, 0.05) == taken[:1]
    with pytest.raises(ValueError, match="slots"):
        HostMirror(kv, BLOCKS, 0)
    with pytest.raises(LayoutError, match="13 blocks"):
        HostMirror(kv, 13, 2)



@pytest.mark.parametrize("shape", [(BLOCKS, 2, 32, 16), (2, BLOCKS, 32, 2, 8)])
def test_scattered_slots_move_run_by_run_byte_exact(shape):
    """Slots that are not adjacent (a load whose middle pages did not land, a pool given back
    out of order) move one run at a time and still land byte-exact."""
    assert slot_runs([4, 5, 6, 0, 1, 9]) == [(0, 4, 3), (3, 0, 2), (5, 9, 1)]
    assert slot_runs([]) == []
    kv = caches(shape)
    table = BlockTable(kv, BLOCKS)
    assert list(table.kept) == ["layer.0", "layer.1", "layer.2"]  # "layer.shared" is layer.1
    m = HostMirror(kv, BLOCKS, 6)
    slots = [5, 0, 1, 3]
    blocks = [10, 3, 8, 1]
    m.gather(blocks, slots)
    staged, in_place = m.segments(slots), table.segments(blocks)
    for i in range(len(slots)):
        assert page_bytes(staged, i) == page_bytes(in_place, i), i
    before = {k: v.clone() for k, v in kv.items()}
    m.scatter([3, 5, 0], [2, 6, 11])  # slots 3, 5, 0 held blocks 1, 10, 3
    d = shape.index(BLOCKS)
    for name, t in kv.items():
        for src, dst in zip([1, 10, 3], [2, 6, 11]):
            assert torch.equal(t.select(d, dst), before[name].select(d, src)), (name, src, dst)
        for b in set(range(BLOCKS)) - {2, 6, 11}:
            assert torch.equal(t.select(d, b), before[name].select(d, b)), (name, b)
    # Slots given back out of order are taken again in order (adjacent ones as one run).
    taken = m.take(6, 1.0)
    m.give([taken[4], taken[1], taken[3]])
    assert m.take(3, 1.0) == [1, 3, 4]


def test_a_staged_page_holds_a_block_in_logical_order_whatever_the_backend_s_layout():
    """CUDA backends lay the same KV out differently: FlashAttention's caches are
    ``[2, blocks, block_size, heads, head_size]``, FlashInfer's ``[blocks, 2, block_size,
    heads, head_size]``, and with its HND stride order the tensor vLLM registers is a permuted
    view whose memory holds heads before tokens. A staged page holds each block in logical
    order (K, then V, each ``[block_size, heads, head_size]``), so the three give the same page
    for the same KV, and blocks scattered back land in each one's own layout."""
    g = torch.Generator().manual_seed(9)
    kv = [torch.randn(2, BLOCKS, 16, 4, 8, generator=g).to(torch.bfloat16) for _ in range(2)]  # K/V first
    fa = {f"l{i}": t.clone() for i, t in enumerate(kv)}
    fi = {f"l{i}": t.transpose(0, 1).contiguous() for i, t in enumerate(kv)}  # blocks first
    # HND: memory [2, blocks, heads, block_size, head], viewed as [2, blocks, block_size, heads, head].
    hnd = {f"l{i}": t.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4) for i, t in enumerate(kv)}
    assert not hnd["l0"].is_contiguous() and torch.equal(hnd["l0"], fa["l0"])
    with pytest.raises(LayoutError, match="dense slice"):
        BlockTable(hnd, BLOCKS)  # in place (raw bytes) it cannot be read in logical order
    pages = []
    for caches in (fa, fi, hnd):
        assert HostMirror.block_bytes(caches, BLOCKS) == 2 * 2 * 16 * 4 * 8 * 2
        m = HostMirror(caches, BLOCKS, 3)
        m.gather([5, 0, 9], [0, 1, 2])
        segs = m.segments([0, 1, 2])
        pages.append([page_bytes(segs, i) for i in range(3)])
        m.scatter([0, 1, 2], [1, 2, 3])  # back into other blocks, in the cache's own layout
        for name, t in caches.items():
            logical = t if t.shape[0] == 2 else t.transpose(0, 1)
            for src, dst in zip([5, 0, 9], [1, 2, 3]):
                assert torch.equal(logical[:, dst], kv[int(name[1])][:, src]), (name, src, dst)
    assert pages[0] == pages[1] == pages[2]

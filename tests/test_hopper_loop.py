"""When the warp-specialised Hopper loop (kernels/hopper_loop.py) runs, checked on the CPU.

The loop itself is Gluon, which Triton's interpreter does not run: it is compiled for sm_90 by
tests/test_compile_kernels.py and run against the portable loop by tests/gpu. Here: the host
rules that pick it per call, and its ring sizes against the shared memory of sm_90.
"""
import pytest
import torch

import kernels._checks as checks
from kernels.block_mask import block_layout, mask_from_dense, row_major_layout
from kernels.hopper_loop import SHARED_MEMORY_BUDGET, ring_stages, ws_supported
from kernels.tile_loop import tma_sub_frames


def test_rings_fit_sm90_shared_memory():
    assert SHARED_MEMORY_BUDGET < 232_448  # sm_90's per-block limit
    assert ring_stages(128, 128, 128, 2, most=3) == 3   # PSA: one ring of 64 KB slots
    assert ring_stages(64, 64, 128, 2, most=3) == 3     # Sol: two rings of 32 KB slots
    assert ring_stages(128, 128, 64, 2, most=8) == 6    # d 64: smaller slots, more of them
    assert ring_stages(64, 128, 128, 2, most=3) == 1    # two rings of 64 KB slots do not fit twice
    assert ring_stages(128, 128, 128, 2, most=2) == 2   # capped by the configuration


def mask_for(layout, block_m):
    n = layout.n_blocks
    return mask_from_dense(torch.ones(1, 2, n, n, dtype=torch.bool), layout, block_m=block_m)


def qkv(L, D=128, dtype=torch.bfloat16):
    return [torch.randn(1, L, 2, D, dtype=dtype) for _ in range(3)]


@pytest.fixture
def compiled(monkeypatch):
    """As on a GPU: the interpreter check says no."""
    monkeypatch.setattr(checks, "triton_interpreting", lambda: False)


def test_the_calls_it_takes(compiled):
    psa = block_layout((6, 16, 32), (3, 8, 16))
    q, k, v = qkv(6 * 16 * 32)
    assert ws_supported(q, k, v, mask_for(psa, 128), tma_sub_frames(psa.tile), 3, pooled=False)
    sol = block_layout((4, 16, 16), (1, 8, 8))
    q, k, v = qkv(4 * 16 * 16)
    assert ws_supported(q, k, v, mask_for(sol, 64), tma_sub_frames(sol.tile), 3, pooled=True)


def test_the_calls_it_leaves_to_the_portable_loop(compiled):
    psa = block_layout((6, 16, 32), (3, 8, 16))
    L = 6 * 16 * 32
    mask, frames = mask_for(psa, 128), tma_sub_frames(psa.tile)
    q, k, v = qkv(L, dtype=torch.float32)
    assert not ws_supported(q, k, v, mask, frames, 3, pooled=False)            # float32
    q, k, v = qkv(L, D=96)
    assert not ws_supported(q, k, v, mask, frames, 3, pooled=False)            # head dim 96
    q, k, v = qkv(L)
    assert not ws_supported(q, k, v, mask, None, 3, pooled=False)              # no TMA box
    assert not ws_supported(q, k, v, mask_for(psa, 64), frames, 3, pooled=False)  # bare 64-row lists
    assert not ws_supported(q, k, v, mask, frames, 1, pooled=False)            # a 1-slot ring
    odd = torch.randn(1, L, 2, 129, dtype=torch.bfloat16)[..., :128]           # rows not 16-byte aligned
    assert not ws_supported(q, odd, v, mask, frames, 3, pooled=False)
    tiny = block_layout((4, 6, 10), (2, 3, 5))                                 # 30-token tiles
    q, k, v = qkv(4 * 6 * 10)
    assert not ws_supported(q, k, v, mask_for(tiny, 32), tma_sub_frames(tiny.tile), 3, pooled=False)


def test_never_under_the_interpreter():
    if not checks.triton_interpreting():
        pytest.skip("runs under Triton's interpreter (CI)")
    lay = row_major_layout(4096)
    q, k, v = qkv(4096)
    assert not ws_supported(q, k, v, mask_for(lay, 64), tma_sub_frames(lay.tile), 3, pooled=True)

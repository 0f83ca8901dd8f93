"""When the warp-specialised Hopper loop (kernels/engine/hopper_loop.py) runs, checked on the CPU.

The loop itself is Gluon, which Triton's interpreter does not run: it is compiled for sm_90 by
tests/kernels/test_compile_kernels.py and run against the portable loop by tests/gpu. Here: the host
rules that pick it per call, and its ring sizes against the shared memory of sm_90.
"""
import pytest
import torch

import kernels._device as device
import kernels.engine.hopper_loop as hopper_loop
from kernels.block_mask import block_layout, row_major_layout
from kernels.engine.hopper_loop import SHARED_MEMORY_BUDGET, edge_cover, ring_stages, step_keys, ws_supported
from kernels.engine.tile_loop import tma_sub_frames


def test_rings_fit_sm90_shared_memory():
    assert SHARED_MEMORY_BUDGET < 232_448  # sm_90's per-block limit
    assert ring_stages(128, 128, 128, 2, most=3) == 3   # PSA: one ring of 64 KB slots
    assert ring_stages(64, 128, 128, 2, most=3) == 3    # Sol's pair steps: 64 KB slots, 3 fit beside the queries
    assert ring_stages(64, 128, 64, 2, most=3) == 6     # d 64: the two items' 3 each
    assert ring_stages(128, 128, 64, 2, most=8) == 6    # d 64: smaller slots, more of them
    assert step_keys(64, 64) == 128 and step_keys(128, 128) == 128 and step_keys(128, 64) == 64
    assert ring_stages(128, 128, 128, 2, most=2) == 2   # capped by the configuration


def qkv(L, D=128, dtype=torch.bfloat16):
    return [torch.randn(1, L, 2, D, dtype=dtype) for _ in range(3)]


@pytest.fixture
def compiled(monkeypatch):
    """As on a GPU: the interpreter check says no."""
    monkeypatch.setattr(hopper_loop, "triton_interpreting", lambda: False)


def test_the_calls_it_takes(compiled):
    psa = block_layout((6, 16, 32), (3, 8, 16))
    q, k, v = qkv(6 * 16 * 32)
    assert ws_supported(q, k, v, psa, 128, tma_sub_frames(psa.tile), 3, pooled=False)
    sol = block_layout((4, 16, 16), (1, 8, 8))
    q, k, v = qkv(4 * 16 * 16)
    assert ws_supported(q, k, v, sol, 64, tma_sub_frames(sol.tile), 3, pooled=True)


def test_the_calls_it_leaves_to_the_portable_loop(compiled):
    psa = block_layout((6, 16, 32), (3, 8, 16))
    L = 6 * 16 * 32
    frames = tma_sub_frames(psa.tile)
    q, k, v = qkv(L, dtype=torch.float32)
    assert not ws_supported(q, k, v, psa, 128, frames, 3, pooled=False)            # float32
    q, k, v = qkv(L, D=96)
    assert not ws_supported(q, k, v, psa, 128, frames, 3, pooled=False)            # head dim 96
    q, k, v = qkv(L)
    assert not ws_supported(q, k, v, psa, 128, None, 3, pooled=False)              # no TMA box
    assert not ws_supported(q, k, v, psa, 64, frames, 3, pooled=False)  # bare 64-row lists
    assert not ws_supported(q, k, v, psa, 128, frames, 1, pooled=False)            # a 1-slot ring
    odd = torch.randn(1, L, 2, 129, dtype=torch.bfloat16)[..., :128]           # rows not 16-byte aligned
    assert not ws_supported(q, odd, v, psa, 128, frames, 3, pooled=False)
    tiny = block_layout((4, 6, 10), (2, 3, 5))                                 # 30-token tiles
    q, k, v = qkv(4 * 6 * 10)
    assert not ws_supported(q, k, v, tiny, 32, tma_sub_frames(tiny.tile), 3, pooled=False)


def test_the_edge_cover_takes_the_720p_grids_only():
    """Two steps for a 5-row edge of 3×8×W tiles; every other padded grid keeps the masked
    boxes (the cover's boxes assume whole tiles on the other axes and 3 frames a tile)."""
    assert edge_cover(block_layout((21, 45, 80), (3, 8, 16)), 1)                 # Wan 2.1 720p
    assert edge_cover(block_layout((33, 45, 80), (3, 8, 16), extra_tokens=256), 1)  # HunyuanVideo + text
    assert edge_cover(block_layout((6, 13, 32), (3, 8, 8)), 1)                   # 64-key slots
    assert not edge_cover(block_layout((21, 48, 80), (3, 8, 16)), 1)             # no padding
    assert not edge_cover(block_layout((21, 46, 80), (3, 8, 16)), 1)             # a 6-row edge
    assert not edge_cover(block_layout((20, 45, 80), (3, 8, 16)), 1)             # short last frames
    assert not edge_cover(block_layout((21, 45, 78), (3, 8, 16)), 1)             # short last columns
    assert not edge_cover(block_layout((30, 45, 80), (6, 8, 8)), 2)              # 6-frame tiles
    assert not edge_cover(block_layout((21, 45, 80), (1, 8, 8)), 1)              # Sol's 64-token blocks


def test_never_under_the_interpreter():
    if not device.triton_interpreting():
        pytest.skip("runs under Triton's interpreter (CI)")
    lay = row_major_layout(4096)
    q, k, v = qkv(4096)
    assert not ws_supported(q, k, v, lay, 64, tma_sub_frames(lay.tile), 3, pooled=True)


@pytest.fixture
def fresh_loader():
    from kernels.engine import load_hopper_loop

    load_hopper_loop.cache_clear()
    yield load_hopper_loop
    load_hopper_loop.cache_clear()


def test_the_loop_loads_with_this_triton(fresh_loader):
    import kernels.engine.hopper_loop

    assert fresh_loader() is kernels.engine.hopper_loop


@pytest.mark.parametrize("version", ["3.2.0", "3.5.1", "3.5.0+git1234"])
def test_older_tritons_run_the_portable_kernel(fresh_loader, monkeypatch, caplog, version):
    """The pack takes Triton >= 3.2; before 3.6 Gluon is missing or has another API."""
    import triton

    monkeypatch.setattr(triton, "__version__", version)
    with caplog.at_level("INFO", logger="sparse_video_attention.kernels"):
        assert fresh_loader() is None
    assert "needs Triton >= 3.6" in caplog.text


def test_a_triton_without_gluon_runs_the_portable_kernel(fresh_loader, monkeypatch, caplog):
    import sys

    import kernels.engine

    monkeypatch.delitem(sys.modules, "kernels.engine.hopper_loop", raising=False)
    monkeypatch.delattr(kernels.engine, "hopper_loop", raising=False)
    monkeypatch.setitem(sys.modules, "triton.experimental.gluon", None)  # import fails
    with caplog.at_level("WARNING", logger="sparse_video_attention.kernels"):
        assert fresh_loader() is None
    assert "does not load" in caplog.text


def test_the_engine_runs_without_the_hopper_loop(fresh_loader, monkeypatch):
    """An engine call on the Hopper row with no loop available: the portable kernel, same result."""
    import triton

    import kernels
    from kernels.engine.launch_config import ARCHITECTURES

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4 * 8 * 8, 2, 64, generator=g).to(torch.float16) for _ in range(3))
    params = torch.tensor([[1, 0, 0, 2, 0, 0], [2, 0, 0, 1, 0, 0]])
    kw = dict(grid=(4, 8, 8), params=params, tile=(2, 4, 8))
    expected = kernels.psa_attention(q, k, v, config=ARCHITECTURES[(9, 0)], **kw)
    fresh_loader.cache_clear()
    monkeypatch.setattr(triton, "__version__", "3.4.0")
    out = kernels.psa_attention(q, k, v, config=ARCHITECTURES[(9, 0)], **kw)
    assert fresh_loader.cache_info().currsize == 1 and fresh_loader() is None  # the call asked, and got none
    torch.testing.assert_close(out, expected)

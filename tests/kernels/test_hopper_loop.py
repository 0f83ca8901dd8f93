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
from kernels.engine.hopper_loop import (SHARED_MEMORY_BUDGET, cover_box, cover_steps, edge_cover_rows, ring_stages,
                                        step_keys, ws_supported)
from kernels.engine.tile_loop import tma_sub_frames


def test_rings_fit_sm90_shared_memory():
    assert SHARED_MEMORY_BUDGET < 232_448  # sm_90's per-block limit
    assert ring_stages(128, 128, 128, 2, most=3) == 3   # PSA: one ring of 64 KB slots
    assert ring_stages(64, 128, 128, 2, most=3) == 3    # Sol's pair steps: 64 KB slots, 3 fit beside the queries
    assert ring_stages(64, 128, 64, 2, most=3) == 6     # d 64: the two items' 3 each
    assert ring_stages(128, 128, 64, 2, most=8) == 6    # d 64: smaller slots, more of them
    assert step_keys(64, 64) == 128 and step_keys(128, 128) == 128 and step_keys(128, 64) == 64
    assert ring_stages(128, 128, 128, 2, most=2) == 2   # capped by the configuration
    # 8-bit key codes (PSA's quantized QKᵀ): 48 KB slots beside 16 KB of query codes
    assert ring_stages(128, 128, 128, 2, most=8, key_size=1) == (SHARED_MEMORY_BUDGET - 16384) // 49152 == 4
    assert ring_stages(128, 128, 128, 2, most=3, key_size=1) == 3


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
    assert ws_supported(q, k, v, psa, 128, tma_sub_frames(psa.tile), 3, pooled=False, quantized=True)
    sol = block_layout((4, 16, 16), (1, 8, 8))
    q, k, v = qkv(4 * 16 * 16)
    assert ws_supported(q, k, v, sol, 64, tma_sub_frames(sol.tile), 3, pooled=True)
    assert ws_supported(q, k, v, sol, 64, tma_sub_frames(sol.tile), 3, pooled=True, quantized=True)


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
    q, k, v = qkv(L)                                         # a quantized pooled term on 128-row tiles
    assert not ws_supported(q, k, v, psa, 128, frames, 3, pooled=True, quantized=True)


@pytest.mark.parametrize("grid,tile,extra,rows,steps", [
    ((21, 45, 80), (3, 8, 16), 0, 5, 2),      # Wan 2.1 720p: 3 tops, then the 5th row of 4 frames
    ((33, 45, 80), (3, 8, 16), 256, 5, 2),    # HunyuanVideo 720p + text
    ((6, 13, 32), (3, 8, 8), 0, 5, 2),        # 64-key slots
    ((21, 44, 80), (3, 8, 16), 0, 4, 2),      # half a tile: 3 tops, a padding half
    ((20, 45, 80), (3, 8, 16), 0, 5, 2),      # short last frames, masked by key
    ((21, 45, 78), (3, 8, 16), 0, 5, 2),      # short last columns, masked by key
    ((20, 43, 80), (2, 8, 16), 0, 3, 1),      # 2-frame tiles cut to 3 rows: 2 tops in one step
    ((8, 22, 48), (4, 8, 16), 0, 6, 3),       # 4 tops, then rows 5 and 6 of 4 frames
    ((9, 13, 32), (6, 8, 16), 0, 5, 4),       # 6 tops, then the 5th row in 2 boxes of 4 frames
    ((6, 10, 32), (3, 4, 32), 0, 2, 2),       # 4-row tiles cut to 2
    ((10, 25, 64), (5, 16, 8), 0, 9, 3),      # 16-row tiles: 5 tops, the 9th row of 8 frames
])
def test_the_edge_cover_takes_the_grids_where_it_saves_steps(grid, tile, extra, rows, steps):
    """A tile cut to r of its bh rows by the grid's last rows takes the cover where its steps
    (the top bh/2 rows of each frame, then each row below in boxes of bh/2 frames, two boxes
    a step) are fewer than its frames."""
    lay = block_layout(grid, tile, extra_tokens=extra)
    assert edge_cover_rows(lay, 1) == rows
    assert cover_steps(tile[0], tile[1], rows) == steps < tile[0]


@pytest.mark.parametrize("grid,tile,sub_frames", [
    ((21, 48, 80), (3, 8, 16), 1),    # no cut rows
    ((21, 46, 80), (3, 8, 16), 1),    # 6 rows: 3 tops and 3 row boxes, 3 steps as without
    ((21, 47, 80), (3, 8, 16), 1),    # 7 rows: 4 steps against 3
    ((20, 45, 80), (2, 8, 16), 1),    # 5 rows of a 2-frame tile: 2 steps as without
    ((21, 45, 80), (1, 8, 8), 1),     # one frame a tile (Sol's 64-token blocks): never fewer
    ((21, 45, 80), (3, 7, 16), 1),    # odd tile height: no half
    ((30, 45, 80), (6, 8, 8), 2),     # 2-frame boxes
])
def test_the_edge_cover_is_never_taken_where_it_saves_nothing(grid, tile, sub_frames):
    assert edge_cover_rows(block_layout(grid, tile), sub_frames) == 0


def test_the_cover_reads_every_key_of_an_edge_block_once():
    """A model of the kernel's cover (``cover_box`` for the boxes the producer copies and the
    keys the consumer keeps, ``_cover_step_whole`` for the steps whose bias it tests): over
    ``cover_steps`` steps, the kept keys of every block of the last block row are its real
    keys, each once, wherever the rule takes the cover (tiles up to 8 frames × 16 rows, every
    cut, grids cut in frames and columns too), and a step called whole keeps all its keys in
    a tile cut in rows only."""
    bw = 4
    for bt in range(1, 9):
        for bh in range(2, 17, 2):
            for rows in range(1, bh):
                T, H, W = bt + 1, bh + rows, 2 * bw - 1  # the second frame tile and column cut
                lay = block_layout((T, H, W), (bt, bh, bw))
                if not edge_cover_rows(lay, 1):
                    assert cover_steps(bt, bh, rows) >= bt
                    continue
                for t0 in range(0, T, bt):
                    for w0 in range(0, W, bw):
                        kept = []
                        for e in range(cover_steps(bt, bh, rows)):
                            step = []
                            for q in (2 * e, 2 * e + 1):
                                frame, row, along_t = cover_box(bt, bh, q)
                                for down in range(bh // 2):
                                    f, r = (frame + down, row) if along_t else (frame, row + down)
                                    step += [(f, r, w) for w in range(bw) if f < bt and r < rows]
                            if hopper_loop._cover_step_whole(bt, bh, rows, e):
                                assert len(step) == bh * bw, (bt, bh, rows, e)
                            kept += [(f, r, w) for f, r, w in step if t0 + f < T and w0 + w < W]
                        real = [(f, r, w) for f in range(min(bt, T - t0)) for r in range(rows)
                                for w in range(min(bw, W - w0))]
                        assert sorted(kept) == real, (bt, bh, rows, t0, w0)


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

"""PSA Triton kernel (through the interpreter on CPU) vs the float reference."""
import pytest
import torch

import kernels
from qkv_layouts import heads_first, hunyuan_single_block


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def random_params(grid, tile, heads, gen):
    nT, nH, nW = (-(-g // t) for g, t in zip(grid, tile))
    rows = []
    for _ in range(heads):
        rows.append([
            int(torch.randint(1, nT + 1, (1,), generator=gen)), int(torch.randint(-1, 2, (1,), generator=gen)),
            int(torch.randint(0, 3, (1,), generator=gen)), int(torch.randint(1, nH * nW + 1, (1,), generator=gen)),
            int(torch.randint(-1, 2, (1,), generator=gen)), [0, nW, 3][int(torch.randint(0, 3, (1,), generator=gen))],
        ])
    return torch.tensor(rows)


CASES = [
    # grid, tile, extra tokens, B, H, D, dtype
    ((3, 5, 7), (2, 2, 4), 0, 1, 2, 64, torch.float16),      # padding on every axis
    ((4, 4, 4), (2, 2, 2), 13, 2, 1, 128, torch.bfloat16),   # text tokens after the grid
    ((2, 8, 8), (1, 4, 16), 5, 1, 3, 64, torch.float16),     # tile wider than the grid
    ((2, 6, 16), (1, 4, 16), 0, 2, 2, 128, torch.float16),   # 64-token blocks: unmasked fast path
    # A tile longer than the grid: every block is short, so its last query tiles get no
    # program, and the launch order must still count the tiles a block's slots hold.
    ((2, 8, 8), (3, 8, 8), 0, 1, 2, 64, torch.float16),
    ((1, 8, 16), (3, 8, 16), 7, 2, 3, 64, torch.bfloat16),   # one frame, the shipped presets' tile
]


@pytest.mark.parametrize("grid,tile,extra,B,H,D,dtype", CASES)
def test_kernel_matches_reference(grid, tile, extra, B, H, D, dtype, poisoned_outputs):
    gen = torch.Generator().manual_seed(sum(grid) + extra)
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = (torch.randn(B, L, H, D, generator=gen).to(dtype) for _ in range(3))
    params = random_params(grid, tile, H, gen)
    kw = dict(grid=grid, params=params, tile=tile, extra_tokens=extra)
    out = kernels.psa_attention(q, k, v, precision="bf16", **kw)
    ref = kernels.psa_attention_reference(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    assert rel_err(out, ref) < (3e-3 if dtype == torch.float16 else 2e-2)


@pytest.mark.parametrize("seed", range(10))
def test_random_grids_and_tiles_match_reference(seed, poisoned_outputs):
    """Grids smaller or larger than the tile on any axis (the pack's limit: the tile pads the
    grid by at most 8x), with and without text tokens, 1-3 heads, against the reference."""
    gen = torch.Generator().manual_seed(100 + seed)

    def draw(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=gen))
    tiles = [(1, 4, 16), (2, 8, 8), (3, 8, 16), (2, 8, 16), (4, 8, 8), (1, 8, 8), (2, 4, 8), (4, 4, 4)]
    while True:
        grid = (draw(1, 4), draw(1, 10), draw(1, 18))
        tile = tiles[draw(0, len(tiles) - 1)]
        padded = 1
        for g, t in zip(grid, tile):
            padded *= -(-g // t) * t
        if padded <= 8 * grid[0] * grid[1] * grid[2]:
            break
    extra, heads = draw(0, 9), draw(1, 3)
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = (torch.randn(1, L, heads, 64, generator=gen).half() for _ in range(3))
    params = random_params(grid, tile, heads, gen)
    kw = dict(grid=grid, params=params, tile=tile, extra_tokens=extra)
    out = kernels.psa_attention(q, k, v, precision="bf16", **kw)
    ref = kernels.psa_attention_reference(q, k, v, **kw)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 3e-3, (grid, tile, extra, heads)


def test_full_mask_is_dense_attention():
    grid, tile = (2, 6, 16), (1, 4, 16)
    L = 2 * 6 * 16 + 7
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, L, 2, 64, generator=gen).half() for _ in range(3))
    wide = torch.tensor([[2, 0, 0, 16, 0, 0]] * 2)
    out = kernels.psa_attention(q, k, v, grid=grid, params=wide, tile=tile, extra_tokens=7, precision="bf16")
    dense = torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    assert rel_err(out, dense) < 3e-3


def test_kernel_bad_inputs():
    q = k = v = torch.randn(1, 3 * 5 * 7, 2, 64).half()
    good = torch.tensor([[1, 0, 0, 1, 0, 0]] * 2)
    with pytest.raises(ValueError, match="T\\*H\\*W"):
        kernels.psa_attention(q, k, v, grid=(3, 5, 6), params=good, tile=(1, 1, 1))
    with pytest.raises(ValueError, match="Sw"):
        kernels.psa_attention(q, k, v, grid=(3, 5, 7), params=torch.tensor([[1, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]),
                              tile=(1, 1, 1))
    with pytest.raises(ValueError, match="head dim"):
        x = torch.randn(1, 3 * 5 * 7, 2, 32).half()
        kernels.psa_attention(x, x, x, grid=(3, 5, 7), params=good, tile=(1, 1, 1))


@pytest.mark.parametrize("arch", [(9, 0), (8, 6), (12, 0)])
def test_every_architectures_configuration_agrees_with_reference(arch):
    """Hopper's TMA boxes and the pointer loop of RTX 30/40/50 (64-row key steps, 3 stages):
    forced on the interpreter, all give the reference. Grid (3, 5, 7) in
    tiles (2, 2, 4) is padded on every axis, and the text block runs the pointer loop."""
    from kernels.engine.launch_config import ARCHITECTURES
    from kernels.engine.tile_loop import tma_sub_frames

    grid, tile, extra = (3, 5, 7), (2, 2, 4), 6
    assert tma_sub_frames(tile) == 2  # whole grid tiles run through 16-row TMA boxes
    L = 3 * 5 * 7 + extra
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, L, 2, 64, generator=gen).half() for _ in range(3))
    # Heads-first storage (HunyuanVideo's layout) for the descriptor's second form.
    q, k, v = heads_first(q, k, v)
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 2, 2, -1, 4]])
    # bf16 named: the bound below is bf16's, whatever auto picks
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra,
                                config=ARCHITECTURES[arch], precision="bf16")
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert rel_err(out, ref) < 3e-3


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("grid,tile", [
    ((3, 6, 20), (2, 4, 16)),  # 128-token tiles in two 64-row key steps, the grid cut on every axis
    ((3, 7, 23), (1, 3, 10)),  # 30-token tiles in 32-row key steps: the step's last rows are no key
])
def test_pointer_loop_computes_the_rows_of_cut_tiles(grid, tile, precision, poisoned_outputs):
    """The pointer loop (RTX 40's row) computes each grid block's key rows from the tile
    (``tile_loop.attend_grid_rows``): in tiles walked in several key steps and cut by the grid,
    and in key steps longer than the tile, exactly the block's tokens enter, as in the
    reference; the text block after the grid goes through the slot map."""
    from kernels.engine.launch_config import ARCHITECTURES

    extra = 9
    L = grid[0] * grid[1] * grid[2] + extra
    gen = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, L, 2, 64, generator=gen).half() for _ in range(3))
    params = random_params(grid, tile, 2, gen)
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra,
                                config=ARCHITECTURES[(8, 9)], precision=precision)
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra,
                                          precision=precision)
    assert rel_err(out, ref) < 3e-3


def test_tma_descriptors_take_each_tensor_in_its_own_layout():
    from kernels.engine.tile_loop import grid_descriptors

    grid, tile, extra = (3, 5, 7), (2, 2, 4), 6
    gen = torch.Generator().manual_seed(13)
    q, k, v = hunyuan_single_block(*(torch.randn(2, 3 * 5 * 7 + extra, 2, 64, generator=gen).half()
                                    for _ in range(3)))
    descs = grid_descriptors((k, v), grid, (2, 2, 4))
    assert descs is not None and descs[1] == [False, True]  # k heads first, v heads in columns
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 2, 2, -1, 4]])
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra, precision="bf16")
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert rel_err(out, ref) < 3e-3


def test_tma_box_sizes():
    from kernels.engine.tile_loop import tma_sub_frames

    assert tma_sub_frames((3, 8, 16)) == 1   # Wan 720p: 128-row boxes, one frame of the tile
    assert tma_sub_frames((6, 8, 8)) == 2    # HunyuanVideo 768p: two frames per box
    assert tma_sub_frames((2, 3, 5)) is None  # 15-token planes: pointer loop


@pytest.mark.parametrize("block_m", [64, 128])
def test_tiles_past_a_blocks_rows_get_no_program(block_m):
    """The portable loop on a PSA mask lowered to tiles of 64 or 128 rows gives the reference;
    a query tile past its block's real rows gets no program (grid (2, 5, 16), tile (2, 8, 8):
    two blocks of 128 slots hold 80 real tokens each, two 64-row tiles; the 5 text tokens fill
    one tile of the third block). The lowering of a reused mask is made once."""
    from kernels.engine.id_lists import id_lists
    from kernels.engine.launch_config import ARCHITECTURES
    from kernels.engine.portable import portable_attention
    from kernels.psa_mask import psa_kernel_mask

    grid, tile, extra = (2, 5, 16), (2, 8, 8), 5
    L = 2 * 5 * 16 + extra
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, L, 2, 64, generator=gen).half() for _ in range(3))
    params = torch.tensor([[1, 0, 0, 1, 0, 0], [1, 0, 0, 2, 0, 0]])
    mask = psa_kernel_mask(grid, params, tile, extra, "cpu")
    out = portable_attention(q, k, v, mask, scale=0.125, out=torch.empty_like(q), head_base=0, pooled=None,
                             config=ARCHITECTURES[(8, 6)], block_m=block_m, sub_frames=None)
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert rel_err(out, ref) < 3e-3
    assert mask.layout.lengths.tolist() == [80, 80, 5]
    lists = id_lists(mask, block_m)
    assert id_lists(mask, block_m) is lists
    tiles = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)] if block_m == 64 else [(0, 0), (1, 0), (2, 0)]
    per_block = 2 if block_m == 64 else 1
    assert lists.tiles_per_block == per_block
    assert sorted(lists.work.tolist()) == sorted(h * 3 * per_block + b * per_block + t for h in range(2)
                                                 for b, t in tiles)


def test_kernel_mask_cache_holds_every_layer_of_a_deep_model():
    """A preset gives each of HunyuanVideo's 60 blocks its own masks: all 60 stay cached (a
    smaller cache rebuilt every mask on every call), block ids in 16 bits."""
    from kernels.engine.id_lists import id_lists
    from kernels.psa_mask import _cached_kernel_mask, psa_kernel_mask

    grid, tile = (4, 8, 8), (2, 4, 4)
    layers = [torch.tensor([[1 + l % 2, 0, 0, 1 + l // 2, 0, 0]]) for l in range(60)]
    for p in layers:
        psa_kernel_mask(grid, p, tile, 0, "cpu")
    before = _cached_kernel_mask.cache_info()
    for p in layers:
        ids = id_lists(psa_kernel_mask(grid, p, tile, 0, "cpu"), 32).ids
    after = _cached_kernel_mask.cache_info()
    assert after.hits - before.hits == 60 and after.misses == before.misses
    assert ids.dtype == torch.int16


@pytest.mark.slow  # 20 to 50 s interpreted
def test_text_block_beyond_16_bit_rows():
    """Block ids are cached in 16 bits; the row of the text block (id 256 of 128 tokens =
    row 32768) must still be computed in 32 bits (it overflowed int16 once: an illegal
    address on the H200 in the HunyuanVideo E2E run)."""
    grid, tile, extra = (2, 128, 128), (1, 8, 16), 5
    L = 2 * 128 * 128 + extra
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, L, 1, 64, generator=gen).half() for _ in range(3))
    params = torch.tensor([[1, 0, 0, 1, 0, 0]])
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra, precision="bf16")
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert rel_err(out, ref) < 3e-3

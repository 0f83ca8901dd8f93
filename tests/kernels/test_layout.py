import itertools

import pytest
import torch

from kernels.layout import TileLayout, tile_layout

# Grids that need padding on each axis alone, on all axes, and on none.
CASES = [
    ((5, 4, 4), (2, 2, 2)),   # t
    ((4, 5, 4), (2, 2, 2)),   # h
    ((4, 4, 7), (2, 2, 4)),   # w
    ((5, 7, 9), (2, 3, 4)),   # all three
    ((4, 6, 8), (2, 3, 4)),   # none
    ((1, 3, 3), (1, 2, 2)),   # the docstring example
    ((2, 3, 5), (3, 4, 8)),   # tile larger than the grid on every axis
]


def coords(grid):
    T, H, W = grid
    return [(t, h, w) for t in range(T) for h in range(H) for w in range(W)]


@pytest.mark.parametrize("grid,tile", CASES)
def test_round_trip_and_inverse(grid, tile):
    lay = TileLayout(grid, tile)
    n = grid[0] * grid[1] * grid[2]
    x = torch.randn(2, n, 3, 5)
    y = lay.to_blocks(x, dim=1)
    assert y.shape == (2, lay.n_slots, 3, 5)
    assert torch.equal(lay.from_blocks(y, dim=1), x)
    # perm and inverse are mutually inverse on the real tokens
    assert torch.equal(lay.perm[lay.inverse], torch.arange(n))
    real = lay.perm >= 0
    assert int(real.sum()) == n
    assert torch.equal(torch.sort(lay.perm[real]).values, torch.arange(n))


@pytest.mark.parametrize("grid,tile", CASES)
def test_blocks_are_contiguous_tiles_with_padding_last(grid, tile):
    lay = TileLayout(grid, tile)
    T, H, W = grid
    bt, bh, bw = tile
    nT, nH, nW = lay.block_grid
    assert (nT, nH, nW) == tuple(-(-a // b) for a, b in zip(grid, tile))
    assert lay.n_slots == lay.n_blocks * lay.block_tokens
    cs = coords(grid)
    expected_blocks = list(itertools.product(range(nT), range(nH), range(nW)))
    for b, (it, ih, iw) in enumerate(expected_blocks):  # row-major block order
        slots = lay.perm[b * lay.block_tokens:(b + 1) * lay.block_tokens].tolist()
        length = int(lay.block_lengths[b])
        # valid prefix, padding suffix
        assert all(s >= 0 for s in slots[:length]) and all(s == -1 for s in slots[length:])
        members = [cs[s] for s in slots[:length]]
        expect = [
            (t, h, w)
            for t in range(it * bt, min(T, (it + 1) * bt))
            for h in range(ih * bh, min(H, (ih + 1) * bh))
            for w in range(iw * bw, min(W, (iw + 1) * bw))
        ]
        assert members == expect  # exactly the tile, in local (t, h, w) order


def test_docstring_example():
    lay = TileLayout((1, 3, 3), (1, 2, 2))
    assert lay.perm.tolist() == [0, 1, 3, 4, 2, 5, -1, -1, 6, 7, -1, -1, 8, -1, -1, -1]
    assert lay.block_lengths.tolist() == [4, 2, 2, 1]


def test_padding_slots_are_zero_even_for_nonfinite_tokens():
    lay = TileLayout((3, 3, 3), (2, 2, 2))
    x = torch.randn(1, 27, 1, 2)
    x[:, 0] = float("nan")
    y = lay.to_blocks(x)
    pad = lay.perm < 0
    assert bool((y[:, pad] == 0).all())


def test_extra_tokens_stay_at_the_end():
    lay = TileLayout((3, 3, 5), (2, 2, 2))
    n = 45
    x = torch.randn(2, n + 7, 2, 4)
    y = lay.to_blocks(x, dim=1, extra_tokens=7)
    assert y.shape[1] == lay.n_slots + 7
    assert torch.equal(y[:, lay.n_slots:], x[:, n:])
    assert torch.equal(lay.from_blocks(y, dim=1, extra_tokens=7), x)
    # other dims work too
    z = x.transpose(0, 1).contiguous()
    assert torch.equal(lay.to_blocks(z, dim=0, extra_tokens=7).transpose(0, 1), y)


def test_block_of_token_matches_perm():
    lay = TileLayout((5, 7, 9), (2, 3, 4))
    blk = lay.block_of_token()
    slot_block = torch.arange(lay.n_slots) // lay.block_tokens
    assert torch.equal(blk, slot_block[lay.inverse])


def test_cache_and_devices():
    a = tile_layout((4, 4, 4), (2, 2, 2))
    assert tile_layout([4, 4, 4], (2, 2, 2), "cpu") is a
    assert tile_layout((4, 4, 4), (2, 4, 2)) is not a


@pytest.mark.parametrize(
    "grid,tile,msg",
    [
        ((0, 4, 4), (1, 1, 1), "grid.t"),
        ((4, 4), (1, 1, 1), "grid must be three"),
        ((4, 4, 4), (1, 2.0, 1), "tile.h"),
        ((4, 4, 4), (1, 1, -2), "tile.w"),
        ((4, True, 4), (1, 1, 1), "grid.h"),
    ],
)
def test_bad_grid_or_tile(grid, tile, msg):
    with pytest.raises(ValueError, match=msg):
        TileLayout(grid, tile)


def test_wrong_length_names_both_numbers():
    lay = TileLayout((2, 2, 2), (1, 2, 2))
    with pytest.raises(ValueError, match=r"9 tokens.*8 \+ extra_tokens 0"):
        lay.to_blocks(torch.zeros(1, 9, 1, 1))
    with pytest.raises(ValueError, match="blocked slots"):
        lay.from_blocks(torch.zeros(1, 9, 1, 1))


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("start, count", [(3, 5), (3, 7)])  # (3, 7): the video runs to the end, as in 0.33
@pytest.mark.parametrize("strided", [False, True])
def test_tokens_to_front_and_back(dim, start, count, strided):
    from kernels.layout import tokens_back, tokens_to_front

    x = torch.arange(2 * 3 * 10 * 4).reshape(2, 3, 10, 4).movedim(2, dim).contiguous()  # 10 tokens on dim
    if strided:  # a view whose pieces are not contiguous (v as a slice of a fused projection)
        x = torch.cat([x, -x], dim=-1)[..., ::2]
    front = tokens_to_front(x, start, count, dim=dim)
    order = list(range(start, start + count)) + list(range(start)) + list(range(start + count, 10))
    assert torch.equal(front, x.index_select(dim, torch.tensor(order)))
    assert torch.equal(tokens_back(front, start, count, dim=dim), x)
    assert front.is_contiguous()
    assert tokens_to_front(x, 0, 5, dim=dim) is x and tokens_back(x, 0, 5, dim=dim) is x

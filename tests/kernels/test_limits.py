"""Size limits: grids, tiles and PSA masks are refused before
anything is allocated, with a message that names the argument or field; a rescaled preset
stays inside the valid parameter range.

The refused cases here are chosen so that, without the limits, they would allocate only a
few hundred MB (the real failures asked for 8-19 GB); the tests check that nothing is built.
"""
import json

import pytest
import torch

from kernels import layout
from kernels.preset_file import Preset, preset_from_json, preset_to_json
from kernels.psa_mask import MAX_PARAM, check_params, psa_block_mask, psa_kernel_mask, psa_mask
from kernels.psa_reference import psa_attention_reference


def no_huge_tensor(monkeypatch, limit=1 << 26):
    """Fail the test as soon as torch.full/zeros/ones/empty/eye is asked for more than
    ``limit`` elements: the checks must come before the allocation."""
    for name in ("full", "zeros", "ones", "empty", "eye"):
        real = getattr(torch, name)

        def guarded(*args, _real=real, _name=name, **kwargs):
            shape = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else \
                [a for a in args if isinstance(a, int)]
            n = 1
            for s in shape:
                n *= int(s)
            if _name == "eye":
                n = n * n if len(shape) == 1 else n
            assert n <= limit, f"torch.{_name} of {n} elements"
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch, name, guarded)


# ------------------------------------------------------------------------ item 1: layouts
@pytest.mark.parametrize("grid,tile,words", [
    ((3, 4, 6), (300, 1, 1), "tile.t must be <= 256"),             # the issue's `99999999,1,1` tile widget case
    ((3, 4, 6), (1, 100, 100), "10000 tokens, more than the 4096"),
    ((3, 4, 6), (200, 1, 1), "pads the grid (3, 4, 6) (72 tokens) to 4800 slots"),
    ((2000, 1, 1), (1, 1, 1), "grid.t must be <= 1024"),
    ((1024, 1024, 8), (1, 1, 1), "8388608 tokens, more than"),
])
def test_layout_refuses_before_allocating(monkeypatch, grid, tile, words):
    no_huge_tensor(monkeypatch)
    with pytest.raises(ValueError) as e:
        layout.TileLayout(grid, tile)
    assert words in str(e.value)


def test_layout_limits_keep_real_grids():
    # Wan 720p / HunyuanVideo 720p with their PSA tiles, a Sol 64-token tile, a tile larger
    # than a tiny grid (one tile's worth of padding is always allowed)
    for grid, tile in [((21, 45, 80), (3, 8, 16)), ((33, 45, 80), (3, 8, 16)), ((21, 45, 80), (1, 4, 16)),
                       ((2, 3, 5), (3, 4, 8)), ((1, 1, 1), (16, 16, 16))]:
        lay = layout.TileLayout(grid, tile)
        assert lay.n_tokens == grid[0] * grid[1] * grid[2]


# ------------------------------------------------------------------------ item 2: masks
def test_masks_refused_beyond_the_block_limit(monkeypatch):
    no_huge_tensor(monkeypatch)
    rows = [[1, 0, 0, 1, 0, 0]]
    grid, tile = (1, 46, 46), (1, 1, 1)       # 2116 blocks > MAX_MASK_BLOCKS
    for build in (lambda: psa_block_mask(grid, rows, tile), lambda: psa_mask(grid, rows, tile).mask,
                  lambda: psa_mask(grid, rows, tile).density(tokens=True),
                  lambda: psa_kernel_mask(grid, rows, tile)):
        with pytest.raises(ValueError, match=r"block grid \(1, 46, 46\) has 2116 blocks, more than the 2048"):
            build()
    q = torch.zeros(1, 2116, 1, 8)
    with pytest.raises(ValueError, match="2116 blocks"):
        psa_attention_reference(q, q, q, grid=grid, params=rows, tile=tile)


def test_masks_refused_beyond_the_entry_limit(monkeypatch):
    no_huge_tensor(monkeypatch)
    grid, tile = (1, 40, 40), (1, 1, 1)        # 1600 blocks: 1 head fits, 210 heads do not
    assert psa_block_mask(grid, [[1, 0, 0, 1, 0, 0]], tile).shape == (1, 1600, 1600)
    with pytest.raises(ValueError, match=r"210 masks on block grid \(1, 40, 40\)"):
        psa_block_mask(grid, [[1, 0, 0, 1, 0, 0]] * 210, tile)


def test_mask_density_matches_the_definition_without_float64_copies():
    m = psa_mask((5, 7, 9), [[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 4]], (2, 3, 4))
    dense = m.mask.double()
    torch.testing.assert_close(m.density(), dense.mean(dim=(1, 2)))
    ln = m.block_lengths().double()
    w = ln[:, None] * ln[None, :]
    torch.testing.assert_close(m.density(tokens=True), (dense * w).sum(dim=(1, 2)) / w.sum())


def make_preset(grid, tile, heads=1, layers=1, rows=None):
    rows = rows or [1, 0, 0, 1, 0, 0]
    return Preset(name="p", family="wan", model_name="m",
                  fingerprint={"layers": layers, "heads": heads, "head_dim": 128, "hidden_size": 128 * heads},
                  grid=grid, tile=tile, params=torch.tensor([[[rows] * heads] * layers]), source="geometry",
                  search={"rule": "geometry", "value": None, "metric": None, "candidates": 0, "prompts": 0,
                          "query_tiles": None, "rows_per_tile": None},
                  stats={"sparsity": 0.0, "mean_loss": None})


@pytest.mark.parametrize("grid,tile,words", [
    ([8, 64, 64], [1, 1, 1], "preset.tile: block grid (8, 64, 64) has 32768 blocks"),  # the preset
    ([21, 48, 80], [4096, 4096, 128], "preset.tile[0]: expected an integer in [1, 256], got 4096"),
    ([21, 48, 80], [64, 64, 2], "preset.tile (64, 64, 2) has 8192 tokens"),
    ([2, 8, 8], [256, 1, 1], "preset.tile (256, 1, 1) pads the grid (2, 8, 8)"),
    ([5000, 1, 1], [1, 1, 1], "preset.grid[0]: expected an integer in [1, 1024], got 5000"),
])
def test_preset_sizes_are_bounded(monkeypatch, grid, tile, words):
    doc = json.loads(preset_to_json(make_preset((4, 4, 4), (1, 2, 2))))
    doc.update(grid=grid, tile=tile)
    no_huge_tensor(monkeypatch)
    with pytest.raises(ValueError) as e:
        preset_from_json(json.dumps(doc))
    assert words in str(e.value)


def test_preset_on_a_grid_whose_masks_are_too_large_is_refused(monkeypatch):
    p = make_preset((2, 4, 4), (1, 1, 1))
    no_huge_tensor(monkeypatch)
    with pytest.raises(ValueError, match=r"preset 'p' on grid \(2, 46, 46\): block grid .* 4232 blocks"):
        p.params_for_grid((2, 46, 46), on_mismatch="rescale")
    with pytest.raises(ValueError, match=r"preset 'p': tile \(1, 1, 1\)|more than"):
        p.params_for_grid((1024, 1024, 8))


# ------------------------------------------------------------------------ item 6: rescale
def test_rescale_stays_in_the_valid_parameter_range():
    big = MAX_PARAM - 1
    p = make_preset((21, 48, 80), (3, 8, 16), heads=3)
    p.params[0, 0] = torch.tensor([[1, big, 0, 1, -big, 0], [big, 0, 0, big, 0, 0], [2, 0, 3, 2, 0, 5]])
    with pytest.warns(UserWarning, match="rescaling"):
        q = p.params_for_grid((42, 96, 160), on_mismatch="rescale")   # every factor 2
    check_params(q.params.reshape(-1, 6))                            # no ValueError: all in range
    assert q.params[0, 0, 0, 1] == MAX_PARAM and q.params[0, 0, 0, 4] == -MAX_PARAM
    # the clamped offsets keep nothing but the own block, as the huge ones did
    m = psa_block_mask((42, 96, 160), q.params[0, 0, :1], (3, 8, 16))[0]
    assert torch.equal(m, torch.eye(m.shape[0], dtype=torch.bool))
    # a rescaled preset still saves and loads
    preset_from_json(preset_to_json(q))

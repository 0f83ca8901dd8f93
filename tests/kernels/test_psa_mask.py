import doctest
import importlib
import itertools
import math
import random

import numpy as np
import pytest
import torch

from kernels.engine.id_lists import id_lists
from kernels.psa_mask import PSAMask, check_params, psa_block_mask, psa_kernel_mask, psa_mask

# kernels/__init__ exports the function psa_mask, which shadows the submodule attribute
pm = importlib.import_module("kernels.psa_mask")

ONE = (1, 1, 1)


def test_docstring_examples():
    res = doctest.testmod(pm, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert res.attempted >= 8 and res.failed == 0


# ---------------------------------------------------------------------------------------
# An independent, literal transcription of the docstring's definition, one pair at a time.
def _nearest_row(D, nW):
    lo = math.floor(D / nW)
    best = None
    for c in (lo, lo + 1):
        key = (abs(D - c * nW), abs(c))  # nearest, ties toward row 0
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


def brute_mask(block_grid, row):
    nT, nH, nW = block_grid
    Tw, To, Ts, Sw, So, Ss = row
    L = nH * nW
    blocks = list(itertools.product(range(nT), range(nH), range(nW)))
    n_t = [n for n in range(-nT, nT + 1) if (n == 0 if Ts == 0 else abs(n * Ts) <= nT - 1)]
    n_s = [n for n in range(-L, L + 1) if (n == 0 if Ss == 0 else abs(n * Ss) <= L - 1)]
    out = torch.zeros(len(blocks), len(blocks), dtype=torch.bool)
    for qi, (tq, hq, wq) in enumerate(blocks):
        for ki, (tk, hk, wk) in enumerate(blocks):
            if qi == ki:
                out[qi, ki] = True
                continue
            dt, dh, dw = tk - tq, hk - hq, wk - wq
            inter = any(abs(dt - (To + n * Ts)) <= Tw - 1 for n in n_t)
            ds = dh * nW + dw
            intra = False
            for n in n_s:
                D = So + n * Ss
                Dh = _nearest_row(D, nW)
                Dw = D - Dh * nW
                if abs(ds - D) <= Sw - 1 and abs(dw - Dw) <= Sw - 1:
                    intra = True
                    break
            out[qi, ki] = inter and intra
    return out


def random_params(rng, block_grid, heads):
    nT, nH, nW = block_grid
    L = nH * nW
    rows = []
    for _ in range(heads):
        rows.append([
            rng.randint(1, nT + 1),
            rng.randint(-2, 2),
            rng.choice([0, 1, 2, 3, nT, nT + 5]),
            rng.randint(1, L + 2),
            rng.randint(-2, 2),
            rng.choice([0, 1, 2, 3, nW, nW + 1, L, L + 3]),
        ])
    return rows


@pytest.mark.parametrize("grid,tile", [((3, 3, 4), ONE), ((7, 5, 9), (3, 2, 3)), ((2, 4, 5), ONE), ((4, 2, 6), (2, 1, 2))])
def test_matches_literal_definition(grid, tile):
    rng = random.Random(hash(grid) & 0xFFFF)
    bg = tuple(-(-a // b) for a, b in zip(grid, tile))
    rows = random_params(rng, bg, 8)
    got = psa_block_mask(grid, rows, tile)
    assert got.shape == (8, math.prod(bg), math.prod(bg)) and got.dtype == torch.bool
    for h, row in enumerate(rows):
        assert torch.equal(got[h], brute_mask(bg, row)), (grid, row)


def _displacements(bg):
    nT, nH, nW = bg
    b = torch.arange(nT * nH * nW)
    t, h, w = b // (nH * nW), (b // nW) % nH, b % nW
    return t[None, :] - t[:, None], h[None, :] - h[:, None], w[None, :] - w[:, None]


def test_translation_invariant_and_symmetric():
    bg = (4, 5, 6)
    rows = random_params(random.Random(1), bg, 12)
    m = psa_block_mask(bg, rows, ONE)
    dt, dh, dw = _displacements(bg)
    off = ~torch.eye(m.shape[1], dtype=torch.bool)
    key = ((dt + 10) * 100 + (dh + 10)) * 100 + (dw + 10)
    for h in range(len(rows)):
        for k in key.unique():
            sel = (key == k) & off
            vals = m[h][sel]
            if vals.numel() == 0:  # (0, 0, 0): the own block only
                continue
            assert bool((vals == vals[0]).all())  # depends on (dt, dh, dw) only
    # zero offsets: the diagonal families are symmetric, so is the mask
    sym = [[r[0], 0, r[2], r[3], 0, r[5]] for r in rows]
    ms = psa_block_mask(bg, sym, ONE)
    assert torch.equal(ms, ms.transpose(1, 2))


# ---------------------------------------------------------------------------------------
# The paper's special cases.
GRIDS = [(5, 4, 5), (3, 6, 4), (4, 3, 7), (2, 1, 8)]


@pytest.mark.parametrize("bg", GRIDS)
def test_svg_spatial_head(bg):
    nT, nH, nW = bg
    dt, _, _ = _displacements(bg)
    for Tw in range(1, nT + 2):
        for Sw in (nH * nW, nH * nW + 3):
            m = psa_block_mask(bg, [[Tw, 0, 0, Sw, 0, 0]], ONE)[0]
            assert torch.equal(m, dt.abs() <= Tw - 1)  # whole frames within Tw - 1


@pytest.mark.parametrize("bg", GRIDS)
def test_svg_temporal_head(bg):
    nT, nH, nW = bg
    _, dh, dw = _displacements(bg)
    m = psa_block_mask(bg, [[nT, 0, 0, 1, 0, 0]], ONE)[0]
    assert torch.equal(m, (dh == 0) & (dw == 0))  # same spatial block, every frame
    for Sw in range(1, (nW + 1) // 2 + 1):
        m = psa_block_mask(bg, [[nT, 0, 0, Sw, 0, 0]], ONE)[0]
        assert torch.equal(m, (dh == 0) & (dw.abs() <= Sw - 1))


@pytest.mark.parametrize("bg", GRIDS)
def test_sta_window(bg):
    nT, nH, nW = bg
    dt, dh, dw = _displacements(bg)
    for Tw in range(1, nT + 1):
        for Sw in range(1, nW + 2):
            # full height, non-cyclic in w, for every width
            m = psa_block_mask(bg, [[Tw, 0, 0, Sw, 0, nW]], ONE)[0]
            assert torch.equal(m, (dt.abs() <= Tw - 1) & (dw.abs() <= Sw - 1)), (Tw, Sw)
            if Sw <= (nW + 1) // 2:  # one block row high
                m = psa_block_mask(bg, [[Tw, 0, 0, Sw, 0, 0]], ONE)[0]
                assert torch.equal(m, (dt.abs() <= Tw - 1) & (dh == 0) & (dw.abs() <= Sw - 1))


def test_sta_on_the_papers_wan_grid():
    # Wan 720p: grid 21x45x80, tile 3x8x16 -> block grid 7x6x5; STA window 3 frames x 3 columns
    grid, tile = (21, 45, 80), (3, 8, 16)
    m = psa_block_mask(grid, [[2, 0, 0, 2, 0, 5]], tile)[0]
    dt, dh, dw = _displacements((7, 6, 5))
    assert torch.equal(m, (dt.abs() <= 1) & (dw.abs() <= 1))


@pytest.mark.parametrize("bg", GRIDS)
def test_dense_when_wide(bg):
    nT, nH, nW = bg
    L = nH * nW
    for Ts, Ss in itertools.product([0, 1, 2, nT], [0, 1, 3, nW, L]):
        for Tw, Sw in [(nT, L), (nT + 4, L + 9)]:
            assert bool(psa_block_mask(bg, [[Tw, 0, Ts, Sw, 0, Ss]], ONE).all())
    # and narrower than that is not dense
    assert not bool(psa_block_mask(bg, [[nT, 0, 0, L - 1, 0, 0]], ONE).all()) or L == 1


@pytest.mark.parametrize("bg", GRIDS)
def test_stride_at_least_axis_length_is_infinity(bg):
    nT, nH, nW = bg
    L = nH * nW
    rng = random.Random(7)
    for _ in range(20):
        Tw, To, Sw, So = rng.randint(1, 4), rng.randint(-3, 3), rng.randint(1, 6), rng.randint(-3, 3)
        ref = psa_block_mask(bg, [[Tw, To, 0, Sw, So, 0]], ONE)
        for Ts, Ss in [(nT, L), (nT + 1, L + 1), (10 * nT, 7 * L)]:
            assert torch.equal(psa_block_mask(bg, [[Tw, To, Ts, Sw, So, Ss]], ONE), ref)


def test_width_one_no_offset_is_identity_and_own_block_always_kept():
    bg = (4, 3, 3)
    n = 36
    assert torch.equal(psa_block_mask(bg, [[1, 0, 0, 1, 0, 0]], ONE)[0], torch.eye(n, dtype=torch.bool))
    # To = 2 alone would leave the last two frames without keys; the own block fills in
    m = psa_block_mask(bg, [[1, 2, 0, 1, 0, 0]], ONE)[0]
    assert bool(m.diagonal().all()) and bool((m.sum(1) >= 1).all())
    dt, dh, dw = _displacements(bg)
    assert torch.equal(m, ((dt == 2) & (dh == 0) & (dw == 0)) | torch.eye(n, dtype=torch.bool))


def test_block_numbering_is_row_major_over_block_coordinates():
    # next frame only: key block = query block + nH*nW
    bg = (3, 2, 4)
    m = psa_block_mask(bg, [[1, 1, 0, 1, 0, 0]], ONE)[0]
    n = 24
    expect = torch.eye(n, dtype=torch.bool)
    for q in range(n - 8):
        expect[q, q + 8] = True
    assert torch.equal(m, expect)
    # next block in the row: key = query + 1, except in the last column (cut, no wrap)
    m = psa_block_mask(bg, [[1, 0, 0, 1, 1, 0]], ONE)[0]
    expect = torch.eye(n, dtype=torch.bool)
    for q in range(n):
        if q % 4 != 3:
            expect[q, q + 1] = True
    assert torch.equal(m, expect)


def test_wrap_is_cut():
    # the drawn example: flattened |ds| <= 3 would keep (2, 0) for query (1, 4); we do not
    m = psa_mask((1, 4, 5), [[1, 0, 0, 4, 0, 0]], ONE)
    q = 1 * 5 + 4
    kept = {(k // 5, k % 5) for k in torch.nonzero(m.mask[0, q]).flatten().tolist()}
    assert kept == {(1, 1), (1, 2), (1, 3), (1, 4), (2, 1), (2, 2)}


# ---------------------------------------------------------------------------------------
def test_kernel_mask_is_the_mask_compacted():
    grid, tile = (7, 9, 10), (2, 3, 3)
    rows = random_params(random.Random(3), (4, 3, 4), 6) + [[1, 0, 0, 1, 0, 0]]
    mask = psa_block_mask(grid, rows, tile)
    km = psa_kernel_mask(grid, rows, tile, extra_tokens=5)
    lay = km.layout
    ng, nb = lay.n_grid_blocks, lay.n_blocks
    assert (ng, nb) == (mask.shape[1], mask.shape[1] + 1)  # the 5 extra tokens: one block
    lists = id_lists(km, 32)
    assert km.counts.dtype == torch.int32 and lists.ids.dtype == torch.int16
    assert km.counts.shape == (1, mask.shape[0], nb, 2)
    assert torch.equal(km.counts[0, :, :ng, 0].long(), mask.sum(-1))
    assert bool((km.counts[0, :, :ng, 1] == 1).all()) and bool((km.counts[0, :, ng, 0] == ng).all())
    dense = km.to_dense()[0]
    assert torch.equal(dense[:, :ng, :ng], mask) and bool(dense[:, ng:].all()) and bool(dense[:, :, ng:].all())
    for h in range(mask.shape[0]):
        for q in range(ng):
            c = int(km.counts[0, h, q].sum())
            kept = torch.nonzero(dense[h, q]).flatten()
            assert torch.equal(lists.ids[0, h, q, :c].long(), kept)  # ascending: grid blocks, then extra
    # cached per (grid, tile, params, extra tokens, device)
    assert psa_kernel_mask(grid, torch.tensor(rows, dtype=torch.int32), tile, 5, "cpu") is km
    assert psa_kernel_mask(grid, rows[:-1] + [[2, 0, 0, 1, 0, 0]], tile, 5) is not km


def test_mask_object_density_and_pictures():
    grid, tile = (5, 5, 7), (2, 2, 2)  # needs padding on every axis
    rows = [[1, 0, 0, 1, 0, 0], [3, 0, 0, 12, 0, 0], [2, 0, 0, 2, 0, 4]]
    m = psa_mask(grid, rows, tile)
    assert m.block_grid == (3, 3, 4) and m.n_blocks == 36
    d = m.density()
    assert torch.allclose(d, m.mask.double().mean(dim=(1, 2)))
    assert abs(float(d[0]) - 1 / 36) < 1e-12 and abs(float(d[1]) - 1.0) < 1e-12
    # token density: weight block pairs by real tokens, checked against a token-level count
    lay_blocks = []
    for t, h, w in itertools.product(range(5), range(5), range(7)):
        lay_blocks.append(((t // 2) * 3 + h // 2) * 4 + w // 2)
    b = torch.tensor(lay_blocks)
    for hh in range(3):
        tok = m.mask[hh][b[:, None], b[None, :]]
        assert abs(float(m.density(tokens=True)[hh]) - float(tok.double().mean())) < 1e-12
    assert torch.allclose(m.sparsity(), 1 - d)
    r = repr(m)
    assert "block_grid=(3, 3, 4)" in r and "heads=3" in r
    assert "M(2,0,∞,2,0,4)" in m.describe()
    pic = m.picture(1)
    assert pic.splitlines()[0].startswith("head 1: M(3,0,∞,12,0,∞)")
    assert "." not in "".join(pic.splitlines()[1:])  # dense head
    stencil = m.picture(2, query=(1, 1, 0))
    lines = stencil.splitlines()
    assert lines[1].split() == ["dt=-1", "dt=+0", "dt=+1"]
    assert lines[3].split() == ["##..", "Q#..", "##.."]  # query's row of the three frames
    assert m.stencil(2).shape == (5, 5, 7)
    with pytest.raises(ValueError, match="too many"):
        psa_mask((8, 8, 8), [[1, 0, 0, 1, 0, 0]], ONE).picture(0)
    with pytest.raises(ValueError, match="outside the block grid"):
        m.picture(0, query=(3, 0, 0))
    with pytest.raises(ValueError, match="head must be"):
        m.picture(5)


# ---------------------------------------------------------------------------------------
def test_params_accepted_forms():
    rows = [[2, 0, 0, 3, 1, 5]]
    a = check_params(rows)
    assert a.dtype == torch.int64 and a.shape == (1, 6)
    assert torch.equal(check_params(np.array(rows, dtype=np.int16)), a)
    assert torch.equal(check_params(torch.tensor(rows, dtype=torch.int32)), a)


@pytest.mark.parametrize(
    "params,msg",
    [
        ([[1, 0, 0, 1, 0, 0]] * 3 + [[1, 0, 0, 0, 0, 0]], r"params\[3\]\.Sw = 0: widths must be >= 1"),
        ([[0, 0, 0, 1, 0, 0]], r"params\[0\]\.Tw = 0: widths must be >= 1"),
        ([[1, 0, 0, 1, 0, 0], [1, 0, -1, 1, 0, 0]], r"params\[1\]\.Ts = -1: strides must be >= 0"),
        ([[1, 0, 0, 1, 0, -3]], r"params\[0\]\.Ss = -3"),
        ([[1, 5_000_000, 0, 1, 0, 0]], r"params\[0\]\.To = 5000000"),
        ([[1, 0, 0, 1, -(1 << 21), 0]], r"params\[0\]\.So"),
        ([[1, 0, 0, 1, 0]], r"shape \(H, 6\)"),
        ([1, 0, 0, 1, 0, 0], r"shape \(H, 6\)"),
        (torch.zeros(0, 6, dtype=torch.int64), r"shape \(H, 6\)"),
        ([[1.0, 0, 0, 1, 0, 0]], "integer"),
        (torch.ones(1, 6, dtype=torch.bool), "integer"),
        (np.ones((1, 6)), "integers"),
        ("abc", "integer"),
    ],
)
def test_bad_params(params, msg):
    with pytest.raises(ValueError, match=msg):
        psa_block_mask((2, 2, 2), params, ONE)


def test_bad_grid_tile_and_head_count():
    with pytest.raises(ValueError, match="grid.w"):
        psa_block_mask((2, 2, 0), [[1, 0, 0, 1, 0, 0]], ONE)
    with pytest.raises(ValueError, match="tile.t"):
        psa_kernel_mask((2, 2, 2), [[1, 0, 0, 1, 0, 0]], (0, 1, 1))
    with pytest.raises(ValueError, match="2 rows but the input has 3 heads"):
        check_params([[1, 0, 0, 1, 0, 0]] * 2, num_heads=3)


def test_large_real_grid_is_fast():
    # HunyuanVideo 768p: 30x48x80, tile 6x8x8 -> 5x6x10 blocks, 40 heads of C.2-like params
    rng = random.Random(0)
    rows = [[rng.randint(1, 4), rng.choice([0, 1, -1, 2, -2]), rng.choice([0, 1, 2, 3]),
             rng.randint(1, 9), rng.choice([0, 1, -1]), rng.choice([0, 1, 3, 5, 6])] for _ in range(40)]
    m = psa_block_mask((30, 48, 80), rows, (6, 8, 8))
    assert m.shape == (40, 300, 300)
    km = psa_kernel_mask((30, 48, 80), rows, (6, 8, 8))
    assert torch.equal(km.counts[0, ..., 0].long(), m.sum(-1))

import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from kernels.layout import TileLayout
from kernels.psa_mask import psa_block_mask
from kernels.psa_reference import psa_attention_reference


def rand_params(rng, bg, heads):
    nT, nH, nW = bg
    L = nH * nW
    return [[rng.randint(1, nT), rng.randint(-1, 1), rng.choice([0, 1, 2]),
             rng.randint(1, L), rng.randint(-1, 1), rng.choice([0, 1, 3, nW])] for _ in range(heads)]


def qkv(B, L, H, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, L, H, D, generator=g).to(dtype) for _ in range(3)]


def brute_force(q, k, v, grid, params, tile, extra):
    """Masked softmax in float64, the token mask built pair by pair from psa_block_mask."""
    B, L, H, D = q.shape
    T, Hh, W = grid
    bt, bh, bw = tile
    nH, nW = -(-Hh // bh), -(-W // bw)
    bm = psa_block_mask(grid, params, tile)
    blocks = [((t // bt) * nH + h // bh) * nW + w // bw
              for t, h, w in itertools.product(range(T), range(Hh), range(W))]
    n = len(blocks)
    mask = torch.ones(H, L, L, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            mask[:, i, j] = bm[:, blocks[i], blocks[j]]
    qd, kd, vd = (x.double().permute(0, 2, 1, 3) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) / D ** 0.5
    e = torch.exp(s - s.amax(-1, keepdim=True)) * mask[None]
    o = (e / e.sum(-1, keepdim=True)) @ vd
    return o.permute(0, 2, 1, 3)


CASES = [
    # grid, tile, extra, heads, D
    ((3, 3, 5), (2, 2, 2), 0, 3, 8),   # padding on every axis
    ((4, 5, 4), (2, 2, 2), 3, 2, 16),  # padding on h, extra tokens
    ((5, 2, 6), (2, 2, 3), 0, 2, 4),   # padding on t
    ((2, 4, 7), (1, 2, 4), 5, 4, 8),   # padding on w, extra tokens
]


@pytest.mark.parametrize("grid,tile,extra,H,D", CASES)
def test_matches_brute_force(grid, tile, extra, H, D):
    rng = random.Random(sum(grid) + extra)
    bg = tuple(-(-a // b) for a, b in zip(grid, tile))
    params = rand_params(rng, bg, H)
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(2, L, H, D, seed=extra)
    out = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    ref = brute_force(q, k, v, grid, params, tile, extra)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    # chunking the query rows changes nothing
    out3 = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra, query_chunk=3)
    torch.testing.assert_close(out3, out, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("grid,tile,extra", [((3, 5, 6), (2, 2, 4), 0), ((3, 5, 6), (2, 2, 4), 7)])
def test_full_mask_is_dense_sdpa(grid, tile, extra):
    bg = tuple(-(-a // b) for a, b in zip(grid, tile))
    nT, nH, nW = bg
    H = 3
    # wide widths; or width 1 with stride 1 in time (every frame) and a frame-wide width
    params = [[nT, 0, 0, nH * nW, 0, 0], [nT + 3, 0, 2, nH * nW + 1, 0, 1], [1, 0, 1, nH * nW, 0, 0]]
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(1, L, H, 32, seed=4)
    out = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra, scale=0.3)
    dense = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.3)
    torch.testing.assert_close(out, dense.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_extra_tokens_attend_and_are_attended_by_everything():
    grid, tile, extra = (3, 4, 4), (1, 2, 2), 5
    n = 48
    params = [[1, 0, 0, 1, 0, 0], [2, 1, 0, 2, 1, 0]]  # very sparse heads
    q, k, v = qkv(2, n + extra, 2, 8, seed=9)
    out = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    dense = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    # extra query rows: dense attention over the whole sequence
    torch.testing.assert_close(out[:, n:], dense[:, n:], atol=1e-5, rtol=1e-5)
    # a grid query sees the extra keys: changing an extra key changes every grid output
    k2 = k.clone()
    k2[:, n + 2] += 3.0
    out2 = psa_attention_reference(q, k2, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert bool(((out2[:, :n] - out[:, :n]).abs().amax(dim=-1) > 1e-6).all())
    # while changing a grid key outside the head-0 mask (identity blocks) leaves token 0 alone
    k3 = k.clone()
    k3[:, n - 1, 0] += 3.0
    out3 = psa_attention_reference(q, k3, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    torch.testing.assert_close(out3[:, 0, 0], out[:, 0, 0])


def blocked_emulation(q, k, v, grid, params, tile, extra, garbage):
    """What the kernel does: tile-major padded layout, padding slots filled with garbage,
    each query block visits the scheduled key blocks masked by block length, plus the
    extra tokens; then back to grid order."""
    B, L, H, D = q.shape
    lay = TileLayout(grid, tile)
    qb, kb, vb = (lay.to_blocks(x, dim=1, extra_tokens=extra) for x in (q, k, v))
    pad = lay.perm < 0
    n_slots = lay.n_slots
    for x in (qb, kb, vb):
        x[:, :n_slots][:, pad] = garbage
    mask = psa_block_mask(grid, params, tile)
    bt = lay.block_tokens
    out = torch.zeros_like(qb)
    slot = torch.arange(bt)
    for h in range(H):
        for b in range(lay.n_blocks):
            # whole key blocks, as the kernel loads them; the padding tail is masked by
            # length (loads give 0, scores -inf), like a ragged last block
            kblks = torch.nonzero(mask[h, b]).flatten()
            keys = (kblks[:, None] * bt + slot[None, :]).flatten()
            valid = (slot[None, :] < lay.block_lengths[kblks].long()[:, None]).flatten()
            keys = torch.cat([keys, n_slots + torch.arange(extra)])
            valid = torch.cat([valid, torch.ones(extra, dtype=torch.bool)])
            kk = torch.where(valid[:, None], kb[:, keys, h], 0.0)
            vv = torch.where(valid[:, None], vb[:, keys, h], 0.0)
            rows = slice(b * bt, (b + 1) * bt)
            s = qb[:, rows, h] @ kk.transpose(-1, -2) / D ** 0.5
            s = torch.where(valid, s, float("-inf"))
            out[:, rows, h] = torch.softmax(s, -1) @ vv
    # extra query rows attend to everything real
    real = torch.cat([torch.nonzero(~pad).flatten(), n_slots + torch.arange(extra)])
    for h in range(H):
        s = qb[:, n_slots:, h] @ kb[:, real, h].transpose(-1, -2) / D ** 0.5
        out[:, n_slots:, h] = torch.softmax(s, -1) @ vb[:, real, h]
    return lay.from_blocks(out, dim=1, extra_tokens=extra)


@pytest.mark.parametrize("grid,tile,extra", [((3, 5, 7), (2, 2, 4), 0), ((5, 3, 3), (2, 2, 2), 4)])
@pytest.mark.parametrize("garbage", [0.0, 1e4, float("nan")])
def test_padded_tokens_do_not_matter(grid, tile, extra, garbage):
    rng = random.Random(5)
    bg = tuple(-(-a // b) for a, b in zip(grid, tile))
    params = rand_params(rng, bg, 3)
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(1, L, 3, 8, seed=2)
    ref = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    emu = blocked_emulation(q, k, v, grid, params, tile, extra, garbage)
    assert not torch.isnan(emu).any()
    torch.testing.assert_close(emu, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_any_float_dtype_computed_in_float32(dtype):
    grid, tile = (2, 3, 3), (1, 2, 2)
    params = [[1, 0, 0, 2, 0, 2]]
    q, k, v = qkv(1, 18, 1, 8, dtype=dtype, seed=1)
    out = psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile)
    assert out.dtype == dtype
    ref = psa_attention_reference(q.float(), k.float(), v.float(), grid=grid, params=params, tile=tile)
    assert torch.equal(out, ref.to(dtype))


def test_bad_inputs():
    grid, tile = (2, 3, 3), (1, 2, 2)
    q, k, v = qkv(1, 20, 2, 8)
    ok = [[1, 0, 0, 1, 0, 0]] * 2
    with pytest.raises(ValueError, match=r"L = 20 .*T\*H\*W = 18 \+ extra_tokens 0 = 18"):
        psa_attention_reference(q, k, v, grid=grid, params=ok, tile=tile)
    with pytest.raises(ValueError, match=r"L = 20 .*18 \+ extra_tokens 3 = 21"):
        psa_attention_reference(q, k, v, grid=grid, params=ok, tile=tile, extra_tokens=3)
    with pytest.raises(ValueError, match="extra_tokens must be >= 0"):
        psa_attention_reference(q, k, v, grid=grid, params=ok, tile=tile, extra_tokens=-2)
    with pytest.raises(ValueError, match=r"params\[1\]\.Sw = 0"):
        psa_attention_reference(q, k, v, grid=grid, params=[[1, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]], tile=tile, extra_tokens=2)
    with pytest.raises(ValueError, match="3 rows but the input has 2 heads"):
        psa_attention_reference(q, k, v, grid=grid, params=ok + ok[:1], tile=tile, extra_tokens=2)
    with pytest.raises(ValueError, match="grid.h"):
        psa_attention_reference(q, k, v, grid=(2, 0, 3), params=ok, tile=tile, extra_tokens=2)
    with pytest.raises(ValueError, match="scale"):
        psa_attention_reference(q, k, v, grid=grid, params=ok, tile=tile, extra_tokens=2, scale=-1.0)
    with pytest.raises(ValueError, match="same shape"):
        psa_attention_reference(q, k[:, :19], v, grid=grid, params=ok, tile=tile, extra_tokens=2)

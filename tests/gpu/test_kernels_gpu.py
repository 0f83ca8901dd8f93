"""GPU suite (run on the H200 through the device tool; skipped without CUDA by conftest):
bf16 kernels vs the float references at full sequence sizes, output memory poisoned first."""
import pytest
import torch

import kernels
from qkv_layouts import heads_first, hunyuan_single_block


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def in_layout(q, k, v, layout):
    """"blhd": as made; "heads_first", "single_block": HunyuanVideo's blocks (qkv_layouts)."""
    return {"blhd": lambda *x: x, "heads_first": heads_first, "single_block": hunyuan_single_block}[layout](q, k, v)


def poison(nbytes):
    junk = torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del junk


@pytest.mark.parametrize("L,H,beta,estimator,diag,layout,sinks", [
    (75600, 2, 1.04, "exact", False, "blhd", None),
    (32768 + 5, 3, 1.5, "diag", True, "blhd", None),
    (118800 + 256, 2, 1.04, "exact", False, "single_block", [(118800, 118800 + 256)]),
])
def test_sol_full_size(L, H, beta, estimator, diag, layout, sinks):
    g = torch.Generator(device="cuda").manual_seed(L)
    q, k, v = in_layout(*(torch.randn(1, L, H, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                          for _ in range(3)), layout)
    poison(q.numel() * 2)
    kw = dict(beta=beta, estimator=estimator, keep_diagonal=diag, sinks=sinks, return_stats=True)
    out, st = kernels.sol_attention(q, k, v, **kw)
    ref, rst = kernels.sol_attention_reference(q, k, v, **kw)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 2e-2
    assert (st["density"] - rst["density"]).abs().max() < 1e-3


@pytest.mark.parametrize("grid,tile,extra,layout", [((21, 45, 80), (3, 8, 16), 0, "blhd"),
                                                    ((30, 48, 80), (6, 8, 8), 256, "blhd"),
                                                    ((33, 45, 80), (3, 8, 16), 256, "single_block"),
                                                    # padding on every axis; whole boxes past T
                                                    ((31, 45, 78), (6, 8, 8), 77, "heads_first")])
def test_psa_full_size(grid, tile, extra, layout):
    L = grid[0] * grid[1] * grid[2] + extra
    g = torch.Generator(device="cuda").manual_seed(L)
    q, k, v = in_layout(*(torch.randn(1, L, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                          for _ in range(3)), layout)
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10]])
    poison(q.numel() * 2)
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 2e-2


# HunyuanVideo heads-first storage (B, H, L, D) seen as (B, L, H, D), with (H - 1)·L·D past 2^31:
# the last head's base offset needs 64 bits (issue 11, item 9). 33 x 64 x 128 = 270,336 tokens.
BIG_L, BIG_H, BIG_D, BIG_GRID = 270_336, 64, 128, (33, 64, 128)
BIG_BYTES = 5 * BIG_L * BIG_H * BIG_D * 2 + (8 << 30)   # q, k, v, two outputs, reference work


def big_heads_first_qkv():
    assert BIG_GRID[0] * BIG_GRID[1] * BIG_GRID[2] == BIG_L and (BIG_H - 1) * BIG_L * BIG_D >= 2**31
    if torch.cuda.mem_get_info()[0] < BIG_BYTES:
        pytest.skip(f"needs {BIG_BYTES / 2**30:.0f} GiB of free GPU memory")
    g = torch.Generator(device="cuda").manual_seed(63)
    # generated heads first: no (B, L, H, D) copy is ever made
    return [torch.randn(1, BIG_H, BIG_L, BIG_D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
            for _ in range(3)]


def last_head(*tensors):
    return [x[:, :, -1:] for x in tensors]


def test_sol_last_head_past_2_to_the_31():
    q, k, v = big_heads_first_qkv()
    assert q.stride(2) * (BIG_H - 1) >= 2**31
    out, st = kernels.sol_attention(q, k, v, beta=1.5, return_stats=True)
    ref, rst = kernels.sol_attention_reference(*last_head(q, k, v), beta=1.5, return_stats=True)
    assert torch.isfinite(out[:, :, -1]).all()
    assert rel_err(out[:, :, -1:], ref) < 2e-2
    assert abs(float(st["density"][0, -1]) - float(rst["density"][0, 0])) < 1e-3


def test_psa_last_head_past_2_to_the_31():
    q, k, v = big_heads_first_qkv()
    params = torch.tensor([[2, 0, 0, 3, 0, 0]] * (BIG_H - 1) + [[1, 1, 3, 2, 0, 10]])
    out = kernels.psa_attention(q, k, v, grid=BIG_GRID, params=params, tile=(3, 8, 16))
    ref = kernels.psa_attention_reference(*last_head(q, k, v), grid=BIG_GRID, params=params[-1:], tile=(3, 8, 16),
                                          query_chunk=2048)
    assert torch.isfinite(out[:, :, -1]).all()
    assert rel_err(out[:, :, -1:], ref) < 2e-2

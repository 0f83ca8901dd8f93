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

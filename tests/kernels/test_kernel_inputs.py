"""Two documented limits of the kernels' inputs (docs/HARDENING.md):

* NaN or inf in q, k or v stays where it is: an output entry is non-finite only where dense
  attention's is (it may be NaN where dense gives inf, and a row whose mask skips the key that
  holds it stays finite); the heads without one are untouched.
* The Triton kernels are forward-only: inputs that require gradients, with grad mode on, are
  refused instead of returning an output without a gradient; the float references are plain
  PyTorch and differentiate.
"""
from __future__ import annotations

import pytest
import torch

import kernels

GRID, TILE = (2, 8, 8), (1, 4, 4)
PARAMS = [[1, 0, 0, 4, 0, 0]] * 2
CALLS = {
    "sol_attention": lambda q, k, v: kernels.sol_attention(q, k, v, beta=1.0),
    "sol_attention_reference": lambda q, k, v: kernels.sol_attention_reference(q, k, v, beta=1.0),
    # bf16 named: PSA's auto on the interpreter's (Hopper) row is int8, whose non-finite key
    # makes its whole head NaN (its own test: tests/kernels/test_quantized.py)
    "psa_attention": lambda q, k, v: kernels.psa_attention(q, k, v, grid=GRID, params=PARAMS, tile=TILE,
                                                           precision="bf16"),
    "psa_attention_reference": lambda q, k, v: kernels.psa_attention_reference(q, k, v, grid=GRID, params=PARAMS,
                                                                               tile=TILE),
}


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 128, 2, 64, generator=g).half() for _ in range(3)]


def dense(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(
        *(t.float().transpose(1, 2) for t in (q, k, v))).transpose(1, 2)


# Triton's interpreter computes in numpy, which warns about the inf - inf it is handed on purpose
@pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("where, value", [("v", float("inf")), ("v", float("nan")), ("k", float("inf")),
                                          ("q", float("nan"))])
def test_a_non_finite_input_stays_where_dense_attention_puts_it(call, where, value):
    q, k, v = qkv()
    {"q": q, "k": k, "v": v}[where][0, 5, 1, 3] = value
    out = CALLS[call](q, k, v).float()
    want = dense(q, k, v)
    bad = ~torch.isfinite(out)
    assert not (bad & torch.isfinite(want)).any()                 # non-finite only where dense is
    assert bad[:, :, 1].any() and not bad[:, :, 0].any()          # and only in the head that holds it


@pytest.mark.parametrize("call", ["sol_attention", "psa_attention"])
def test_the_triton_kernels_refuse_inputs_that_need_gradients(call):
    q, k, v = qkv()
    q.requires_grad_()
    with pytest.raises(ValueError, match="require gradients, and the Triton kernels have no backward pass"):
        CALLS[call](q, k, v)
    with torch.no_grad():
        assert CALLS[call](q, k, v).shape == q.shape


@pytest.mark.parametrize("call", ["sol_attention_reference", "psa_attention_reference"])
def test_the_references_differentiate(call):
    q, k, v = (t.float().requires_grad_() for t in qkv())
    CALLS[call](q, k, v).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))

"""Sol-Attn: Triton kernel (through the interpreter on CPU) vs the float reference, the
reference vs brute force, the β ↔ density map and bad inputs."""
import math

import pytest
import torch

import kernels
from qkv_layouts import heads_first, hunyuan_single_block
from kernels.sol_routing import SOL_BLOCK


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def qkv(B, L, H, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, L, H, D, generator=g).to(dtype) for _ in range(3)]


def dense(q, k, v, scale=None):
    o = torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (q, k, v)), scale=scale)
    return o.transpose(1, 2)


KERNEL_CASES = [
    # B, L, H, D, dtype, beta, estimator, sinks, keep_diagonal
    (1, 200, 2, 64, torch.float16, 0.5, "exact", None, False),
    (2, 130, 1, 128, torch.bfloat16, 1.0, "diag", None, True),
    (3, 64, 1, 64, torch.float16, 0.0, "exact", None, False),
    (1, 321, 3, 64, torch.float16, "per_head", "diag", [(300, 321)], False),
    (1, 257, 4, 64, torch.bfloat16, 1.5, "exact", [(0, 5), (100, 130)], True),
    (2, 1, 1, 128, torch.float16, 0.7, "exact", None, False),
    (1, 190, 2, 128, torch.float16, float("-inf"), "exact", None, False),
    (1, 190, 2, 64, torch.float16, float("inf"), "diag", None, False),
]


@pytest.mark.parametrize("B,L,H,D,dtype,beta,estimator,sinks,keep_diagonal", KERNEL_CASES)
def test_kernel_matches_reference(B, L, H, D, dtype, beta, estimator, sinks, keep_diagonal):
    q, k, v = qkv(B, L, H, D, dtype, seed=L * 7 + H)
    if beta == "per_head":
        beta = torch.linspace(-0.5, 2.0, H)
    kw = dict(beta=beta, estimator=estimator, sinks=sinks, keep_diagonal=keep_diagonal, return_stats=True)
    out, stats = kernels.sol_attention(q, k, v, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    tol = 3e-3 if dtype == torch.float16 else 2e-2
    assert rel_err(out, ref) < tol
    torch.testing.assert_close(stats["density"], ref_stats["density"])


def test_kernel_accepts_any_strides():
    q, k, v = qkv(1, 150, 2, 64, torch.float16, seed=3)
    qt, kt, vt = heads_first(q, k, v)
    a = kernels.sol_attention(qt, kt, vt, beta=0.8)
    b = kernels.sol_attention(q, k, v, beta=0.8)
    torch.testing.assert_close(a, b)


def test_stats_density_is_the_selection_share():
    q, k, v = qkv(2, 300, 3, 64, torch.float16, seed=11)
    _, stats = kernels.sol_attention(q, k, v, beta=1.0, keep_diagonal=True, return_stats=True)
    sel = kernels.sol_block_selection(q, k, v, beta=1.0, keep_diagonal=True)
    torch.testing.assert_close(stats["density"], sel.float().mean(dim=(-1, -2)))
    n = sel.shape[-1]
    idx = torch.arange(n)
    assert sel[..., (idx[:, None] - idx[None, :]).abs() <= 1].all()


def test_reference_all_exact_is_dense_attention():
    q, k, v = qkv(2, 150, 2, 32, torch.float32, seed=5)
    out = kernels.sol_attention_reference(q, k, v, beta=float("-inf"))
    torch.testing.assert_close(out, dense(q, k, v), atol=1e-5, rtol=1e-5)


def test_reference_nothing_exact_is_the_closed_form_pooled_softmax():
    B, L, H, D = 1, 150, 2, 16
    q, k, v = qkv(B, L, H, D, torch.float32, seed=6)
    out = kernels.sol_attention_reference(q, k, v, beta=float("inf"))
    s = 1 / math.sqrt(D)
    n = math.ceil(L / SOL_BLOCK)
    expected = torch.empty_like(q)
    for h in range(H):
        blocks = [slice(j * SOL_BLOCK, min(L, (j + 1) * SOL_BLOCK)) for j in range(n)]
        k_mean = torch.stack([k[0, b, h].mean(0) for b in blocks])
        v_sum = torch.stack([v[0, b, h].sum(0) for b in blocks])
        lens = torch.tensor([b.stop - b.start for b in blocks], dtype=torch.float32)
        w = torch.exp(s * q[0, :, h] @ k_mean.T)
        expected[0, :, h] = (w @ v_sum) / (w @ lens)[:, None]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_reference_hand_computed_case():
    # Two blocks: 64 tokens, then a 2-token tail. D = 1, scale 1.
    L = SOL_BLOCK + 2
    q = torch.zeros(1, L, 1, 1)
    k = torch.zeros(1, L, 1, 1)
    v = torch.zeros(1, L, 1, 1)
    q[0, :, 0, 0] = 1.0
    k[0, :SOL_BLOCK, 0, 0] = 0.0
    k[0, SOL_BLOCK:, 0, 0] = torch.tensor([1.0, 3.0])   # tail: mean 2
    v[0, :SOL_BLOCK, 0, 0] = 1.0                        # block 0: value sum 64
    v[0, SOL_BLOCK:, 0, 0] = torch.tensor([10.0, 20.0])  # tail: value sum 30
    # Proxy scores of every query block: [0, 2]; mean 1, std 1. β = 0 picks the tail only.
    out = kernels.sol_attention_reference(q, k, v, beta=0.0, scale=1.0)
    # Block 0 pooled: exp(0)·64 in the denominator, exp(0)·64 in the numerator.
    # Tail exact: e¹·10 + e³·20 over e¹ + e³.
    num = 64.0 + math.e * 10 + math.e ** 3 * 20
    den = 64.0 + math.e + math.e ** 3
    torch.testing.assert_close(out[0, :, 0, 0], torch.full((L,), num / den))
    sel = kernels.sol_block_selection(q, k, v, beta=0.0, scale=1.0)
    assert sel[0, 0].tolist() == [[False, True], [False, True]]


def test_correction_off_is_plain_block_sparse_attention():
    q, k, v = qkv(1, 200, 1, 16, torch.float32, seed=9)
    sel = kernels.sol_block_selection(q, k, v, beta=0.5, keep_diagonal=True)
    out = kernels.sol_attention_reference(q, k, v, beta=0.5, selection=sel, correction=False)
    token_mask = sel[0, 0].repeat_interleave(SOL_BLOCK, 0)[:200].repeat_interleave(SOL_BLOCK, 1)[:, :200]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (q, k, v)), attn_mask=token_mask).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_beta_density_map():
    assert abs(kernels.density_for_beta(1.0) - 0.15866) < 1e-4
    assert abs(kernels.density_for_beta(2.0) - 0.02275) < 1e-4
    for rho in (0.01, 0.07, 0.15, 0.5, 0.9):
        assert abs(kernels.density_for_beta(kernels.beta_for_density(rho)) - rho) < 1e-9
    assert kernels.beta_for_density(0.5) == pytest.approx(0.0, abs=1e-12)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rho"):
            kernels.beta_for_density(bad)


@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
def test_bad_inputs_name_the_argument(fn):
    q, k, v = qkv(1, 70, 2, 64, torch.float16, seed=1)
    with pytest.raises(ValueError, match="q must have shape"):
        fn(q[0], k, v, beta=1.0)
    with pytest.raises(ValueError, match="same shape"):
        fn(q, k[:, :60], v, beta=1.0)
    with pytest.raises(ValueError, match="estimator"):
        fn(q, k, v, beta=1.0, estimator="full")
    with pytest.raises(ValueError, match="beta"):
        fn(q, k, v, beta=torch.ones(3))
    with pytest.raises(ValueError, match="beta"):
        fn(q, k, v, beta=float("nan"))
    with pytest.raises(TypeError, match="beta"):
        fn(q, k, v, beta="high")
    with pytest.raises(ValueError, match="sinks"):
        fn(q, k, v, beta=1.0, sinks=[(60, 80)])
    with pytest.raises(ValueError, match="scale"):
        fn(q, k, v, beta=1.0, scale=-1.0)


def test_kernel_rejects_what_it_cannot_run(monkeypatch):
    q, k, v = qkv(1, 70, 2, 64, torch.float32, seed=1)
    with pytest.raises(TypeError, match="float16 or torch.bfloat16"):
        kernels.sol_attention(q, k, v, beta=1.0)
    q, k, v = qkv(1, 70, 2, 96, torch.float16, seed=1)
    with pytest.raises(ValueError, match="head dim"):
        kernels.sol_attention(q, k, v, beta=1.0)
    q, k, v = qkv(1, 70, 2, 64, torch.float16, seed=1)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        kernels.sol_attention(q, k, v, beta=1.0)


@pytest.mark.parametrize("tma,layout", [(False, "blhd"), (True, "blhd"), (False, "mixed"), (True, "mixed")])
def test_precomputed_lists_without_correction_match_block_sparse_reference(tma, layout):
    """"mixed": k heads first and v a view of a fused qkv (HunyuanVideo's single blocks), each
    read through its own TMA descriptor layout."""
    from kernels.sol_routing import block_lengths
    from kernels.sol_triton import block_lists_from_selection, launch_sol_kernel

    q, k, v = qkv(1, 200, 2, 64, torch.float16, seed=21)
    if layout == "mixed":
        q, k, v = hunyuan_single_block(q, k, v)
    sel = kernels.sol_block_selection(q, k, v, beta=0.3, keep_diagonal=True)
    lists = block_lists_from_selection(sel, 200)
    lens = block_lengths(200, q.device)
    unused = torch.zeros(1, dtype=torch.float16)
    out, _ = launch_sol_kernel(
        q, k, v, unused, unused, torch.zeros(1), torch.zeros(1, dtype=torch.int8), lens,
        scale=0.125, keep_diagonal=False, route=False, correction=False, block_lists=lists, tma=tma)
    ref = kernels.sol_attention_reference(q, k, v, beta=0.3, selection=sel, correction=False)
    assert rel_err(out, ref) < 3e-3


def test_reorder_runs_sol_on_tile_major_tokens():
    from kernels.layout import tile_layout

    grid, tile, extra = (3, 6, 10), (1, 4, 4), 9
    L = 3 * 6 * 10 + extra
    q, k, v = qkv(1, L, 2, 64, torch.float16, seed=31)
    kw = dict(beta=0.8, sinks=[(180, 189)], grid=grid, reorder=tile, return_stats=True)
    out, stats = kernels.sol_attention(q, k, v, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    assert rel_err(out, ref) < 3e-3
    torch.testing.assert_close(stats["density"], ref_stats["density"])
    # Same as permuting by hand, running plain Sol, and permuting back.
    lay = tile_layout(grid, tile, pad=False)
    blocked = [lay.to_blocks(t, dim=1, extra_tokens=extra) for t in (q, k, v)]
    by_hand = lay.from_blocks(kernels.sol_attention_reference(*blocked, beta=0.8, sinks=[(180, 189)]),
                              dim=1, extra_tokens=extra)
    torch.testing.assert_close(ref, by_hand)
    with pytest.raises(ValueError, match="grid"):
        kernels.sol_attention_reference(q, k, v, beta=0.8, reorder=tile)
    with pytest.raises(ValueError, match="sinks"):
        kernels.sol_attention_reference(q, k, v, beta=0.8, grid=grid, reorder=tile, sinks=[(0, 4)])


# ------------------------------------------------------------------------ non-finite values
@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
@pytest.mark.parametrize("beta", [float("-inf"), 1.0])
def test_large_fp16_values_do_not_overflow(fn, beta):
    """Values in [1500, 3000]: a 64-token block's value sum (~143,000) is beyond fp16's 65,504;
    the pooled blocks store the mean instead (issue 11, item 3)."""
    g = torch.Generator().manual_seed(40)
    q, k = (torch.randn(1, 200, 2, 64, generator=g).half() for _ in range(2))
    v = (1500 + 1500 * torch.rand(1, 200, 2, 64, generator=g)).half()
    out = fn(q, k, v, beta=beta)
    assert torch.isfinite(out).all()
    assert rel_err(out, dense(q, k, v)) < (3e-3 if beta == float("-inf") else 3e-2)
    if fn is kernels.sol_attention:
        assert rel_err(out, kernels.sol_attention_reference(q, k, v, beta=beta)) < 3e-3


def nan_at(which, q, k, v, row, head, col):
    x = {"q": q, "k": k, "v": v}[which].clone()
    x[0, row, head, col] = float("nan")
    return [x if name == which else t for name, t in zip("qkv", (q, k, v))]


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")  # the interpreter's max of a NaN row
@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("beta", [1.0, float("inf")])
def test_nan_in_nan_out(fn, which, beta):
    """One NaN in q, k or v: NaN exactly where dense attention has NaN, and the other rows of
    a query block with NaN routing are dense attention (issue 11, item 4)."""
    q, k, v = qkv(1, 200, 2, 64, torch.float16, seed=41)
    q, k, v = nan_at(which, q, k, v, row=70, head=1, col=5)
    out = fn(q, k, v, beta=beta).float()
    want = dense(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    assert torch.isnan(out).any()
    if which == "q":  # only row 70 of head 1 is NaN; its block (64-127) is all exact: dense
        ok = torch.isfinite(want[0, 64:128, 1])
        torch.testing.assert_close(out[0, 64:128, 1][ok], want[0, 64:128, 1][ok], atol=3e-3, rtol=3e-3)


def test_row_without_any_term_still_outputs_zeros():
    q, k, v = qkv(1, 130, 1, 16, torch.float32, seed=42)
    sel = torch.zeros(1, 1, 3, 3, dtype=torch.bool)
    sel[0, 0, 0, 0] = True                      # query blocks 1 and 2 see nothing at all
    out = kernels.sol_attention_reference(q, k, v, beta=0.0, selection=sel, correction=False)
    assert torch.equal(out[0, 64:], torch.zeros_like(out[0, 64:]))
    assert torch.isfinite(out).all() and out[0, :64].abs().sum() > 0

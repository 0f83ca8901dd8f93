"""The quantized exact blocks (``precision="int8"`` and ``"fp8"``) through the interpreter:
their codes and scales bit for bit against ``quantized_reference``, both methods' kernels
against their quantized references (outputs poisoned with NaN first), the results against the
bf16 ones within an error budget per format, the pooled term's shift, NaN in / NaN out, the
memory groups, and the ``precision`` argument (fp8 refused where there are no fp8 tensor
cores).

fp8 codes are compared bit for bit: the kernels round to the e4m3 grid in float32 arithmetic
(``quantize.e4m3_grid``), which the interpreter computes as the GPU does, and then convert
exactly. (The interpreter's own fp32 → float8e4nv conversion rounds ties away and can carry into
the wrong exponent, so a kernel leaving the rounding to that conversion could not be checked
here bit for bit.)"""
import dataclasses
import math

import pytest
import torch
import triton
import triton.language as tl

import kernels
import kernels.engine as engine
from kernels.block_mask import block_layout, row_major_layout
from kernels.engine.launch_config import ARCHITECTURES
from kernels.engine.quantize import CODE_FORMATS, e4m3_grid, key_means, quantize_keys, quantize_query_tile
from kernels.quantized_reference import QuantizedOperands, shifted_pooled_keys, smoothing_mean
from qkv_layouts import heads_first, hunyuan_single_block

POINTER_LOOP, TMA_BOXES = ARCHITECTURES[(8, 9)], ARCHITECTURES[(9, 0)]  # sm_89: the sm_86 launch, fp8 allowed
QUANTIZED = ["int8", "fp8"]


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bf16_ulps(a, b):
    """|a - b| in units in the last place of bfloat16 at the larger of the two, or at a
    thousandth of b's RMS for elements smaller than that (cancellation leaves those with
    float32's absolute error, not a relative one)."""
    a, b = a.float(), b.float()
    floor = 1e-3 * b.pow(2).mean().sqrt()
    mag = torch.maximum(torch.maximum(a.abs(), b.abs()), floor)
    return (a - b).abs() / torch.exp2(torch.floor(torch.log2(mag)) - 7)


def assert_matches_quantized_reference(out, ref):
    """The kernel and its quantized reference share their codes and scales, so what is left is
    float rounding (for fp8 also the dot's: float32 accumulation in the kernel, exact in the
    reference, a relative 1e-7 of a logit). float16: P·V in fp16 against float32, well under
    1e-3. bfloat16: the interpreter runs bf16 dots in float32 and truncates the stored output to
    bf16 where the reference rounds, so at most one bf16 unit in the last place apart (codes
    other than the reference's would move about half the elements by more)."""
    assert torch.isfinite(out).all()
    if out.dtype == torch.float16:
        assert rel_err(out, ref) < 1e-3
    else:
        assert bf16_ulps(out, ref).max().item() <= 1.0


def in_layout(q, k, v, layout):
    return {"blhd": lambda *x: x, "heads_first": heads_first, "single_block": hunyuan_single_block}[layout](q, k, v)


def qkv(B, L, H, D, dtype, seed, layout="blhd"):
    g = torch.Generator().manual_seed(seed)
    return in_layout(*(torch.randn(B, L, H, D, generator=g).to(dtype) for _ in range(3)), layout)


def bits(codes):
    """Codes as comparable integers: float8 codes by their bytes (-0 is not 0 here)."""
    return codes.view(torch.uint8) if codes.dtype == torch.float8_e4m3fn else codes


# ------------------------------------------------------------------------ the codes
@triton.jit
def _query_tiles_kernel(Q, CODES, SCALES, ROW_MAP, stride_qn, stride_cn, TILES: tl.constexpr,
                        BLOCK_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                        CODE_DTYPE: tl.constexpr):
    # One program per query tile of a (B = 1, H = 1) call, loaded and quantized as the
    # portable kernel does it.
    qblk = tl.program_id(0) // TILES
    local = (tl.program_id(0) % TILES) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = tl.load(ROW_MAP + qblk * BLOCK_TOKENS + local, mask=local < BLOCK_TOKENS, other=-1)
    row_ok = rows >= 0
    rows = tl.maximum(rows, 0)
    q = tl.load(Q + rows[:, None] * stride_qn + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    codes, scale = quantize_query_tile(q, row_ok, CODE_DTYPE)
    tl.store(CODES + rows[:, None] * stride_cn + offs_d[None, :], codes, mask=row_ok[:, None])
    tl.store(SCALES + tl.program_id(0), scale)


def kernel_query_codes(q, layout, precision="int8"):
    """The portable kernel's query codes (1, 1, L, D) and each token's tile scale (1, 1, L)."""
    code = CODE_FORMATS[precision]
    block_m = engine.query_tile_rows(layout)
    tiles = -(-layout.block_tokens // block_m)
    codes = torch.zeros(q.shape, dtype=code.torch_dtype)
    scales = torch.empty(layout.n_blocks * tiles)
    _query_tiles_kernel[(layout.n_blocks * tiles,)](
        q, codes, scales, layout.row_map, q.stride(1), codes.stride(1), TILES=tiles,
        BLOCK_TOKENS=layout.block_tokens, BLOCK_M=block_m, HEAD_DIM=q.shape[3], CODE_DTYPE=code.triton_dtype)
    slot = torch.empty(layout.n_tokens, dtype=torch.int64)
    filled = layout.row_map >= 0
    slot[layout.row_map[filled].long()] = torch.nonzero(filled).squeeze(1)
    tile = (slot // layout.block_tokens) * tiles + (slot % layout.block_tokens) // block_m
    return codes.transpose(1, 2), scales[tile][None, None]


def same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


LAYOUTS = {  # name: (layout, a token count)
    "3D tiles, padding on every axis, text": lambda: block_layout((3, 5, 7), (2, 2, 4), extra_tokens=13),
    "3D tiles of 192 tokens: two query tiles a block": lambda: block_layout((3, 8, 16), (3, 8, 8), extra_tokens=5),
    "row-major, ragged tail": lambda: row_major_layout(200),
    "30-token tiles": lambda: block_layout((4, 6, 10), (2, 3, 5)),
}


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_codes_are_the_references_bit_for_bit(name, dtype, precision):
    """Key codes and scales (smoothed, per key block, padding left out), the smoothing mean
    (the engine's own pass over k, for any group of heads) and the query codes per tile of the
    portable kernel: equal to ``quantized_reference``'s, bit for bit, on keys sharing an
    offset (the smoothing matters there); each block's largest |x| is the format's bound."""
    layout = LAYOUTS[name]()
    L = layout.n_tokens
    q, k, v = qkv(2, L, 3, 64, dtype, seed=L)
    k = (k.float() + torch.linspace(-4, 6, 64)).to(dtype)
    k = heads_first(k)[0]  # k read with its own strides
    ref = QuantizedOperands.of(q, k, layout, precision)
    assert torch.equal(key_means(k, 0, 3), ref.mean) and torch.equal(smoothing_mean(k), ref.mean)
    keys = quantize_keys(k, layout, 1, 2, precision=precision)
    assert torch.equal(keys.mean, ref.mean[:, 1:3])
    assert keys.codes.dtype == ref.k_codes.dtype == CODE_FORMATS[precision].torch_dtype
    assert torch.equal(bits(keys.codes.transpose(1, 2)), bits(ref.k_codes[:, 1:3]))
    same(keys.scales[:, :, layout.token_blocks()], ref.k_scale[:, 1:3])
    bound = CODE_FORMATS[precision].bound
    assert keys.codes.float().abs().max() == bound and ref.k_codes.float().abs().max() == bound
    codes, scales = kernel_query_codes(q[:1, :, :1].contiguous(), layout, precision)
    assert torch.equal(bits(codes), bits(ref.q_codes[:1, :1]))
    same(scales, ref.q_scale[:1, :1])


@pytest.mark.parametrize("span", [None, 64])
def test_key_means_sum_every_span_of_their_heads(monkeypatch, span):
    """PSA's smoothing means (``key_means``: float64 sums per span of tokens, then over the
    spans) equal the reference's bit for bit for any head range, k read with its own strides,
    with the sequence cut in many spans and a last span part empty (``span`` 64 over 200
    tokens); a NaN or an infinity in a channel makes that channel's mean NaN or infinite, as
    the reference's, and no other."""
    import kernels.engine.quantize as quantize

    if span is not None:
        monkeypatch.setattr(quantize, "KEY_SUM_SPAN", span)
    _, k, _ = qkv(2, 200, 4, 64, torch.bfloat16, seed=11)
    k = heads_first((k.float() + torch.linspace(-4, 6, 64)).bfloat16())[0]
    k[1, 150, 2, 5], k[0, 3, 1, 7] = float("nan"), float("inf")
    for head_base, group_heads in [(0, 4), (1, 2), (3, 1)]:
        same(key_means(k, head_base, group_heads), smoothing_mean(k)[:, head_base:head_base + group_heads])
    means = key_means(k, 0, 4)
    assert means[1, 2, 5].isnan() and means[0, 1, 7].isinf() and means.isfinite().sum() == means.numel() - 2


def test_rounding_is_floor_of_x_over_scale_plus_one_half():
    """One block whose largest |k − m| is 127 (scale 1) and whose mean is 0: the codes are
    floor(x + 0.5), ties up, both for keys and for a query tile (not round-half-even, not the
    truncation toward zero a bare conversion to int8 does)."""
    values = torch.tensor([2.5, -2.5, 3.5, -3.5, 0.5, -0.5, 0.75, -0.75, 126.5, -127.0])
    x = torch.zeros(1, 64, 1, 64)
    x[0, :10, 0, 0] = values
    x[0, 32:42, 0, 0] = -values  # the mean stays 0
    x = x.half()
    layout = row_major_layout(64)
    expected = [3, -2, 4, -3, 1, 0, 1, -1, 127, -127]
    keys = quantize_keys(x, layout, 0, 1)
    assert keys.scales.item() == 1.0 and keys.mean.abs().max() == 0
    assert keys.codes[0, :10, 0, 0].tolist() == expected
    codes, scales = kernel_query_codes(x, layout)
    assert scales.unique().tolist() == [1.0] and codes[0, 0, :10, 0].tolist() == expected
    ref = QuantizedOperands.of(x, x, layout, "int8")
    assert ref.k_codes[0, 0, :10, 0].tolist() == expected and ref.q_codes[0, 0, :10, 0].tolist() == expected


@pytest.mark.parametrize("precision", QUANTIZED)
def test_a_zero_block_and_a_non_finite_one(precision):
    """A block of zeros: scale 0, codes 0. A query tile holding an inf: scale NaN (its rows
    come out NaN), codes 0; the other tiles are untouched."""
    layout = row_major_layout(192)
    q = torch.randn(1, 192, 1, 64, generator=torch.Generator().manual_seed(3)).half()
    q[0, :64] = 0
    q[0, 70, 0, 3] = float("inf")
    codes, scales = kernel_query_codes(q, layout, precision)
    ref = QuantizedOperands.of(q, q, layout, precision)
    assert scales[0, 0, :64].eq(0).all() and bits(codes[0, 0, :64]).eq(0).all()
    assert scales[0, 0, 64:128].isnan().all() and bits(codes[0, 0, 64:128]).eq(0).all()
    assert (scales[0, 0, 128:] > 0).all()
    same(scales, ref.q_scale)
    assert torch.equal(bits(codes), bits(ref.q_codes))


@triton.jit
def _e4m3_kernel(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, e4m3_grid(tl.load(X + offs)).to(tl.float8e4nv))


def test_fp8_rounding_is_round_to_nearest_even_on_the_e4m3_grid():
    """``e4m3_grid`` then the conversion give PyTorch's float8_e4m3fn conversion (round to
    nearest, ties to even, subnormals from 2⁻⁹, −0 kept) bit for bit: on every e4m3 value, every
    midpoint between two and the float32 values either side of it, ±448 (and a hair above:
    saturated), and gaussian values over the whole range. Ties to even: 1.0625 → 1, 1.1875 → 1.25,
    17 → 16, 19 → 20, 3·2⁻¹¹ → 2⁻⁹ (a subnormal)."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = values[~values.isnan() & (values >= 0)].sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([grid, mids, torch.nextafter(mids, torch.full_like(mids, 1e9)),
                      torch.nextafter(mids, torch.zeros_like(mids))])
    g = torch.Generator().manual_seed(17)
    spread = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-14, 9, (4096,), generator=g).float())
    x = torch.cat([near, -near, torch.tensor([448.0001, -448.0001, -0.0]), spread.clamp(-448, 448)])
    x = torch.cat([x, torch.zeros(triton.next_power_of_2(x.numel()) - x.numel())])
    y = torch.empty(x.numel(), dtype=torch.float8_e4m3fn)
    _e4m3_kernel[(1,)](x, y, N=x.numel())
    assert torch.equal(bits(y), bits(x.clamp(-448, 448).to(torch.float8_e4m3fn)))
    ties = torch.tensor([1.0625, 1.1875, 17.0, 19.0, 3 * 2.0**-11, 448.0001, 0.0, 0.0])
    out = torch.empty(8, dtype=torch.float8_e4m3fn)
    _e4m3_kernel[(1,)](ties, out, N=8)
    assert out.float().tolist() == [1.0, 1.25, 16.0, 20.0, 2.0**-9, 448.0, 0.0, 0.0]


# ------------------------------------------------------------------------ kernels vs references
# sm_89's row is the pointer loop sm_86 launches too (the same launch), with fp8 allowed.
SOL_CASES = [
    # B, grid, tile, extra (text) tokens or L without a grid, H, D, dtype, beta, estimator, layout, config
    (1, (2, 9, 10), None, 37, 2, 64, torch.float16, 0.5, "exact", "heads_first", POINTER_LOOP),
    (2, (3, 8, 16), (1, 8, 8), 0, 2, 128, torch.bfloat16, 1.0, "diag", "blhd", TMA_BOXES),
    (1, None, None, 200, 3, 64, torch.bfloat16, 0.3, "exact", "single_block", TMA_BOXES),
    (1, (2, 5, 13), (2, 4, 8), 20, 2, 128, torch.float16, 0.8, "diag", "single_block", POINTER_LOOP),
]


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("B,grid,tile,extra,H,D,dtype,beta,estimator,layout,config", SOL_CASES)
def test_sol_quantized_kernel_matches_its_reference(B, grid, tile, extra, H, D, dtype, beta, estimator, layout, config,
                                                    precision, poisoned_outputs):
    """3D tiles with padding and text blocks, row-major blocks with a ragged tail and sinks,
    both loops, fp16 and bf16, d 64 and 128, (B, L, H·D), heads-first and HunyuanVideo's
    single-block layouts, the pooled term on shifted keys: the routing is unchanged and the
    output is the quantized reference's."""
    L = extra if grid is None else math.prod(grid) + extra
    sinks = [(L - 10, L)] if grid is None else None
    q, k, v = qkv(B, L, H, D, dtype, seed=L + H, layout=layout)
    kw = dict(beta=beta, estimator=estimator, grid=grid, tile=tile, sinks=sinks, return_stats=True)
    out, stats = kernels.sol_attention(q, k, v, config=config, precision=precision, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, precision=precision, **kw)
    assert out.dtype == dtype
    assert_matches_quantized_reference(out, ref)
    assert torch.equal(stats["exact_blocks"], ref_stats["exact_blocks"])


PSA_CASES = [
    # grid, tile, extra tokens, B, H, D, dtype, layout, config
    ((3, 5, 7), (2, 2, 4), 0, 1, 2, 64, torch.float16, "blhd", TMA_BOXES),          # padding on every axis
    ((4, 4, 4), (2, 2, 2), 13, 2, 1, 128, torch.bfloat16, "heads_first", POINTER_LOOP),  # text tokens
    ((2, 8, 8), (3, 8, 8), 0, 1, 2, 64, torch.bfloat16, "single_block", TMA_BOXES),  # tile longer than the grid
    ((3, 8, 16), (3, 8, 8), 5, 1, 2, 128, torch.float16, "blhd", POINTER_LOOP),      # two query tiles a block
]


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("grid,tile,extra,B,H,D,dtype,layout,config", PSA_CASES)
def test_psa_quantized_kernel_matches_its_reference(grid, tile, extra, B, H, D, dtype, layout, config, precision,
                                                    poisoned_outputs):
    L = math.prod(grid) + extra
    q, k, v = qkv(B, L, H, D, dtype, seed=L + B, layout=layout)
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 2, 2, -1, 4]])[:H]
    kw = dict(grid=grid, params=params, tile=tile, extra_tokens=extra)
    out = kernels.psa_attention(q, k, v, config=config, precision=precision, **kw)
    assert out.dtype == dtype
    assert_matches_quantized_reference(out, kernels.psa_attention_reference(q, k, v, precision=precision, **kw))


# ------------------------------------------------------------------------ quantized against bf16
# rel-L2 of the quantized result against the bf16 one allowed here, per format. The codes'
# rounding error on these inputs gives about 1e-2 for int8 (0.0096-0.0105 through the
# interpreter when this was written) and 3.6e-2 for fp8 (0.0356-0.0390): e4m3 keeps 3 bits of
# significand, a relative rounding error uniform within ±2⁻⁴ (RMS 2⁻⁴/√3 = 0.036) on every
# element of q and k, where int8's absolute error of half a step in 127 is smaller for all
# but the largest elements.
ERROR_BUDGET = {"int8": 3e-2, "fp8": 8e-2}


def offset_keys(q, k, v, offset):
    """k with a common offset in every channel (a bias codes without smoothing would spend their
    range on)."""
    return q, (k.float() + offset).to(k.dtype), v


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("offset", [0.0, 8.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantized_is_within_the_error_budget_of_bf16(dtype, offset, precision):
    """Both methods, gaussian keys and keys sharing a large offset: the quantized output against
    the same kernel's bf16 output. For Sol the offset also checks the pooled term's shift: pooled
    columns on unshifted keys would sit 8·Σq/√d away from the exact ones."""
    grid, extra = (2, 9, 10), 20
    L = math.prod(grid) + extra
    q, k, v = offset_keys(*qkv(1, L, 2, 64, dtype, seed=5), torch.linspace(0.5, 1.5, 64) * offset)
    sol = dict(beta=0.5, grid=grid)
    assert rel_err(kernels.sol_attention(q, k, v, precision=precision, **sol),
                   kernels.sol_attention(q, k, v, precision="bf16", **sol)) < ERROR_BUDGET[precision]
    psa = dict(grid=grid, params=[[1, 0, 0, 2, 0, 0], [2, 0, 0, 4, 0, 0]], tile=(1, 4, 4), extra_tokens=extra)
    assert rel_err(kernels.psa_attention(q, k, v, precision=precision, **psa),
                   kernels.psa_attention(q, k, v, precision="bf16", **psa)) < ERROR_BUDGET[precision]


@pytest.mark.parametrize("precision", QUANTIZED)
def test_smoothing_and_the_pooled_shift_are_exact_under_softmax(precision):
    """The quantized reference with every key shifted by a constant vector is the one on
    the unshifted keys up to float rounding (m absorbs the shift; the pooled columns move with
    the exact ones), while the bf16 reference is the yardstick: both stay within the budget."""
    q, k, v = qkv(1, 200, 2, 64, torch.float32, seed=9)
    shift = torch.linspace(-20, 20, 64)
    a = kernels.sol_attention_reference(q, k, v, beta=0.4, precision=precision)
    b = kernels.sol_attention_reference(q, k + shift, v, beta=0.4, precision=precision)
    assert rel_err(a, b) < 1e-3
    assert rel_err(b, kernels.sol_attention_reference(q, k + shift, v, beta=0.4)) < ERROR_BUDGET[precision]


# ------------------------------------------------------------------------ non-finite inputs
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")
@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("method", ["sol", "psa"])
def test_nan_in_nan_out(method, precision):
    """A NaN in q: its query tile's rows are NaN (one scale per tile), the others are not. A
    NaN in k: that head's smoothing mean is NaN, so the head is NaN; the other head is not.
    Kernel and reference agree on where. Blocks (and query tiles) are the grid's two frames."""
    grid = (2, 8, 8)
    q, k, v = qkv(1, 128, 2, 64, torch.float16, seed=13)
    if method == "sol":
        def run(fn, *x, **kw):
            return fn(*x, beta=0.5, grid=grid, tile=(1, 8, 8), precision=precision, **kw).float()
        kernel, reference = kernels.sol_attention, kernels.sol_attention_reference
    else:
        def run(fn, *x, **kw):
            return fn(*x, grid=grid, params=[[1, 0, 0, 1, 0, 0]] * 2, tile=(1, 8, 8), precision=precision,
                      **kw).float()
        kernel, reference = kernels.psa_attention, kernels.psa_attention_reference
    bad_q = q.clone()
    bad_q[0, 70, 1, 5] = float("nan")  # block 1 of head 1
    out = run(kernel, bad_q, k, v)
    assert torch.equal(out.isnan(), run(reference, bad_q, k, v).isnan())
    assert out[0, 64:128, 1].isnan().all() and not out[0, :64, 1].isnan().any() and not out[:, :, 0].isnan().any()
    bad_k = k.clone()
    bad_k[0, 3, 0, 9] = float("nan")
    out = run(kernel, q, bad_k, v)
    assert torch.equal(out.isnan(), run(reference, q, bad_k, v).isnan())
    assert out[:, :, 0].isnan().all() and not out[:, :, 1].isnan().any()


# ------------------------------------------------------------------------ memory and loops
def test_int8_counts_its_keys_in_the_work_memory(monkeypatch):
    """The int8 keys are per-head scratch (the key sums per span, scales, mean, Sol's shifted
    pooled keys, and the codes, counted apart; fp8 codes take the same bytes);
    Sol's groups and PSA's groups each write their heads of the output the one-group result
    writes, and a reused PSA mask keeps its groups' masks."""
    from kernels.engine.pair_streams import pair_stream_bytes
    from kernels.engine.quantize import quantized_key_bytes
    from kernels.psa_mask import psa_kernel_mask

    grid = (2, 8, 16)
    layout = block_layout(grid, (1, 8, 8))
    q, k, v = qkv(2, 256, 5, 64, torch.float16, seed=41)
    bf16 = engine.work_bytes_per_head(q, k, v, layout, pooled=True, config=TMA_BOXES, precision="bf16")
    int8 = engine.work_bytes_per_head(q, k, v, layout, pooled=True, config=TMA_BOXES, precision="int8")
    assert int8 - bf16 == quantized_key_bytes(layout, 64, 2, pooled=True) == 64 * 8 + 4 * 4 + 4 * 64 + 4 * 64 * 2
    assert engine.code_bytes_per_head(layout, 64, "int8") == engine.code_bytes_per_head(layout, 64, "fp8") == 256 * 64
    assert engine.code_bytes_per_head(layout, 64, "bf16") == 0
    assert engine.work_bytes_per_head(q, k, v, layout, pooled=True, config=TMA_BOXES, precision="fp8") == int8
    with monkeypatch.context() as m:  # Sol's pair streams on the Hopper loop count the keys too
        m.setattr(engine, "_hopper_loop_runs", lambda *a, **kw: True)
        assert engine.work_bytes_per_head(q, k, v, layout, pooled=True, config=TMA_BOXES, precision="int8") == \
            pair_stream_bytes(layout.n_blocks) + quantized_key_bytes(layout, 64, 2, pooled=True)
    params = [[1, 0, 0, 2, 0, 0]] * 5
    sol_whole = kernels.sol_attention(q, k, v, beta=0.7, grid=grid, precision="int8")
    psa_whole = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(1, 8, 8), precision="int8")
    groups = []
    real = engine.portable_attention
    monkeypatch.setattr(engine, "SCRATCH_FLOOR", 0)
    monkeypatch.setattr(engine, "SCRATCH_SHARE", 1e-9)  # one head per group
    monkeypatch.setattr(engine, "portable_attention", lambda *a, **kw: groups.append(
        (kw["head_base"], a[3].num_heads)) or real(*a, **kw))
    torch.testing.assert_close(kernels.sol_attention(q, k, v, beta=0.7, grid=grid, precision="int8"), sol_whole)
    assert groups == [(h, 1) for h in range(5)]
    groups.clear()
    torch.testing.assert_close(kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(1, 8, 8),
                                                     precision="int8"), psa_whole)
    assert groups == [(h, 1) for h in range(5)]
    mask = psa_kernel_mask(grid, params, (1, 8, 8))
    assert mask.heads(2, 3) is mask.heads(2, 3) and mask.heads(0, 5) is mask
    assert torch.equal(mask.heads(2, 4).to_dense(), mask.to_dense()[:, 2:4])


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_key_codes_in_the_outputs_later_heads(monkeypatch, precision):
    """Groups whose codes fit in the output's heads after their own lay them there (written over
    by the later groups' outputs) and give the one-group result bit for bit, Sol's and PSA's;
    the last group, with no heads after it, keeps its codes in scratch."""
    grid = (2, 8, 16)
    q, k, v = qkv(2, 256, 5, 64, torch.float16, seed=43)
    params = [[1, 0, 0, 2, 0, 0], [2, 1, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0], [2, 0, 1, 2, 1, 0], [1, 0, 0, 3, 0, 0]]
    calls = [lambda: kernels.sol_attention(q, k, v, beta=0.7, grid=grid, precision=precision),
             lambda: kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(1, 8, 8), precision=precision)]
    whole = [call() for call in calls]
    codes_at = []
    real = engine.portable_attention

    def recording(*a, **kw):
        codes = kw["keys"].codes
        codes_at.append((kw["head_base"], a[3].num_heads, codes.untyped_storage().data_ptr() ==
                         kw["out"].untyped_storage().data_ptr()))
        return real(*a, **kw)

    monkeypatch.setattr(engine, "portable_attention", recording)
    monkeypatch.setattr(engine, "SCRATCH_FLOOR", 0)
    real_groups = engine.head_groups

    def three_heads_of_scratch(num_heads, per_head_bytes, output_bytes, code_bytes_per_head):
        # A budget of 3.5 heads' scratch besides the codes, which two heads with their codes
        # exceed: groups of 3 (codes in heads 3-4), 1 (codes in head 4), then the last head,
        # its codes in scratch.
        assert code_bytes_per_head == 2 * 256 * 64 > per_head_bytes
        monkeypatch.setattr(engine, "SCRATCH_SHARE", 3.5 * per_head_bytes / output_bytes)
        return real_groups(num_heads, per_head_bytes, output_bytes, code_bytes_per_head)

    monkeypatch.setattr(kernels.sol, "head_groups", three_heads_of_scratch)
    monkeypatch.setattr(kernels.psa, "head_groups", three_heads_of_scratch)
    for call, expected in zip(calls, whole):
        codes_at.clear()
        assert torch.equal(call(), expected)
        assert codes_at == [(0, 3, True), (3, 1, True), (4, 1, False)], codes_at


def test_codes_in_free_heads_refuses_what_does_not_fit():
    from kernels.engine.quantize import codes_in_free_heads

    out = torch.empty(1, 8, 4, 16, dtype=torch.bfloat16)
    view = codes_in_free_heads(out, 2, 4, "int8")  # four heads of codes in two output heads
    assert view.shape == (1, 8, 4, 16) and view.dtype == torch.int8 and view.stride() == (8 * 128, 128, 16, 1)
    assert view.data_ptr() == out.data_ptr() + 2 * 32
    with pytest.raises(ValueError, match="do not fit"):
        codes_in_free_heads(out, 3, 3, "fp8")
    with pytest.raises(ValueError, match="non-contiguous"):
        codes_in_free_heads(out.transpose(1, 2), 0, 1, "int8")


def test_quantized_calls_reach_the_hopper_loop_with_the_codes(monkeypatch):
    """On a launch row whose loop is the warp-specialised Hopper loop, a call that loop takes
    runs there in every precision, an int8 or fp8 one with the group's key codes: PSA's, and
    Sol's with its pooled keys shifted by the codes' mean. A pooled term on 128-row tiles has
    no quantized path there (``ws_supported``'s rule, as on a GPU)."""
    import kernels.engine.hopper_loop as hopper_loop
    import types

    from kernels.engine.tile_loop import tma_sub_frames

    monkeypatch.setattr(hopper_loop, "triton_interpreting", lambda: False)
    hopper = []
    fake = types.SimpleNamespace(ws_supported=hopper_loop.ws_supported,
                                 ws_block_sparse_attention=lambda *a, **kw: hopper.append(kw) or kw["out"])
    ran = []
    monkeypatch.setattr(engine, "load_hopper_loop", lambda: fake)
    real = engine.portable_attention
    monkeypatch.setattr(engine, "portable_attention", lambda *a, **kw: ran.append("portable") or real(*a, **kw))
    q, k, v = qkv(1, 6 * 16 * 32, 2, 64, torch.float16, seed=2)
    kw = dict(grid=(6, 16, 32), params=[[1, 0, 0, 2, 0, 0]] * 2, tile=(3, 8, 16), config=TMA_BOXES)
    for precision in ("bf16", "int8", "fp8"):
        kernels.psa_attention(q, k, v, precision=precision, **kw)
    assert ran == [] and hopper[0]["keys"] is None
    assert [call["keys"].codes.dtype for call in hopper[1:]] == [torch.int8, torch.float8_e4m3fn]
    assert hopper[1]["keys"].codes.shape == (1, 6 * 16 * 32, 2, 64)
    hopper.clear()
    q, k, v = qkv(1, 4 * 16 * 16, 2, 64, torch.float16, seed=3)
    for precision in ("bf16", "int8"):
        kernels.sol_attention(q, k, v, beta=1.0, grid=(4, 16, 16), config=TMA_BOXES, precision=precision)
    assert ran == [] and hopper[0]["keys"] is None and hopper[1]["block_m"] == 64
    keys, pooled = hopper[1]["keys"], hopper[1]["pooled"]
    assert keys.codes.dtype == torch.int8 and keys.codes.shape == (1, 4 * 16 * 16, 2, 64)
    torch.testing.assert_close(pooled.k_mean, shifted_pooled_keys(hopper[0]["pooled"].k_mean, keys.mean),
                               rtol=0, atol=0)
    layout = block_layout((2, 8, 16), (2, 8, 8))  # 128-token blocks: 128-row query tiles
    q, k, v = qkv(1, 2 * 8 * 16, 2, 64, torch.float16, seed=4)
    sub_frames = tma_sub_frames(layout.tile)
    assert hopper_loop.ws_supported(q, k, v, layout, 128, sub_frames, TMA_BOXES.num_stages, pooled=True)
    assert not hopper_loop.ws_supported(q, k, v, layout, 128, sub_frames, TMA_BOXES.num_stages, pooled=True,
                                        quantized=True)
    assert engine.work_bytes_per_head(q, k, v, layout, pooled=False, config=TMA_BOXES, precision="int8") > \
        engine.work_bytes_per_head(q, k, v, layout, pooled=False, config=POINTER_LOOP, precision="bf16")


def test_every_int8_launch_runs_on_the_inputs_device(monkeypatch):
    """The key sums, the key quantization and Sol's pooling pass launch under a device guard too."""
    import kernels._device
    import kernels.engine.quantize
    import kernels.sol_gpu_routing

    seen = []
    real = kernels._device.device_guard
    for module in (engine, kernels.engine.quantize, kernels.sol_gpu_routing):
        monkeypatch.setattr(module, "device_guard", lambda t: seen.append(("guard", t.device)) or real(t))
    q, k, v = qkv(1, 130, 1, 64, torch.float16, seed=4)
    kernels.psa_attention(q, k, v, grid=(2, 5, 13), params=[[1, 0, 0, 1, 0, 0]], tile=(1, 4, 4), precision="int8")
    assert len(seen) == 2  # the key sums, the quantization (the engine launches from portable.py, checked elsewhere)
    kernels.sol_attention(q, k, v, beta=1.0, precision="int8")
    assert len(seen) == 6 and all(d == q.device for _, d in seen)  # + pool, route, key sums, quantization


# ------------------------------------------------------------------------ the precision argument
@pytest.mark.parametrize("call", ["sol_attention", "psa_attention", "sol_attention_reference",
                                  "psa_attention_reference", "block_sparse_attention"])
def test_precision_is_checked_by_name(call):
    from kernels.block_mask import mask_from_dense

    q, k, v = qkv(1, 64, 1, 64, torch.float16, seed=1)
    lay = row_major_layout(64)
    calls = {
        "sol_attention": lambda p: kernels.sol_attention(q, k, v, beta=1.0, precision=p),
        "psa_attention": lambda p: kernels.psa_attention(q, k, v, grid=(1, 8, 8), params=[[1, 0, 0, 1, 0, 0]],
                                                         tile=(1, 8, 8), precision=p),
        "sol_attention_reference": lambda p: kernels.sol_attention_reference(q, k, v, beta=1.0, precision=p),
        "psa_attention_reference": lambda p: kernels.psa_attention_reference(
            q, k, v, grid=(1, 8, 8), params=[[1, 0, 0, 1, 0, 0]], tile=(1, 8, 8), precision=p),
        "block_sparse_attention": lambda p: engine.block_sparse_attention(
            q, k, v, mask_from_dense(torch.ones(1, 1, 1, 1, dtype=torch.bool), lay), scale=0.125, precision=p),
    }
    for bad in ("INT8", "FP8", "fp16", "e4m3", None, 8):
        with pytest.raises(ValueError, match="^precision: expected one of"):
            calls[call](bad)
    if call.endswith("reference"):
        with pytest.raises(ValueError, match="^precision: expected one of 'bf16', 'int8', 'fp8', got 'auto'"):
            calls[call]("auto")
    else:  # the interpreter's launch row is the Hopper row: auto is int8 for a static mask there
        from kernels.engine.precision import AUTO_PRECISION

        method = "sol" if call == "sol_attention" else "psa"
        torch.testing.assert_close(calls[call]("auto"), calls[call](AUTO_PRECISION[(9, 0)][method].precision),
                                   rtol=0, atol=0)


ROWS_WITHOUT_FP8 = {"sm_80": ARCHITECTURES[(8, 0)], "sm_86": ARCHITECTURES[(8, 6)],
                    "sm_87": dataclasses.replace(ARCHITECTURES[(8, 6)], name="RTX 30-like", capability=(8, 7))}


@pytest.mark.parametrize("arch", sorted(ROWS_WITHOUT_FP8))
@pytest.mark.parametrize("call", ["sol_attention", "psa_attention", "block_sparse_attention", "precision_for"])
def test_fp8_is_refused_where_there_are_no_fp8_tensor_cores(call, arch):
    """Before sm_89 (Triton refuses float8e4nv there: tools/compile_kernels.py records it) an
    fp8 call is a ValueError naming ``precision``, the architecture and the alternative, before
    anything runs; int8 runs there, and fp8 on the sm_89 row (the same pointer-loop launch)."""
    from kernels.block_mask import mask_from_dense
    from kernels.engine import precision as prec

    q, k, v = qkv(1, 64, 1, 64, torch.float16, seed=1)
    lay = row_major_layout(64)
    calls = {
        "sol_attention": lambda p, c: kernels.sol_attention(q, k, v, beta=1.0, precision=p, config=c),
        "psa_attention": lambda p, c: kernels.psa_attention(q, k, v, grid=(1, 8, 8), params=[[1, 0, 0, 1, 0, 0]],
                                                            tile=(1, 8, 8), precision=p, config=c),
        "block_sparse_attention": lambda p, c: engine.block_sparse_attention(
            q, k, v, mask_from_dense(torch.ones(1, 1, 1, 1, dtype=torch.bool), lay), scale=0.125, precision=p,
            config=c),
        "precision_for": lambda p, c: prec.resolve_precision(p, c, "psa"),
    }
    config = ROWS_WITHOUT_FP8[arch]
    with pytest.raises(ValueError, match=rf"^precision: 'fp8' needs fp8 tensor cores \(sm_89 or later\), and {arch} "
                                         rf"\(the {config.name} launch row\) has none: choose 'int8'"):
        calls[call]("fp8", config)
    calls[call]("int8", config)
    calls[call]("fp8", ARCHITECTURES[(8, 9)])


def test_fp8_needs_cuda_tensors_outside_the_interpreter(monkeypatch):
    """As for int8: without the interpreter a CPU tensor is refused before anything runs (the
    reference is what runs on the CPU)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = qkv(1, 64, 1, 64, torch.float16, seed=1)
    for call in (lambda: kernels.sol_attention(q, k, v, beta=1.0, precision="fp8"),
                 lambda: kernels.psa_attention(q, k, v, grid=(1, 8, 8), params=[[1, 0, 0, 1, 0, 0]], tile=(1, 8, 8),
                                               precision="fp8")):
        with pytest.raises(ValueError, match="^q/k/v must be CUDA tensors for the Triton kernel, got device cpu"):
            call()
    assert kernels.sol_attention_reference(q, k, v, beta=1.0, precision="fp8").isfinite().all()


def test_auto_picks_the_table_row_and_logs_it_once(caplog):
    """``auto`` is the AUTO_PRECISION row of the launch row's architecture and the method:
    int8 where it ran faster on the row's own MMA instruction (both methods on every
    pointer-loop row, PSA on the Hopper loop), bf16 elsewhere (fp8 adds more error than the bound),
    each reason a measurement or "not measured", the rows that launch the same kernels
    (sm_86, sm_89, sm_120) choosing alike, logged once per architecture and method; an unknown
    method is refused."""
    import logging

    from kernels.engine import precision as prec

    prec._logged_auto.cache_clear()
    assert set(prec.AUTO_PRECISION) == set(ARCHITECTURES)
    assert all(set(row) == {"sol", "psa"} for row in prec.AUTO_PRECISION.values())
    choices = [c for row in prec.AUTO_PRECISION.values() for c in row.values()]
    assert [(cap, method) for cap, row in prec.AUTO_PRECISION.items() for method, c in row.items()
            if c.precision != "bf16"] == [((8, 0), "sol"), ((8, 0), "psa"), ((8, 6), "sol"), ((8, 6), "psa"),
                                          ((8, 9), "sol"), ((8, 9), "psa"), ((9, 0), "psa"), ((12, 0), "sol"),
                                          ((12, 0), "psa")]
    assert all(c.precision in ("bf16", "int8") for c in choices)
    assert all(("int8 ran" in c.reason and "H100" in c.reason) or c.reason.endswith("not measured on this launch row")
               for c in choices)
    pointer_rows = [cap for cap, config in ARCHITECTURES.items() if not config.tma]
    assert all("mma.sync" in c.reason for cap in pointer_rows for c in prec.AUTO_PRECISION[cap].values())
    same_kernels = [cap for cap in pointer_rows
                    if dataclasses.replace(ARCHITECTURES[cap], name="", capability=(0, 0), reason="")
                    == dataclasses.replace(ARCHITECTURES[(8, 9)], name="", capability=(0, 0), reason="")]
    assert sorted(same_kernels) == [(8, 6), (8, 9), (12, 0)]
    assert all(prec.AUTO_PRECISION[cap] == prec.AUTO_PRECISION[(8, 9)] for cap in same_kernels)
    with caplog.at_level(logging.INFO, logger="sparse_video_attention.kernels"):
        for _ in range(3):
            choice = prec.resolve_precision("auto", ARCHITECTURES[(8, 9)], "psa")
        sol = prec.resolve_precision("auto", ARCHITECTURES[(8, 9)], "sol")
        prec.resolve_precision("auto", dataclasses.replace(ARCHITECTURES[(8, 6)], capability=(8, 7)), "psa")
    lines = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    assert lines == [f"[sparse-video-attention] precision auto for psa on sm_89 (the sm_89 row): {choice.describe()}",
                     f"[sparse-video-attention] precision auto for sol on sm_89 (the sm_89 row): {sol.describe()}",
                     "[sparse-video-attention] precision auto for psa on sm_87 (the sm_86 row): "
                     f"{prec.AUTO_PRECISION[(8, 6)]['psa'].describe()}"]
    assert choice.describe() == ("int8 (auto: int8 ran at 1.00x-1.12x bf16's speed at density 0.40 (near the "
                                 "shipped presets') and 0.95x-1.07x at 0.15 on the grids of Wan 720p, "
                                 "HunyuanVideo 768p and the Wan 2.2 5B and 2.1 1.3B presets, adding 0.0003 rel-L2 "
                                 "(sm_86, sm_89 and sm_120 rows forced on an H100 with its mma.sync and its SM's "
                                 "shared memory))")
    assert sol.precision == "int8" and "faster" in sol.reason
    assert prec.resolve_precision("auto", ARCHITECTURES[(10, 0)], "sol").describe() == \
        "bf16 (auto: int8 not measured on this launch row)"
    assert prec.resolve_precision("int8", POINTER_LOOP, "sol").describe() == "int8 (asked for)"
    assert prec.resolve_precision("int8", TMA_BOXES, "psa").describe() == "int8 (asked for)"
    assert prec.resolve_precision("fp8", TMA_BOXES, "sol").describe() == "fp8 (asked for)"
    with pytest.raises(ValueError, match="^method: expected one of 'sol', 'psa', got 'sol_attn'"):
        prec.resolve_precision("auto", POINTER_LOOP, "sol_attn")
    # the public form, for a device (the interpreter's is the Hopper row)
    assert kernels.precision_for_device("int8", "cpu", "psa") == prec.resolve_precision("int8", TMA_BOXES, "psa")
    assert kernels.check_precision("fp8") == "fp8" and kernels.PRECISIONS == ("auto", "bf16", "int8", "fp8")

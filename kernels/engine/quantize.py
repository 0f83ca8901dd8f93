"""The quantized operands of the exact blocks' QKᵀ (``precision`` "int8" or "fp8"; float
reference: ``quantized_reference``, whose codes and scales are bit-identical to these).

Both formats share one structure (:data:`CODE_FORMATS`: the codes' dtype and their bound B,
127 for int8, 448 for float8 e4m3). Keys, per (batch, head), are smoothed, then quantized per
key block of the ``BlockLayout``:

- smoothing mean m (D,) float32: the mean of k over the sequence's tokens, summed in float64
  (exact for half-precision inputs of any usual range, so the kernels' sum and the
  reference's agree bit for bit whatever their order) and rounded once to float32, in a pass
  over the group's k of its own (:func:`key_means`), for both methods;
- per key block j, over its real tokens (padding slots are left out): d = k − m in float32,
  a_j = max |d|, s_j = a_j / B, y = d / s_j, code = the rounding of y
  (:func:`code_range`, :func:`code_scale`, :func:`encode`): int8 floor(y + 0.5) in
  [−127, 127]; fp8 the nearest e4m3 value, ties to even (:func:`e4m3_grid`).

Queries are quantized the same way (without smoothing) per query tile, the ``block_m`` rows
a program of the portable kernel owns, inside that kernel (:func:`quantize_query_tile`): the
tile is resident there, so this costs no pass over q and no scratch. The exact logit of (row
r, key t of block j) is dot(code_q, code_k) (int32, or float32 accumulation for fp8) times
s_q · s_j · the softmax scale. Subtracting m changes every logit of a row by the same q·m,
which softmax ignores, provided every column of the row sees it: Sol's pooled keys become
K̄_j − m, rounded to the input dtype (:func:`shifted`).

The rounding, exactly: both divisions are IEEE round-to-nearest (``tl.math.div_rn``, PTX
``div.rn.f32``), and |y| <= B·(1 + 2⁻²³)². int8: then + 0.5 (``add.f32``: no multiply, so
nothing is fused into an FMA) and ``floor`` (``cvt.rmi``); the result is an integer in
[−127, 127] (< 127.5), so the conversion to int8 is exact; that conversion alone would
truncate toward zero (``.to(tl.int8)`` compiles to ``cvt.rzi.s16.f32`` and a byte store, which
wraps outside the int8 range, and the interpreter's numpy cast truncates too). fp8: y is
rounded to the e4m3 grid in float32 arithmetic (:func:`e4m3_grid`; |y| < 464, so to at most
448 and the saturation never acts), and the conversion to float8e4nv is then exact. Left to
the conversion alone, the rounding would differ by architecture and in the interpreter:
Triton compiles fp32 → float8e4nv to ``cvt.rn.satfinite.e4m3x2.f32`` on sm_90, sm_100 and
sm_120 but to ``cvt.rz.f16.f32`` then ``cvt.rn.satfinite.e4m3x2.f16x2`` on sm_89 (a double
rounding: a value just above a tie lands on it, then goes to even), and the interpreter's
conversion rounds ties away and can carry a mantissa overflow into the wrong exponent
(31.6 → 16); Triton refuses float8e4nv on sm_80 and sm_86 (``precision`` refuses "fp8"
there). A block of zeros has s_j = 0 and codes 0; a block with a NaN or an infinity has
s_j = NaN (codes 0), so NaN in gives NaN out, for the whole head when it is in k (m is NaN),
for the query tile's rows when it is in q.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from .._device import device_guard
from .._triton_common import head_offset
from ..block_mask import BlockLayout, PooledBlocks

__all__ = ["CodeFormat", "CODE_FORMATS", "QuantizedKeys", "quantize_keys", "key_means", "mean_of_sums", "shifted",
           "quantized_key_bytes", "key_code_bytes", "codes_in_free_heads", "quantize_query_tile", "code_range",
           "code_scale", "encode", "e4m3_grid"]

KEY_CHUNK = 64  # key slots per step of _quantize_keys_kernel
# _key_sums_kernel: tokens per program, and per step. A span of 1024 gives about two programs
# an SM for three heads at Wan 720p (75,600 tokens); 64 rows a step read k at twice the rate
# of 32 (benchmarks/bench_key_sums.py; spans of 256-1024 tie).
KEY_SUM_SPAN = 1024
KEY_SUM_ROWS = 64


@dataclass(frozen=True)
class CodeFormat:
    """The codes of one quantized ``precision``: their torch and Triton dtypes and ``bound``,
    the code a block's largest |x| maps to (the scale is that |x| / bound)."""

    precision: str
    torch_dtype: torch.dtype
    triton_dtype: object
    bound: float


INT8_BOUND = tl.constexpr(127.0)
E4M3_MAX = tl.constexpr(448.0)  # the largest finite float8 e4m3fn (the "fn" format has no infinities; 0x7F is NaN)

CODE_FORMATS = {
    "int8": CodeFormat("int8", torch.int8, tl.int8, INT8_BOUND.value),
    "fp8": CodeFormat("fp8", torch.float8_e4m3fn, tl.float8e4nv, E4M3_MAX.value),
}


@triton.jit
def code_bound(CODE_DTYPE: tl.constexpr):
    """What a tile's largest |x| becomes: 127 for int8 codes, 448 for float8 e4m3 ones."""
    if CODE_DTYPE == tl.int8:
        bound = INT8_BOUND
    else:
        bound = E4M3_MAX
    return bound


@triton.jit
def code_range(x, keep):
    """(largest |x| over the finite entries where ``keep``, whether a kept entry is NaN or
    infinite) of a 2D float32 tile."""
    mag = tl.where(keep, tl.abs(x), 0.0)
    finite = mag < float("inf")  # False for NaN too
    amax = tl.max(tl.max(tl.where(finite, mag, 0.0), 1), 0)
    bad = tl.max(tl.max((finite == 0).to(tl.int32), 1), 0) > 0
    return amax, bad


@triton.jit
def code_scale(amax, bad, CODE_DTYPE: tl.constexpr):
    """(the scale kept with the codes: amax / the code bound, NaN for a tile with a non-finite
    entry; the divisor of the codes: that scale, or 1 for an all-zero or non-finite tile)."""
    scale = tl.math.div_rn(amax, code_bound(CODE_DTYPE))
    divisor = tl.where((amax > 0) & (bad == 0), scale, 1.0)
    return tl.where(bad, float("nan"), scale), divisor


@triton.jit
def e4m3_grid(y):
    """Finite float32 ``y`` rounded to the nearest float8 e4m3 value, ties to even, at most
    ±448 (round-to-nearest with saturation, as ``cvt.rn.satfinite`` and PyTorch's conversion
    to float8_e4m3fn round), still in float32: the spacing u of e4m3 values at |y| (2^(e−3) for
    2^e <= |y|, e >= −6; 2^−9 below) is made the unit in the last place of |y| + 1.5·2²³·u, so
    the float32 addition rounds (ties to even) and the subtraction is exact. Two additions, no
    multiply: nothing for fp-fusion to fuse. The sign is copied back bit for bit (−0 stays −0)."""
    bits = y.to(tl.int32, bitcast=True)
    mag = tl.abs(y)
    biased = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # the exponent of |y|, at least e4m3's smallest normal
    magic = (((biased + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5·2^(23 + e − 3)
    rounded = tl.minimum((mag + magic) - magic, E4M3_MAX)
    return (rounded.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def encode(x, divisor, bad, CODE_DTYPE: tl.constexpr):
    """The codes of x / divisor (0 everywhere in a tile with a non-finite entry): int8
    floor(x / divisor + 0.5), float8 e4m3 the nearest value (:func:`e4m3_grid`, then converted
    exactly)."""
    y = tl.math.div_rn(tl.where(bad, 0.0, x), divisor)
    if CODE_DTYPE == tl.int8:
        codes = tl.floor(y + 0.5).to(tl.int8)
    else:
        codes = e4m3_grid(y).to(CODE_DTYPE)
    return codes


@triton.jit
def quantize_query_tile(q, row_ok, CODE_DTYPE: tl.constexpr):
    """(codes of ``CODE_DTYPE``, scale float32) of a query tile ``q`` (BLOCK_M, D) whose rows
    ``row_ok`` hold tokens (the others are zeros): one scale for the tile, no smoothing."""
    x = q.to(tl.float32)
    amax, bad = code_range(x, row_ok[:, None])
    scale, divisor = code_scale(amax, bad, CODE_DTYPE)
    return encode(x, divisor, bad, CODE_DTYPE), scale


@triton.jit
def _smoothed_rows(k_base, stride_kn, ROW_MAP, blk, c0, mean, offs_c, offs_d, BLOCK_TOKENS: tl.constexpr):
    """Slots c0 .. c0 + CHUNK of block ``blk``: k − m in float32 (B·…: (CHUNK, D)), which slots
    hold a token, and their tokens."""
    local = c0 + offs_c
    rows = tl.load(ROW_MAP + blk * BLOCK_TOKENS + local, mask=local < BLOCK_TOKENS, other=-1)
    ok = rows >= 0
    rows = tl.maximum(rows, 0).to(tl.int64)
    x = tl.load(k_base + rows[:, None] * stride_kn + offs_d[None, :], mask=ok[:, None], other=0.0)
    return x.to(tl.float32) - mean[None, :], ok, rows


@triton.jit
def _quantize_keys_kernel(
    K, MEAN, CODES, SCALES, ROW_MAP,
    stride_kb, stride_kn, stride_kh, stride_cb, stride_cn, stride_ch,
    head_base, group_heads, num_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, CHUNK: tl.constexpr, CODE_DTYPE: tl.constexpr,
):
    # One program per (key block, batch·head of the group): the block's scale over its real
    # tokens in a first walk, its codes in a second (the block's rows come back from L2).
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // group_heads
    hl = bh % group_heads  # the head in the group: the codes hold the group's heads only
    h = head_base + hl
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    k_base = K + head_offset(b, h, stride_kb, stride_kh)
    c_base = CODES + head_offset(b, hl, stride_cb, stride_ch)
    mean = tl.load(MEAN + bh.to(tl.int64) * HEAD_DIM + offs_d)
    amax = tl.zeros([], dtype=tl.float32)
    bad = tl.zeros([], dtype=tl.int1)
    for c0 in range(0, BLOCK_TOKENS, CHUNK):
        d, ok, _ = _smoothed_rows(k_base, stride_kn, ROW_MAP, blk, c0, mean, offs_c, offs_d, BLOCK_TOKENS)
        chunk_max, chunk_bad = code_range(d, ok[:, None])
        amax = tl.maximum(amax, chunk_max)
        bad = bad | chunk_bad
    scale, divisor = code_scale(amax, bad, CODE_DTYPE)
    for c0 in range(0, BLOCK_TOKENS, CHUNK):
        d, ok, rows = _smoothed_rows(k_base, stride_kn, ROW_MAP, blk, c0, mean, offs_c, offs_d, BLOCK_TOKENS)
        tl.store(c_base + rows[:, None] * stride_cn + offs_d[None, :], encode(d, divisor, bad, CODE_DTYPE),
                 mask=ok[:, None])
    tl.store(SCALES + bh.to(tl.int64) * num_blocks + blk, scale)


@dataclass(frozen=True)
class QuantizedKeys:
    """k of a group of heads as the quantized exact blocks read it: ``codes`` (B, L, Hg, D),
    int8 or float8_e4m3fn (:data:`CODE_FORMATS`), in token order (read through the layout's
    slot map, or TMA boxes, as k is), ``scales`` float32 (B, Hg, NB), one per key block,
    ``mean`` float32 (B, Hg, D), the smoothing mean subtracted before quantizing."""

    codes: torch.Tensor
    scales: torch.Tensor
    mean: torch.Tensor


def mean_of_sums(sums: torch.Tensor, count: int) -> torch.Tensor:
    """float64 ``sums`` / ``count`` rounded once to float32: the smoothing mean from its sums.
    The divisor is a tensor on the sums' device: PyTorch on CUDA multiplies by the reciprocal
    of a Python number instead of dividing, which can differ in the last bit."""
    return torch.div(sums, torch.full_like(sums, float(count))).to(torch.float32).contiguous()


@triton.jit
def _key_sums_kernel(
    K, SUMS, stride_kb, stride_kn, stride_kh, head_base, group_heads, n_tokens,
    HEAD_DIM: tl.constexpr, SPAN: tl.constexpr, ROWS: tl.constexpr,
):
    # One program per (span of SPAN tokens, batch·head of the group): the span's sum per
    # channel in float64, ROWS tokens a step, read in place (no float64 copy of k).
    span = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // group_heads
    h = head_base + bh % group_heads
    k_base = K + head_offset(b, h, stride_kb, stride_kh)
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, HEAD_DIM)
    acc = tl.zeros([HEAD_DIM], dtype=tl.float64)
    for r0 in range(0, SPAN, ROWS):
        rows = span * SPAN + r0 + offs_r
        x = tl.load(k_base + rows.to(tl.int64)[:, None] * stride_kn + offs_d[None, :],
                    mask=(rows < n_tokens)[:, None], other=0.0)
        acc += tl.sum(x.to(tl.float64), 0)
    tl.store(SUMS + (span.to(tl.int64) * tl.num_programs(1) + bh) * HEAD_DIM + offs_d, acc)


def key_means(k: torch.Tensor, head_base: int, group_heads: int) -> torch.Tensor:
    """The smoothing means of heads head_base .. + Hg of k (B, L, H, D): float32 (B, Hg, D), the
    mean over the sequence summed in float64 (:func:`_key_sums_kernel`: one pass over those
    heads of k, float64 sums per span of ``KEY_SUM_SPAN`` tokens, then over the spans)."""
    B, L, _, D = k.shape
    n_spans = triton.cdiv(L, KEY_SUM_SPAN)
    sums = torch.empty((n_spans, B, group_heads, D), device=k.device, dtype=torch.float64)
    with device_guard(k):
        _key_sums_kernel[(n_spans, B * group_heads)](
            K=k, SUMS=sums, stride_kb=k.stride(0), stride_kn=k.stride(1), stride_kh=k.stride(2),
            head_base=head_base, group_heads=group_heads, n_tokens=L,
            HEAD_DIM=D, SPAN=KEY_SUM_SPAN, ROWS=KEY_SUM_ROWS,
        )
    return mean_of_sums(sums.sum(dim=0), L)


def quantize_keys(k: torch.Tensor, layout: BlockLayout, head_base: int, group_heads: int,
                  precision: str = "int8", codes: Optional[torch.Tensor] = None) -> QuantizedKeys:
    """The :class:`QuantizedKeys` of heads head_base .. + Hg of k (B, L, H, D) in the codes of
    ``precision`` ("int8" or "fp8", :data:`CODE_FORMATS`), smoothed by their means
    (:func:`key_means`); ``codes``: where to write the codes, (B, L, Hg, D) of the
    format's dtype with unit last stride (default: a new contiguous tensor; a caller may lend
    memory it has not written yet, :func:`codes_in_free_heads`)."""
    code = CODE_FORMATS[precision]
    B, L, _, D = k.shape
    mean = key_means(k, head_base, group_heads)
    if codes is None:
        codes = torch.empty((B, L, group_heads, D), device=k.device, dtype=code.torch_dtype)
    scales = torch.empty((B, group_heads, layout.n_blocks), device=k.device, dtype=torch.float32)
    with device_guard(k):
        _quantize_keys_kernel[(layout.n_blocks, B * group_heads)](
            K=k, MEAN=mean, CODES=codes, SCALES=scales, ROW_MAP=layout.row_map,
            stride_kb=k.stride(0), stride_kn=k.stride(1), stride_kh=k.stride(2),
            stride_cb=codes.stride(0), stride_cn=codes.stride(1), stride_ch=codes.stride(2),
            head_base=head_base, group_heads=group_heads, num_blocks=layout.n_blocks,
            HEAD_DIM=D, BLOCK_TOKENS=layout.block_tokens,
            CHUNK=min(KEY_CHUNK, triton.next_power_of_2(layout.block_tokens)), CODE_DTYPE=code.triton_dtype,
        )
    return QuantizedKeys(codes, scales, mean)


def codes_in_free_heads(out: torch.Tensor, first_head: int, group_heads: int, precision: str) -> torch.Tensor:
    """A (B, L, group_heads, D) tensor of ``precision``'s codes laid in the bytes of heads
    ``first_head`` .. of ``out`` (B, L, H, D), contiguous, in a 2-byte dtype: each token's codes in
    that token's row of those heads, so they take ⌈group_heads / 2⌉ of them. For a caller whose
    output's later heads are not written yet: its codes then cost no scratch. The codes' token
    stride is out's, a multiple of 16 bytes wherever out's is, so TMA can box them as it boxes k.
    A ValueError when they do not fit."""
    B, L, H, D = out.shape
    per_head = D * out.element_size()  # code bytes one head of out holds per token
    start, end = first_head * per_head, first_head * per_head + group_heads * D
    if not out.is_contiguous() or first_head < 0 or end > H * per_head:
        raise ValueError(f"codes of {group_heads} heads do not fit in heads {first_head}.. of a "
                         f"{'non-contiguous ' if not out.is_contiguous() else ''}output of {H} heads")
    rows = out.view(CODE_FORMATS[precision].torch_dtype).view(B, L, H * per_head)
    return rows[:, :, start:end].unflatten(2, (group_heads, D))


def shifted(pooled: PooledBlocks, mean: torch.Tensor) -> PooledBlocks:
    """Sol's pooled term on the logit scale of smoothed keys: K̄_j − m, rounded to the input
    dtype (the term stays in it); the mean values and lengths unchanged."""
    k_mean = torch.sub(pooled.k_mean, mean[:, :, None, :]).to(pooled.k_mean.dtype)  # in float32: one temporary
    return PooledBlocks(k_mean, pooled.v_mean, pooled.log2_len)


def key_code_bytes(layout: BlockLayout, head_dim: int) -> int:
    """Device memory of one head of one batch entry's key codes (one byte a code, int8 or fp8):
    the part of the quantized keys a call may lay in its output's unwritten heads
    (:func:`codes_in_free_heads`)."""
    return layout.n_tokens * head_dim


def quantized_key_bytes(layout: BlockLayout, head_dim: int, itemsize: int, pooled: bool) -> int:
    """Device memory of one head of one batch entry's quantized keys besides their codes
    (:func:`key_code_bytes`): the float64 sums of :func:`key_means` per span, scales, mean, and
    the shifted pooled keys of Sol's term (``pooled``)."""
    n = layout.n_blocks
    sums = triton.cdiv(layout.n_tokens, KEY_SUM_SPAN) * head_dim * 8
    return sums + 4 * n + 4 * head_dim + (n * head_dim * itemsize if pooled else 0)

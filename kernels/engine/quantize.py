"""The int8 operands of the exact blocks' QKᵀ (``precision`` "int8"; float reference:
``quantized_reference``, whose int8 operands are bit-identical to these).

Keys, per (batch, head), are smoothed, then quantized per key block of the ``BlockLayout``:

- smoothing mean m (D,) float32: the mean of k over the sequence's tokens, summed in float64
  (exact for half-precision inputs of any usual range, so the kernels' sum and the
  reference's agree bit for bit whatever their order) and rounded once to float32. Sol's
  pooling pass writes the float64 block sums on its way (``sol_gpu_routing.pool_blocks``);
  PSA, with no pass over k of its own, sums with PyTorch (:func:`key_means`);
- per key block j, over its real tokens (padding slots are left out): d = k − m in float32,
  a_j = max |d|, s_j = a_j / 127, code = floor(d / s_j + 0.5) in [−127, 127]
  (:func:`int8_range`, :func:`int8_scale`, :func:`int8_codes`).

Queries are quantized the same way (without smoothing) per query tile, the ``block_m`` rows
a program of the portable kernel owns, inside that kernel (:func:`quantize_query_tile`): the
tile is resident there, so this costs no pass over q and no scratch. The exact logit of (row r, key t of block j) is
dot(code_q, code_k) in int32 times s_q · s_j · the softmax scale. Subtracting m changes
every logit of a row by the same q·m, which softmax ignores, provided every column of the row
sees it: Sol's pooled keys become K̄_j − m, rounded to the input dtype (:func:`shifted`).

The rounding, exactly: both divisions are IEEE round-to-nearest (``tl.math.div_rn``, PTX
``div.rn.f32``), then + 0.5 (``add.f32``: no multiply, so nothing is fused into an FMA) and
``floor`` (``cvt.rmi``). The result is an integer in [−127, 127] (|d| / s_j ≤ 127·(1 + 2⁻²³)²
< 127.5), so the conversion to int8 is exact; that conversion alone would truncate toward zero
(``.to(tl.int8)`` compiles to ``cvt.rzi.s16.f32`` and a byte store, which wraps outside the
int8 range, and the interpreter's numpy cast truncates too). A block of zeros has s_j = 0 and
codes 0; a block with a NaN or an infinity has s_j = NaN (codes 0), so NaN in gives NaN out,
for the whole head when it is in k (m is NaN), for the query tile's rows when it is in q.
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

__all__ = ["QuantizedKeys", "quantize_keys", "key_means", "mean_of_sums", "shifted", "quantized_key_bytes",
           "quantize_query_tile", "int8_range", "int8_scale", "int8_codes"]

INT8_MAX = tl.constexpr(127.0)
KEY_CHUNK = 64  # key slots per step of _quantize_keys_kernel


@triton.jit
def int8_range(x, keep):
    """(largest |x| over the finite entries where ``keep``, whether a kept entry is NaN or
    infinite) of a 2D float32 tile."""
    mag = tl.where(keep, tl.abs(x), 0.0)
    finite = mag < float("inf")  # False for NaN too
    amax = tl.max(tl.max(tl.where(finite, mag, 0.0), 1), 0)
    bad = tl.max(tl.max((finite == 0).to(tl.int32), 1), 0) > 0
    return amax, bad


@triton.jit
def int8_scale(amax, bad):
    """(the scale kept with the codes: amax / 127, NaN for a tile with a non-finite entry;
    the divisor of the codes: that scale, or 1 for an all-zero or non-finite tile)."""
    scale = tl.math.div_rn(amax, INT8_MAX)
    divisor = tl.where((amax > 0) & (bad == 0), scale, 1.0)
    return tl.where(bad, float("nan"), scale), divisor


@triton.jit
def int8_codes(x, divisor, bad):
    """floor(x / divisor + 0.5) as int8 (0 everywhere in a tile with a non-finite entry)."""
    y = tl.math.div_rn(tl.where(bad, 0.0, x), divisor)
    return tl.floor(y + 0.5).to(tl.int8)


@triton.jit
def quantize_query_tile(q, row_ok):
    """(codes int8, scale float32) of a query tile ``q`` (BLOCK_M, D) whose rows ``row_ok``
    hold tokens (the others are zeros): one scale for the tile, no smoothing."""
    x = q.to(tl.float32)
    amax, bad = int8_range(x, row_ok[:, None])
    scale, divisor = int8_scale(amax, bad)
    return int8_codes(x, divisor, bad), scale


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
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, CHUNK: tl.constexpr,
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
        chunk_max, chunk_bad = int8_range(d, ok[:, None])
        amax = tl.maximum(amax, chunk_max)
        bad = bad | chunk_bad
    scale, divisor = int8_scale(amax, bad)
    for c0 in range(0, BLOCK_TOKENS, CHUNK):
        d, ok, rows = _smoothed_rows(k_base, stride_kn, ROW_MAP, blk, c0, mean, offs_c, offs_d, BLOCK_TOKENS)
        tl.store(c_base + rows[:, None] * stride_cn + offs_d[None, :], int8_codes(d, divisor, bad), mask=ok[:, None])
    tl.store(SCALES + bh.to(tl.int64) * num_blocks + blk, scale)


@dataclass(frozen=True)
class QuantizedKeys:
    """k of a group of heads as the int8 exact blocks read it: ``codes`` int8 (B, L, Hg, D) in
    token order (read through the layout's slot map, or TMA boxes, as k is), ``scales``
    float32 (B, Hg, NB), one per key block, ``mean`` float32 (B, Hg, D), the smoothing mean
    subtracted before quantizing."""

    codes: torch.Tensor
    scales: torch.Tensor
    mean: torch.Tensor


def mean_of_sums(sums: torch.Tensor, count: int) -> torch.Tensor:
    """float64 ``sums`` / ``count`` rounded once to float32: the smoothing mean from its sums.
    The divisor is a tensor on the sums' device: PyTorch on CUDA multiplies by the reciprocal
    of a Python number instead of dividing, which can differ in the last bit."""
    return torch.div(sums, torch.full_like(sums, float(count))).to(torch.float32).contiguous()


def key_means(k: torch.Tensor, head_base: int, group_heads: int) -> torch.Tensor:
    """The smoothing means of heads head_base .. + Hg: float32 (B, Hg, D), the mean over the
    sequence summed in float64 (one PyTorch pass over those heads of k)."""
    heads = k[:, :, head_base:head_base + group_heads]
    return mean_of_sums(torch.sum(heads, dim=1, dtype=torch.float64), k.shape[1])


def quantize_keys(k: torch.Tensor, layout: BlockLayout, head_base: int, group_heads: int,
                  mean: Optional[torch.Tensor] = None) -> QuantizedKeys:
    """The :class:`QuantizedKeys` of heads head_base .. + Hg of k (B, L, H, D); ``mean``: their
    smoothing means (default :func:`key_means`)."""
    B, L, _, D = k.shape
    mean = key_means(k, head_base, group_heads) if mean is None else mean.to(torch.float32).contiguous()
    codes = torch.empty((B, L, group_heads, D), device=k.device, dtype=torch.int8)
    scales = torch.empty((B, group_heads, layout.n_blocks), device=k.device, dtype=torch.float32)
    with device_guard(k):
        _quantize_keys_kernel[(layout.n_blocks, B * group_heads)](
            K=k, MEAN=mean, CODES=codes, SCALES=scales, ROW_MAP=layout.row_map,
            stride_kb=k.stride(0), stride_kn=k.stride(1), stride_kh=k.stride(2),
            stride_cb=codes.stride(0), stride_cn=codes.stride(1), stride_ch=codes.stride(2),
            head_base=head_base, group_heads=group_heads, num_blocks=layout.n_blocks,
            HEAD_DIM=D, BLOCK_TOKENS=layout.block_tokens,
            CHUNK=min(KEY_CHUNK, triton.next_power_of_2(layout.block_tokens)),
        )
    return QuantizedKeys(codes, scales, mean)


def shifted(pooled: PooledBlocks, mean: torch.Tensor) -> PooledBlocks:
    """Sol's pooled term on the logit scale of smoothed keys: K̄_j − m, rounded to the input
    dtype (the term stays in it); the mean values and lengths unchanged."""
    k_mean = (pooled.k_mean.float() - mean[:, :, None, :]).to(pooled.k_mean.dtype)
    return PooledBlocks(k_mean, pooled.v_mean, pooled.log2_len)


def quantized_key_bytes(layout: BlockLayout, head_dim: int, itemsize: int, pooled: bool) -> int:
    """Device memory of one head of one batch entry's int8 keys: codes, scales, mean, and the
    shifted pooled keys of Sol's term (``pooled``)."""
    n = layout.n_blocks
    return layout.n_tokens * head_dim + 4 * n + 4 * head_dim + (n * head_dim * itemsize if pooled else 0)

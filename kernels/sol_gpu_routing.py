"""Sol-Attn's per-call routing on the GPU: pooled block means, then a compact block mask.

Two light kernels per group of heads, before the engine (``engine``) runs:

1. ``_pool_kernel``: one program per (block, batch·head) reads the block's rows of q, k and v
   in place (slot map) and writes their means Q̄, K̄, V̄ (B, Hg, N, D) in float32; PyTorch
   rounds them to the input dtype (Triton's CPU interpreter truncates float32 to bfloat16
   instead of rounding, so the tests would see other means than the GPU). The quantized (int8,
   fp8) exact blocks' smoothing mean is the engine's own pass over k (``engine.quantize``):
   written here as float64 block sums it cost more scratch per head than that pass costs time
   (kernels/DESIGN.md, "The int8 exact blocks").
2. ``_route_kernel``: one program per ``ROUTE_ROWS`` query blocks of one (batch, head) walks the
   pooled keys twice in chunks of 64. The first pass computes its rows' thresholds τ
   (``_row_thresholds``; the float reference is ``sol_rules.block_thresholds``); the second
   compares the tile ŝ = s·Q̄·K̄ᵀ with τ (and the forced columns), sets the picked columns in
   each query block's bitmap (one int64 word per chunk) and writes the counts of grid and
   extra blocks: the ``BlockMask``. Every program of a head recomputes the head's statistics:
   that costs less than the dozen small launches of a separate pass.

The engine then lowers the mask to the work form of its backend (id lists or pair streams)
and orders its programs, on the device too. At 75,600 tokens and 40 heads the routing and the
lowering take 1.5 ms of a 50 ms call on the H200. No count is read back to the host, so a
call never synchronises the device; the caller bounds the memory by running heads in groups
(``engine.head_groups``).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from ._device import device_guard
from ._triton_common import dot_dtype_for, head_offset
from .block_mask import BlockLayout, BlockMask, PooledBlocks

ROUTE_ROWS = 32   # query blocks per routing program (a dot operand: >= 16)
ROUTE_CHUNK = 64  # pooled keys per routing step: one bitmap word
# Warps of a pooling program: its three column sums cross fewer warps (H200, 75.6K tokens:
# 2 warps 0.63 ms, 4 warps 0.89, 8 warps 1.62).
POOL_WARPS = 2


@triton.jit
def _pool_kernel(
    Q, K, V, Q_MEAN, K_MEAN, V_MEAN, ROW_MAP, BLOCK_LEN,
    stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    head_base, group_heads, num_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, SLOTS: tl.constexpr,
):
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // group_heads
    h = head_base + bh % group_heads
    local = tl.arange(0, SLOTS)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = tl.load(ROW_MAP + blk * BLOCK_TOKENS + local, mask=local < BLOCK_TOKENS, other=-1)
    ok = (rows >= 0)[:, None]
    rows = tl.maximum(rows, 0).to(tl.int64)[:, None]
    inv_len = 1.0 / tl.load(BLOCK_LEN + blk).to(tl.float32)
    out = (bh.to(tl.int64) * num_blocks + blk) * HEAD_DIM + offs_d
    # All three loads before the first store: a store may alias a later load, so the compiler
    # would not move a load above it.
    xq = tl.load(Q + head_offset(b, h, stride_qb, stride_qh) + rows * stride_qn + offs_d[None, :], mask=ok,
                 other=0.0)
    xk = tl.load(K + head_offset(b, h, stride_kb, stride_kh) + rows * stride_kn + offs_d[None, :], mask=ok,
                 other=0.0)
    xv = tl.load(V + head_offset(b, h, stride_vb, stride_vh) + rows * stride_vn + offs_d[None, :], mask=ok,
                 other=0.0)
    tl.store(Q_MEAN + out, tl.sum(xq.to(tl.float32), 0) * inv_len)
    tl.store(K_MEAN + out, tl.sum(xk.to(tl.float32), 0) * inv_len)
    tl.store(V_MEAN + out, tl.sum(xv.to(tl.float32), 0) * inv_len)


@triton.jit
def _key_chunk(K_MEAN, base, c0, offs_c, offs_d, num_blocks, HEAD_DIM: tl.constexpr):
    """Pooled keys c0 .. c0 + CHUNK of one (batch, head) (``base`` = its first row): their ids,
    which exist, and the (CHUNK, D) tile (0 past the last block). Both router passes walk these."""
    cols = c0 + offs_c
    col_ok = cols < num_blocks
    km = tl.load(K_MEAN + (base + cols[:, None]) * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    return cols, col_ok, km


@triton.jit
def _merge_chunk(mean, m2, n_seen, values, ok, n_chunk, AXIS: tl.constexpr):
    """Chan et al.'s parallel variance: the running mean and sum of squared deviations along
    ``AXIS`` (``n_seen`` values so far) merged with a chunk of ``n_chunk`` values where ``ok``
    (``values`` must be 0 elsewhere). No cancellation when |mean| >> spread, as a plain sum of
    squares would have."""
    c_mean = tl.sum(values, AXIS) / n_chunk
    dev = tl.where(ok, values - tl.expand_dims(c_mean, AXIS), 0.0)
    delta = c_mean - mean
    total = n_seen + n_chunk
    m2 = m2 + tl.sum(dev * dev, AXIS) + delta * delta * (n_seen * n_chunk / total)
    return mean + delta * (n_chunk / total), m2, total


@triton.jit
def _row_thresholds(qm, K_MEAN, base, beta, num_blocks, sm_scale, offs_c, offs_d,
                    ROWS: tl.constexpr, CHUNK: tl.constexpr, HEAD_DIM: tl.constexpr, EXACT: tl.constexpr,
                    DOT_DTYPE: tl.constexpr):
    """τ (ROWS,) of the query blocks whose rounded means are ``qm``: ``sol_rules.block_thresholds``
    (its float reference) in one pass over the pooled keys, chunk statistics merged by
    ``_merge_chunk``. Exact estimator: μ and σ² are the mean and variance of each row's proxy
    scores (the same tiles the routing pass compares); diagonal: of each key dimension,
    weighed by Q̄²."""
    n_seen = tl.zeros([], dtype=tl.float32)
    if EXACT:
        mean = tl.zeros([ROWS], dtype=tl.float32)
        m2 = tl.zeros([ROWS], dtype=tl.float32)
    else:
        mean = tl.zeros([HEAD_DIM], dtype=tl.float32)
        m2 = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for c0 in range(0, num_blocks, CHUNK):
        cols, col_ok, km = _key_chunk(K_MEAN, base, c0, offs_c, offs_d, num_blocks, HEAD_DIM)
        n_chunk = tl.minimum(num_blocks - c0, CHUNK).to(tl.float32)
        if EXACT:
            proxy = tl.dot(qm, tl.trans(km.to(DOT_DTYPE))) * sm_scale
            proxy = tl.where(col_ok[None, :], proxy, 0.0)
            mean, m2, n_seen = _merge_chunk(mean, m2, n_seen, proxy, col_ok[None, :], n_chunk, 1)
        else:
            mean, m2, n_seen = _merge_chunk(mean, m2, n_seen, km.to(tl.float32), col_ok[:, None], n_chunk, 0)
    if EXACT:
        mu = mean
        var = m2 / num_blocks
    else:
        qf = qm.to(tl.float32)
        mu = sm_scale * tl.sum(qf * mean[None, :], 1)
        var = sm_scale * sm_scale * tl.sum(qf * qf * (m2 / num_blocks)[None, :], 1)
    # A single block is always exact; β = ±inf selects every / no block whatever σ is (NaN too).
    beta = tl.where(num_blocks == 1, float("-inf"), beta)
    unbounded = (beta == float("inf")) | (beta == float("-inf"))
    return tl.where(unbounded, beta, mu + tl.where(unbounded, 0.0, beta) * tl.sqrt(var))


@triton.jit
def _route_kernel(
    Q_MEAN, K_MEAN, BETA, FORCED, COUNTS, BITS,
    num_blocks, n_grid_blocks, group_heads, bits_stride, sm_scale,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, EXACT_ESTIMATOR: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    bh = tl.program_id(1).to(tl.int64)
    qrows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = qrows < num_blocks
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    base = bh * num_blocks
    qm = tl.load(Q_MEAN + (base + qrows[:, None]) * HEAD_DIM + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    qm = qm.to(DOT_DTYPE)
    beta = tl.load(BETA + bh % group_heads)
    tau = _row_thresholds(qm, K_MEAN, base, beta, num_blocks, sm_scale, offs_c, offs_d,
                          ROWS, CHUNK, HEAD_DIM, EXACT_ESTIMATOR, DOT_DTYPE)
    tau = tl.where(row_ok, tau, float("inf"))
    list_rows = (base + qrows).to(tl.int64)
    n_picked = tl.zeros([ROWS], dtype=tl.int32)
    n_extra = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        cols, col_ok, km = _key_chunk(K_MEAN, base, c0, offs_c, offs_d, num_blocks, HEAD_DIM)
        proxy = tl.dot(qm, tl.trans(km.to(DOT_DTYPE))) * sm_scale
        forced = tl.load(FORCED + cols, mask=col_ok, other=0) != 0
        # "not <=": a NaN proxy or threshold makes the block exact (sol_rules.exact_blocks).
        picked = ((proxy <= tau[:, None]) == 0) | forced[None, :]
        picked = picked & col_ok[None, :] & row_ok[:, None]
        flags = picked.to(tl.int32)
        # Distinct bits: their sum is their OR.
        word = tl.sum(flags.to(tl.int64) << offs_c.to(tl.int64)[None, :], 1)
        tl.store(BITS + list_rows * bits_stride + c0 // CHUNK, word, mask=row_ok)
        n_picked += tl.sum(flags, 1)
        n_extra += tl.sum(flags * (cols >= n_grid_blocks).to(tl.int32)[None, :], 1)
    tl.store(COUNTS + list_rows * 2, n_picked - n_extra, mask=row_ok)
    tl.store(COUNTS + list_rows * 2 + 1, n_extra, mask=row_ok)


def pool_blocks(q, k, v, layout: BlockLayout, head_base: int, group_heads: int):
    """(Q̄, K̄, V̄), each (B, Hg, N, D) in the input dtype, for heads head_base .. + Hg."""
    B, _, _, D = q.shape
    n = layout.n_blocks
    means = torch.empty((3, B, group_heads, n, D), device=q.device, dtype=torch.float32)
    with device_guard(q):
        _pool_kernel[(n, B * group_heads)](
            Q=q, K=k, V=v, Q_MEAN=means[0], K_MEAN=means[1], V_MEAN=means[2],
            ROW_MAP=layout.row_map, BLOCK_LEN=layout.lengths,
            stride_qb=q.stride(0), stride_qn=q.stride(1), stride_qh=q.stride(2),
            stride_kb=k.stride(0), stride_kn=k.stride(1), stride_kh=k.stride(2),
            stride_vb=v.stride(0), stride_vn=v.stride(1), stride_vh=v.stride(2),
            head_base=head_base, group_heads=group_heads, num_blocks=n,
            HEAD_DIM=D, BLOCK_TOKENS=layout.block_tokens, SLOTS=triton.next_power_of_2(layout.block_tokens),
            num_warps=POOL_WARPS,
        )
    return means.to(q.dtype).unbind(0)  # one rounding launch for the three


@functools.lru_cache(maxsize=64)
def _log2_lengths(layout: BlockLayout) -> torch.Tensor:
    return layout.lengths.float().log2()


def route(q_mean, k_mean, beta, forced, layout: BlockLayout, *, estimator: str, scale: float) -> BlockMask:
    """The block mask of a group: ``q_mean``/``k_mean`` (B, Hg, N, D), ``beta`` float32 (Hg,),
    ``forced`` bool (N,). The kernel computes τ itself (its reference:
    ``sol_rules.block_thresholds``)."""
    B, Hg, n, D = q_mean.shape
    dev = q_mean.device
    counts = torch.empty((B, Hg, n, 2), device=dev, dtype=torch.int32)
    bits = torch.empty((B, Hg, n, -(-n // ROUTE_CHUNK)), device=dev, dtype=torch.int64)
    with device_guard(q_mean):
        _route_kernel[(triton.cdiv(n, ROUTE_ROWS), B * Hg)](
            Q_MEAN=q_mean, K_MEAN=k_mean, BETA=beta, FORCED=forced.view(torch.int8), COUNTS=counts, BITS=bits,
            num_blocks=n, n_grid_blocks=layout.n_grid_blocks, group_heads=Hg,
            bits_stride=bits.shape[-1], sm_scale=scale,
            HEAD_DIM=D, ROWS=ROUTE_ROWS, CHUNK=ROUTE_CHUNK, EXACT_ESTIMATOR=estimator == "exact",
            DOT_DTYPE=dot_dtype_for(q_mean.dtype),
        )
    return BlockMask(layout, counts, bits)


def pooled_term(k_mean, v_mean, layout: BlockLayout) -> PooledBlocks:
    return PooledBlocks(k_mean, v_mean, _log2_lengths(layout))


def routing_bytes_per_head(layout: BlockLayout, head_dim: int, itemsize: int) -> tuple[int, int]:
    """Device memory one head of one batch entry needs besides its output and the engine's work
    form: (while pooling: the float32 means and their rounded copies; from routing on: the
    rounded means, the counts and the bitmap)."""
    n = layout.n_blocks
    means = 3 * n * head_dim * itemsize
    return means + 3 * n * head_dim * 4, means + 8 * n + 8 * n * math.ceil(n / ROUTE_CHUNK)

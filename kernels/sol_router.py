"""Sol-Attn's per-call routing on the GPU: pooled block means, then a compact block mask.

Light kernels per group of heads, before the engine (``block_sparse``) runs:

1. ``_pool_kernel``: one program per (block, batch·head) reads the block's rows of q, k and v
   in place (slot map) and writes their means Q̄, K̄, V̄ (B, Hg, N, D) in float32; PyTorch
   rounds them to the input dtype (Triton's CPU interpreter truncates float32 to bfloat16
   instead of rounding, so the tests would see other means than the GPU).
2. ``_route_kernel``: one program per ``ROUTE_ROWS`` query blocks of one (batch, head) walks the
   pooled keys twice in chunks of 64. The first pass computes its rows' thresholds τ
   (``_row_thresholds``; the float reference is ``sol_routing.block_thresholds``); the second
   compares the tile ŝ = s·Q̄·K̄ᵀ with τ (and the forced columns, the ±1 neighbours with
   ``keep_diagonal``), appends the picked columns to each query block's id list (ascending,
   int16), sets them in its bitmap (one int64 word per chunk, read by the pooled term) and
   writes the counts of grid and extra blocks. Every program of a head recomputes the head's
   statistics: that costs less than the dozen small launches of a separate pass.
3. ``_heaviest_first_kernel``: the launch order of the engine's programs, each head's heaviest
   first by their exact-block counts (``work_by_count``, ``pair_work``).

On Hopper a fourth, ``_pair_steps_kernel``, merges the bitmaps of two neighbouring query
blocks into one stream of 128-key steps for the warp-specialised loop (``pair_streams``).
At 75,600 tokens and 40 heads they take 1.5 ms of a 50 ms call on the H200, in 5 launches
per group (``benchmarks/results/sol_host_path_h200``).

Lists have room for every block (``ids`` is (B, Hg, N, N); a call bound for the Hopper loop
writes none, ``route(lists=False)``): nothing is ever dropped and no count is read back to the
host, so a call never synchronises the device; the caller bounds the memory by running heads
in groups (``sol.head_groups``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .block_mask import BlockLayout, BlockMask, id_dtype
from .block_sparse import PooledBlocks, device_guard
from .tile_loop import dot_dtype_for, head_offset

ROUTE_ROWS = 32   # query blocks per routing program (a dot operand: >= 16)
ROUTE_CHUNK = 64  # pooled keys per routing step: one bitmap word
PAIR_ROWS = 8     # pair streams per program of _pair_steps_kernel (8: 0.39 ms at 75.6K, 16: 0.50)
# Warps of a pooling program: its three column sums cross fewer warps (H200, 75.6K: 2 warps
# 0.63 ms, 4 warps 0.89, 8 warps 1.62; benchmarks/results/sol_host_path_h200/call2).
POOL_WARPS = 2
ORDER_ROWS = 32   # programs ranked per program of _heaviest_first_kernel
ORDER_CHUNK = 128  # programs compared per step of _heaviest_first_kernel


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
    """τ (ROWS,) of the query blocks whose rounded means are ``qm``: ``sol_routing.block_thresholds``
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
    Q_MEAN, K_MEAN, BETA, FORCED, COUNTS, IDS, BITS,
    num_blocks, n_grid_blocks, group_heads, bits_stride, sm_scale,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, EXACT_ESTIMATOR: tl.constexpr,
    KEEP_DIAGONAL: tl.constexpr, LISTS: tl.constexpr, DOT_DTYPE: tl.constexpr,
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
        # "not <=": a NaN proxy or threshold makes the block exact (sol_routing.exact_blocks).
        picked = ((proxy <= tau[:, None]) == 0) | forced[None, :]
        if KEEP_DIAGONAL:
            picked = picked | (tl.abs(cols[None, :] - qrows[:, None]) <= 1)
        picked = picked & col_ok[None, :] & row_ok[:, None]
        flags = picked.to(tl.int32)
        # Distinct bits: their sum is their OR.
        word = tl.sum(flags.to(tl.int64) << offs_c.to(tl.int64)[None, :], 1)
        tl.store(BITS + list_rows * bits_stride + c0 // CHUNK, word, mask=row_ok)
        if LISTS:
            pos = n_picked[:, None] + tl.cumsum(flags, 1) - 1
            tl.store(IDS + list_rows[:, None] * num_blocks + pos, cols[None, :].to(IDS.dtype.element_ty),
                     mask=picked)
        n_picked += tl.sum(flags, 1)
        n_extra += tl.sum(flags * (cols >= n_grid_blocks).to(tl.int32)[None, :], 1)
    tl.store(COUNTS + list_rows * 2, n_picked - n_extra, mask=row_ok)
    tl.store(COUNTS + list_rows * 2 + 1, n_extra, mask=row_ok)


@triton.jit
def _pair_bits(first_bits, second_bits, first, second, c0, shift, CHUNK: tl.constexpr):
    """The routed bits (int32 0/1, (ROWS, CHUNK)) of both items of each pair, chunk ``c0``."""
    mine0 = (tl.load(first_bits + c0 // CHUNK, mask=first >= 0, other=0)[:, None] >> shift) & 1
    mine1 = (tl.load(second_bits + c0 // CHUNK, mask=second >= 0, other=0)[:, None] >> shift) & 1
    return mine0.to(tl.int32), mine1.to(tl.int32)


@triton.jit
def _interleaved_step(j, s_both, shorter):
    """Ring step of the j-th step of one item's own blocks: after the shared steps, the two
    items' own steps alternate (item 0 first) while both have some, then the longer goes on."""
    return s_both + tl.where(j < shorter, 2 * j, shorter + j)


@triton.jit
def _pair_steps_kernel(
    WORK, BITS, COUNTS, ENTRIES,
    n_pairs, num_blocks, items_per_batch, bits_stride, entries_stride,
    ROWS: tl.constexpr, CHUNK: tl.constexpr,
):
    # One row per pair (program of the Hopper loop): its steps of two key blocks, entries
    # 4·block + users (1: item 0 computes it, 2: item 1, 3: both), -1 for an empty half. The
    # blocks both items routed come first, two per step, then the blocks of one item alone,
    # two per step, the items' steps alternating: every step is for the same users in both
    # halves. Two passes over the bitmaps: the counts place the second pass's writes.
    b = tl.program_id(1).to(tl.int64)
    pairs = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    pair_ok = pairs < n_pairs
    first = tl.load(WORK + pairs * 2, mask=pair_ok, other=-1)
    second = tl.load(WORK + pairs * 2 + 1, mask=pair_ok, other=-1)
    first_bits = BITS + (b * items_per_batch + tl.maximum(first, 0)) * bits_stride
    second_bits = BITS + (b * items_per_batch + tl.maximum(second, 0)) * bits_stride
    row = ENTRIES + (b * n_pairs + pairs) * entries_stride
    offs_c = tl.arange(0, CHUNK)
    shift = offs_c.to(tl.int64)[None, :]
    n_both = tl.zeros([ROWS], dtype=tl.int32)
    n_own0 = tl.zeros([ROWS], dtype=tl.int32)
    n_own1 = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        mine0, mine1 = _pair_bits(first_bits, second_bits, first, second, c0, shift, CHUNK)
        n_both += tl.sum(mine0 & mine1, 1)
        n_own0 += tl.sum(mine0 & (1 - mine1), 1)
        n_own1 += tl.sum(mine1 & (1 - mine0), 1)
    s_both = (n_both + 1) // 2
    s_own0 = (n_own0 + 1) // 2
    s_own1 = (n_own1 + 1) // 2
    shorter = tl.minimum(s_own0, s_own1)
    k_both = tl.zeros([ROWS], dtype=tl.int32)
    k_own0 = tl.zeros([ROWS], dtype=tl.int32)
    k_own1 = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        cols = (c0 + offs_c)[None, :]
        mine0, mine1 = _pair_bits(first_bits, second_bits, first, second, c0, shift, CHUNK)
        both = mine0 & mine1
        own0 = mine0 & (1 - mine1)
        own1 = mine1 & (1 - mine0)
        at_both = k_both[:, None] + tl.cumsum(both, 1) - 1
        at_own0 = k_own0[:, None] + tl.cumsum(own0, 1) - 1
        at_own1 = k_own1[:, None] + tl.cumsum(own1, 1) - 1
        step0 = _interleaved_step(at_own0 // 2, s_both[:, None], shorter[:, None])
        step1 = (_interleaved_step(at_own1 // 2, s_both[:, None], shorter[:, None])
                 + (at_own1 // 2 < shorter[:, None]).to(tl.int32))
        at = tl.where(both != 0, at_both, tl.where(own0 != 0, 2 * step0 + at_own0 % 2, 2 * step1 + at_own1 % 2))
        tl.store(row[:, None] + at, (cols * 4 + mine0 + 2 * mine1).to(ENTRIES.dtype.element_ty),
                 mask=(mine0 | mine1) != 0)
        k_both += tl.sum(both, 1)
        k_own0 += tl.sum(own0, 1)
        k_own1 += tl.sum(own1, 1)
    # A group of odd size leaves the second half of its last step empty.
    empty = tl.full([ROWS], -1, dtype=tl.int32).to(ENTRIES.dtype.element_ty)
    tl.store(row + n_both, empty, mask=pair_ok & (n_both % 2 == 1))
    last0 = _interleaved_step(s_own0 - 1, s_both, shorter)
    tl.store(row + 2 * last0 + 1, empty, mask=pair_ok & (n_own0 % 2 == 1))
    last1 = _interleaved_step(s_own1 - 1, s_both, shorter) + (s_own1 - 1 < shorter).to(tl.int32)
    tl.store(row + 2 * last1 + 1, empty, mask=pair_ok & (n_own1 % 2 == 1))
    tl.store(COUNTS + (b * n_pairs + pairs) * 2, s_both + s_own0 + s_own1, mask=pair_ok)
    tl.store(COUNTS + (b * n_pairs + pairs) * 2 + 1, tl.zeros([ROWS], dtype=tl.int32), mask=pair_ok)


@triton.jit
def _summed_loads(COUNTS, items, counts_batch_stride, head_row, batch):
    """Exact blocks of each item (block id within the head; < 0: none), grid and extra blocks,
    summed over the batch."""
    ok = items >= 0
    load = tl.zeros(items.shape, dtype=tl.int32)
    for b in range(batch):
        at = COUNTS + b * counts_batch_stride + (head_row + items) * 2
        load += tl.load(at, mask=ok, other=0) + tl.load(at + 1, mask=ok, other=0)
    return load


@triton.jit
def _program_cost(COUNTS, PARTNERS, programs, n_programs, counts_batch_stride, head_row, batch):
    ok = programs < n_programs
    first = tl.load(PARTNERS + programs * 2, mask=ok, other=-1).to(tl.int32)
    second = tl.load(PARTNERS + programs * 2 + 1, mask=ok, other=-1).to(tl.int32)
    cost = (_summed_loads(COUNTS, first, counts_batch_stride, head_row, batch)
            + _summed_loads(COUNTS, second, counts_batch_stride, head_row, batch))
    return first, second, cost, ok


@triton.jit
def _heaviest_first_kernel(
    COUNTS, PARTNERS, WORK, n_programs, num_blocks, batch, counts_batch_stride,
    ROWS: tl.constexpr, CHUNK: tl.constexpr, PAIRED: tl.constexpr,
):
    # A stable descending sort of each head's programs by cost, as ranks: a program's place is
    # the number of programs that cost more, or as much and come before it. One launch in
    # place of PyTorch's dozen (sums, gathers, a segmented sort, index arithmetic).
    h = tl.program_id(1)
    head_row = h * num_blocks
    mine = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    first, second, cost, ok = _program_cost(COUNTS, PARTNERS, mine, n_programs, counts_batch_stride, head_row,
                                            batch)
    rank = tl.zeros([ROWS], dtype=tl.int32)
    for j0 in range(0, n_programs, CHUNK):
        other = j0 + tl.arange(0, CHUNK)
        _, _, other_cost, other_ok = _program_cost(COUNTS, PARTNERS, other, n_programs, counts_batch_stride,
                                                   head_row, batch)
        ahead = ((other_cost[None, :] > cost[:, None])
                 | ((other_cost[None, :] == cost[:, None]) & (other[None, :] < mine[:, None])))
        rank += tl.sum((ahead & other_ok[None, :]).to(tl.int32), 1)
    place = h * n_programs + rank
    if PAIRED:
        tl.store(WORK + place * 2, tl.where(first >= 0, first + head_row, -1), mask=ok)
        tl.store(WORK + place * 2 + 1, tl.where(second >= 0, second + head_row, -1), mask=ok)
    else:
        tl.store(WORK + place, first + head_row, mask=ok)


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


def work_by_count(counts: torch.Tensor) -> torch.Tensor:
    """Launch order of a routed mask's 64-row tiles, int32 entries head · N + query block: head
    by head, each head's query blocks heaviest first (summed over the batch): the portable
    loop's order, which runs the longest tiles first (3-7 % faster than block order, NOTES
    #27; the Hopper loop runs ``pair_work``'s). On the device, without a host sync."""
    return _heaviest_first(counts, _single_blocks(counts.shape[2], str(counts.device)), paired=False)


@functools.lru_cache(maxsize=64)
def _single_blocks(num_blocks: int, device_str: str) -> torch.Tensor:
    """(N, 2) partners of ``work_by_count``: every block alone."""
    blocks = torch.arange(num_blocks)
    return torch.stack([blocks, torch.full_like(blocks, -1)], -1).to(device_str)


def _heaviest_first(counts: torch.Tensor, partners: torch.Tensor, *, paired: bool) -> torch.Tensor:
    """int32 (Hg·P·2,) or, unpaired, (Hg·P,): each head's programs (``partners``, (P, 2) query
    blocks, -1 for none) heaviest first by their blocks' counts (B, Hg, N, 2) summed over the
    batch, ties in program order; entries head · N + query block."""
    counts = counts.contiguous()
    B, Hg, n, _ = counts.shape
    P = partners.shape[0]
    work = torch.empty(Hg * P * (2 if paired else 1), device=counts.device, dtype=torch.int32)
    with device_guard(counts):
        _heaviest_first_kernel[(triton.cdiv(P, ORDER_ROWS), Hg)](
            COUNTS=counts, PARTNERS=partners, WORK=work, n_programs=P, num_blocks=n, batch=B,
            counts_batch_stride=counts.stride(0), ROWS=ORDER_ROWS, CHUNK=ORDER_CHUNK, PAIRED=paired,
        )
    return work


@dataclass(frozen=True)
class PairStreams:
    """The key streams of the Hopper loop's Sol programs, two work items each.

    ``work`` int32 (2·P,): program p runs items ``work[2p]`` and ``work[2p + 1]`` (entries
    head · N + query block of the group, -1 for none); ``counts`` int32 (B, P, 2): the ring
    steps of each program's stream, then 0; ``entries`` (B, P, N + 4), int16 below 8192 blocks:
    two per step, the step's halves, each 4 · block + users (1: the first item routed it, 2:
    the second, 3: both; the same in both halves) or -1 for an empty half (``_pair_steps_kernel``
    says in which order). The producer loads every routed block once; each consumer computes
    only the steps of its item."""

    work: torch.Tensor
    counts: torch.Tensor
    entries: torch.Tensor

    @property
    def n_pairs(self) -> int:
        return int(self.counts.shape[1])

    @property
    def batch_stride(self) -> int:
        """Programs between two batch entries of ``counts`` and ``entries`` in memory (``n_pairs``,
        also for the views of ``per_head``)."""
        return int(self.counts.stride(0) // self.counts.stride(1))

    def per_head(self, num_heads: int) -> tuple["PairStreams", ...]:
        """The streams of each of the group's ``num_heads`` heads, as views: ``pair_work`` orders
        the programs head by head, the same number for every head."""
        per = self.n_pairs // num_heads
        if per * num_heads != self.n_pairs:
            raise ValueError(f"PairStreams.per_head: {self.n_pairs} programs do not split into {num_heads} heads")
        return tuple(PairStreams(self.work[2 * per * i:2 * per * (i + 1)], self.counts[:, per * i:per * (i + 1)],
                                 self.entries[:, per * i:per * (i + 1)]) for i in range(num_heads))


@functools.lru_cache(maxsize=64)
def pair_partners(layout: BlockLayout) -> torch.Tensor:
    """int64 (P, 2) on the layout's device: the query blocks that share a stream. A grid block
    goes with its neighbour in the next frame of blocks (frames 2m and 2m + 1; the closest
    query blocks in time pick the most alike keys: NOTES #29), extra blocks go two by two;
    a block left over is alone (second -1). Cached, read-only."""
    gt = layout.block_grid[0]
    frame = layout.n_grid_blocks // gt  # blocks per frame of blocks
    grid = torch.arange(layout.n_grid_blocks).reshape(gt, frame)
    pairs = [torch.stack([grid[0:gt - 1:2], grid[1::2]], -1).reshape(-1, 2)]
    extra = torch.arange(layout.n_grid_blocks, layout.n_blocks)
    pairs.append(torch.stack([extra[0::2][:len(extra) // 2], extra[1::2]], -1))
    alone = [grid[gt - 1]] if gt % 2 else []
    alone += [extra[-1:]] if len(extra) % 2 else []
    for blocks in alone:
        pairs.append(torch.stack([blocks, torch.full_like(blocks, -1)], -1))
    return torch.cat(pairs).to(layout.device)


def pair_work(counts: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """``PairStreams.work`` of a routed mask's ``counts`` (B, Hg, N, 2): head by head, each head's
    pairs heaviest first by their items' blocks (summed over the batch), so a program's SM
    time follows its work (as ``work_by_count``). On the device, without a host sync."""
    return _heaviest_first(counts, pair_partners(layout), paired=True)


def _entry_dtype(n_blocks: int) -> torch.dtype:
    """The dtype of pair-stream entries (4 · block + users): 16 bits while they fit."""
    return torch.int16 if n_blocks < 2**13 else torch.int32


def pair_streams(mask: BlockMask) -> PairStreams:
    """The Hopper loop's pair streams of a routed mask (with its bitmap)."""
    B, Hg, n, _ = mask.counts.shape
    work = pair_work(mask.counts, mask.layout)
    n_pairs = Hg * len(pair_partners(mask.layout))
    dev = mask.counts.device
    counts = torch.empty((B, n_pairs, 2), device=dev, dtype=torch.int32)
    # Three groups may each round up by one half: at most N + 3 entries.
    entries = torch.empty((B, n_pairs, n + 4), device=dev, dtype=_entry_dtype(n))
    with device_guard(mask.counts):
        _pair_steps_kernel[(triton.cdiv(n_pairs, PAIR_ROWS), B)](
            WORK=work, BITS=mask.routed_bits, COUNTS=counts, ENTRIES=entries,
            n_pairs=n_pairs, num_blocks=n, items_per_batch=Hg * n, bits_stride=mask.routed_bits.shape[-1],
            entries_stride=n + 4, ROWS=PAIR_ROWS, CHUNK=ROUTE_CHUNK,
        )
    return PairStreams(work, counts, entries)


@functools.lru_cache(maxsize=64)
def _log2_lengths(layout: BlockLayout) -> torch.Tensor:
    return layout.lengths.float().log2()


def route(q_mean, k_mean, beta, forced, layout: BlockLayout, *, estimator: str, scale: float, keep_diagonal: bool,
          lists: bool = True) -> BlockMask:
    """The block mask (with its bitmap) of a group: ``q_mean``/``k_mean`` (B, Hg, N, D), ``beta``
    float32 (Hg,), ``forced`` bool (N,). The kernel computes τ itself (its reference:
    ``sol_routing.block_thresholds``).
    Without ``lists`` it writes the counts and the bitmap only: the Hopper loop's pair streams
    are made from the bitmap, and the id lists (N² per head, most of a call's scratch) would let
    fewer heads share a launch."""
    B, Hg, n, D = q_mean.shape
    dev = q_mean.device
    counts = torch.empty((B, Hg, n, 2), device=dev, dtype=torch.int32)
    ids = torch.empty((B, Hg, n, n if lists else 0), device=dev, dtype=id_dtype(n))
    bits = torch.empty((B, Hg, n, -(-n // ROUTE_CHUNK)), device=dev, dtype=torch.int64)
    with device_guard(q_mean):
        _route_kernel[(triton.cdiv(n, ROUTE_ROWS), B * Hg)](
            Q_MEAN=q_mean, K_MEAN=k_mean, BETA=beta, FORCED=forced.view(torch.int8),
            COUNTS=counts, IDS=ids, BITS=bits,
            num_blocks=n, n_grid_blocks=layout.n_grid_blocks, group_heads=Hg,
            bits_stride=bits.shape[-1], sm_scale=scale,
            HEAD_DIM=D, ROWS=ROUTE_ROWS, CHUNK=ROUTE_CHUNK, EXACT_ESTIMATOR=estimator == "exact",
            KEEP_DIAGONAL=bool(keep_diagonal), LISTS=lists, DOT_DTYPE=dot_dtype_for(q_mean.dtype),
        )
    work = work_by_count(counts) if lists else torch.empty(0, device=dev, dtype=torch.int32)
    return BlockMask(layout, counts, ids, work, block_m=layout.block_tokens, routed_bits=bits)


def pooled_term(k_mean, v_mean, layout: BlockLayout) -> PooledBlocks:
    return PooledBlocks(k_mean, v_mean, _log2_lengths(layout))


def scratch_bytes_per_head(batch: int, layout: BlockLayout, head_dim: int, itemsize: int, *, lists: bool) -> int:
    """Device memory one head of one call needs besides its output, at its peak: while pooling,
    the float32 means and their rounded copies; while routing and in the loop, the rounded
    means, counts, the bitmap, and the id lists (``lists``: the portable loop) or the Hopper
    loop's pair streams."""
    n = layout.n_blocks
    means = 3 * n * head_dim * itemsize
    pooling = means + 3 * n * head_dim * 4
    streams = 8 * n + (n + 1) // 2 * (n + 4) * _entry_dtype(n).itemsize
    routing = (means + 8 * n + 8 * n * math.ceil(n / ROUTE_CHUNK)
               + (id_dtype(n).itemsize * n * n if lists else streams))
    return batch * max(pooling, routing)

"""Sol-Attn Triton kernel: fused threshold routing, proxy-score reuse and exact blocks.

One persistent program walks work items (batch, head, query block of 64). Per item:
1. Routing + approximation pass over the pooled keys in chunks of 64: the tile
   S̃ = s·Q_i·K̄ᵀ is computed once; its column means are the proxy scores ŝ_i, compared with
   τ_i to pick exact blocks; the unpicked columns enter the online softmax with weight
   exp(S̃)·len_j (denominator) and exp(S̃)·V̂_j (numerator). The picked block indices are
   appended to this program's own small staging row (O(#programs · N) int32 in all, reused
   by every item the program handles; no per-query-block list and no N×N map exist).
2. Exact pass: the shared tile loop visits the picked blocks (a software-pipelined loop over
   the staged indices); a short tail block is visited last through the masked loop.
The same kernel with ``ROUTE=False`` reads a precomputed block list instead of routing and
skips the pooled term: the plain block-sparse baseline the routing overhead is measured
against, and the ablation without correction.
"""
import math

import torch
import triton
import triton.language as tl

from .tile_loop import NEG_BIG, attend_listed_blocks, softmax_update

SOL_BLOCK_M = 64  # Sol's block: 64 query tokens and 64 key tokens
SOL_CHUNK = 64


@triton.jit
def _sol_kernel(
    Q, K, V, O,
    K_POOL, V_POOL, TAU, FORCED, BLOCK_LEN, STAGE, COUNTS,
    LIST_COUNTS, LIST_IDS,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    seq_len, num_heads, num_blocks, num_pairs, total_items, stage_stride, list_stride,
    sm_scale, qk_scale_log2, num_programs,
    HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr,
    TAIL_RAGGED: tl.constexpr, KEEP_DIAGONAL: tl.constexpr,
    ROUTE: tl.constexpr, CORRECTION: tl.constexpr, DOT_DTYPE: tl.constexpr,
):
    # A work item is a pair of 64-token query blocks (a and b) in one 128-row tile: each
    # block keeps its own threshold and exact set; the tile visits their union, and the
    # tile loop masks each block's rows by the entry's code (see tile_loop).
    BLOCK: tl.constexpr = 64
    pid = tl.program_id(0)
    offs_m = tl.arange(0, 2 * BLOCK)
    in_b = offs_m >= BLOCK
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    stage = STAGE + pid * stage_stride
    # Full blocks are listed from the front of the staging row, the ragged tail at its end.
    tail_slot = stage + stage_stride - 1
    last_block = num_blocks - 1
    for item in range(pid, total_items, num_programs):
        pair = item % num_pairs
        bh = item // num_pairs
        h = bh % num_heads
        b = bh // num_heads
        blk_a = 2 * pair
        blk_b = blk_a + 1
        rows = blk_a * BLOCK + offs_m
        row_ok = rows < seq_len
        q_ptrs = Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_qn + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        acc = tl.zeros([2 * BLOCK, HEAD_DIM], dtype=tl.float32)
        l_i = tl.zeros([2 * BLOCK], dtype=tl.float32)
        m_i = tl.full([2 * BLOCK], NEG_BIG, dtype=tl.float32)
        k_base = K + b * stride_kb + h * stride_kh
        v_base = V + b * stride_vb + h * stride_vh
        has_b = blk_b < num_blocks
        if ROUTE:
            # The previous item's exact pass may still read the staging row.
            tl.debug_barrier()
            rows_a = tl.minimum(seq_len - blk_a * BLOCK, BLOCK).to(tl.float32)
            rows_b = tl.maximum(tl.minimum(seq_len - blk_b * BLOCK, BLOCK), 1).to(tl.float32)
            tau_a = tl.load(TAU + bh * num_blocks + blk_a)
            tau_b = tl.load(TAU + bh * num_blocks + blk_b, mask=has_b, other=float("inf"))
            pool_off = bh.to(tl.int64) * num_blocks * HEAD_DIM
            n_full = 0
            n_tail = 0
            n_exact_a = 0
            n_exact_b = 0
            for c0 in range(0, num_blocks, CHUNK):
                cols = c0 + offs_c
                col_ok = cols < num_blocks
                kp = tl.load(K_POOL + pool_off + cols[:, None] * HEAD_DIM + offs_d[None, :],
                             mask=col_ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(kp.to(DOT_DTYPE))) * sm_scale
                sum_all = tl.sum(s, 0)
                sum_a = tl.sum(tl.where(in_b[:, None], 0.0, s), 0)
                forced = (tl.load(FORCED + cols, mask=col_ok, other=0) != 0) & col_ok
                pick_a = ((sum_a / rows_a > tau_a) & col_ok) | forced
                pick_b = (((sum_all - sum_a) / rows_b > tau_b) & col_ok) | (forced & has_b)
                if KEEP_DIAGONAL:
                    pick_a = pick_a | (col_ok & (tl.abs(cols - blk_a) <= 1))
                    pick_b = pick_b | (col_ok & has_b & (tl.abs(cols - blk_b) <= 1))
                n_exact_a += tl.sum(pick_a.to(tl.int32), 0)
                n_exact_b += tl.sum(pick_b.to(tl.int32), 0)
                code = pick_a.to(tl.int32) + 2 * pick_b.to(tl.int32)
                entry = cols * 4 + code
                if TAIL_RAGGED:
                    tail_code = tl.sum(tl.where(cols == last_block, code, 0), 0)
                    n_tail += (tail_code != 0).to(tl.int32)
                    tl.store(tail_slot, last_block * 4 + tail_code, mask=tail_code != 0)
                    listed = (code != 0) & (cols != last_block)
                else:
                    listed = code != 0
                pos = n_full + tl.cumsum(listed.to(tl.int32), 0) - 1
                tl.store(stage + pos, entry, mask=listed)
                n_full += tl.sum(listed.to(tl.int32), 0)
                if CORRECTION:
                    approx = col_ok[None, :] & (tl.where(in_b[:, None], pick_b[None, :], pick_a[None, :]) == 0)
                    s2 = tl.where(approx, s * 1.4426950408889634, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(s2, 1))
                    alpha = tl.math.exp2(m_i - m_new)
                    p = tl.math.exp2(s2 - m_new[:, None])
                    lens = tl.load(BLOCK_LEN + cols, mask=col_ok, other=0.0)
                    l_i = l_i * alpha + tl.sum(p * lens[None, :], 1)
                    vp = tl.load(V_POOL + pool_off + cols[:, None] * HEAD_DIM + offs_d[None, :],
                                 mask=col_ok[:, None], other=0.0)
                    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), vp.to(DOT_DTYPE))
                    m_i = m_new
            # Make the staged entries visible to every thread of the program.
            tl.debug_barrier()
            full_ids = stage
            tail_ids = tail_slot
            tl.store(COUNTS + bh * num_blocks + blk_a, n_exact_a)
            tl.store(COUNTS + bh * num_blocks + blk_b, n_exact_b, mask=has_b)
        else:
            list_row = LIST_IDS + (bh.to(tl.int64) * num_pairs + pair) * list_stride
            n_full = tl.load(LIST_COUNTS + (bh * num_pairs + pair) * 2)
            n_tail = tl.load(LIST_COUNTS + (bh * num_pairs + pair) * 2 + 1)
            full_ids = list_row
            tail_ids = list_row + n_full
        acc, l_i, m_i = attend_listed_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, full_ids, n_full, BLOCK_LEN,
            qk_scale_log2, BLOCK, BLOCK, HEAD_DIM, False, DOT_DTYPE, True)
        if TAIL_RAGGED:
            acc, l_i, m_i = attend_listed_blocks(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, tail_ids, n_tail, BLOCK_LEN,
                qk_scale_log2, BLOCK, BLOCK, HEAD_DIM, True, DOT_DTYPE, True)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        o_ptrs = O + b * stride_ob + h * stride_oh + rows[:, None].to(tl.int64) * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])


def _programs_for(total_items: int, device, per_sm: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(total_items, sms * per_sm))
    return max(1, min(total_items, 4))


def launch_sol_kernel(q, k, v, k_pool, v_pool, tau, forced, block_len, *, scale, keep_diagonal,
                      route=True, correction=True, block_lists=None, num_warps=8, num_stages=3, programs_per_sm=1):
    """Run the Sol kernel; returns (out (B, L, H, D), exact-block counts (B, H, N) int32).

    With ``route=False``, ``block_lists`` from ``block_lists_from_selection`` give the exact
    blocks instead (the counts are then left at zero).
    """
    from ._checks import triton_interpreting

    B, L, H, D = q.shape
    n = block_len.shape[0]
    pairs = -(-n // 2)
    out = torch.empty((B, L, H, D), device=q.device, dtype=q.dtype)
    counts = torch.zeros((B, H, n), device=q.device, dtype=torch.int32)
    total = B * H * pairs
    programs = _programs_for(total, q.device, programs_per_sm)
    stage_stride = n + 1
    stage = torch.empty((programs, stage_stride) if route else (1,), device=q.device, dtype=torch.int32)
    if block_lists is None:
        list_counts = list_ids = counts  # unused when routing
        list_stride = 0
    else:
        list_counts, list_ids = block_lists
        list_stride = list_ids.shape[-1]
    upcast = triton_interpreting() and q.dtype == torch.bfloat16
    dot_dtype = tl.float32 if upcast else (tl.float16 if q.dtype == torch.float16 else tl.bfloat16)
    _sol_kernel[(programs,)](
        q, k, v, out, k_pool, v_pool, tau, forced, block_len, stage, counts,
        list_counts, list_ids,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        L, H, n, pairs, total, stage_stride, list_stride,
        scale, scale * math.log2(math.e), programs,
        HEAD_DIM=D, CHUNK=SOL_CHUNK,
        TAIL_RAGGED=(L % SOL_BLOCK_M) != 0, KEEP_DIAGONAL=bool(keep_diagonal),
        ROUTE=route, CORRECTION=correction, DOT_DTYPE=dot_dtype,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, counts


def block_lists_from_selection(selection: torch.Tensor, seq_len: int):
    """Per-tile block lists for ``route=False`` from a bool (B, H, N, N) block mask.

    Returns (counts int32 (B, H, P, 2) = [full entries, tail entries], entries int32
    (B, H, P, W)) for the P = ceil(N/2) tiles of two query blocks: ascending entries
    ``block * 4 + code`` of the union of both blocks' picks, then the ragged tail if picked.
    Used by the precomputed-mask baseline and by studies; the fused kernel builds none.
    """
    B, H, N, _ = selection.shape
    if N % 2:
        selection = torch.cat([selection, torch.zeros_like(selection[:, :, :1])], dim=2)
    code = selection[:, :, 0::2].to(torch.int32) + 2 * selection[:, :, 1::2].to(torch.int32)
    entries = torch.arange(N, device=selection.device, dtype=torch.int32) * 4 + code
    picked = code != 0
    tail = torch.zeros_like(code[..., 0])
    if seq_len % SOL_BLOCK_M:
        tail = picked[..., N - 1].to(torch.int32)
        picked = picked.clone()
        picked[..., N - 1] = False
    n_full = picked.sum(-1, dtype=torch.int32)
    width = max(1, int((n_full + tail).max()))
    # A stable sort brings the picked blocks to the front in ascending order.
    order = torch.argsort((~picked).to(torch.int8), dim=-1, stable=True)[..., :width]
    ids = torch.gather(entries, -1, order)
    at_tail = (torch.arange(width, device=selection.device) == n_full[..., None]) & (tail[..., None] == 1)
    ids = torch.where(at_tail, entries[..., N - 1 : N].expand_as(ids), ids)
    return torch.stack([n_full, tail], dim=-1).contiguous(), ids.contiguous()

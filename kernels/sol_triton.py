"""Sol-Attn Triton kernel: fused threshold routing, proxy-score reuse and exact blocks.

One persistent program walks work items (batch, head, query block of 64). Per item:
1. Routing + approximation pass over the pooled keys in chunks of 64: the tile
   S̃ = s·Q_i·K̄ᵀ is computed once; its column means are the proxy scores ŝ_i, compared with
   τ_i to pick exact blocks (``not ŝ <= τ``: a NaN proxy or τ picks the block, so a query
   block with NaN routing is plain dense attention, see ``sol_routing``); the unpicked
   columns enter the online softmax with weight exp(S̃)·len_j (denominator) and
   exp(S̃)·len_j·V̄_j (numerator; V̄_j the block's mean value, which unlike the sum V̂_j
   cannot overflow fp16). The picked block indices are
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

from .tile_loop import (
    NEG_BIG,
    attend_full_blocks,
    attend_listed_blocks,
    dot_dtype_for,
    grid_descriptors,
    head_offset,
    row_offset_dtype,
    softmax_update,
)

SOL_BLOCK_M = 64
SOL_CHUNK = 64


@triton.jit
def _sol_kernel(
    Q, K, V, O, K_DESC, V_DESC,
    K_POOL, V_POOL, TAU, FORCED, BLOCK_LEN, STAGE, COUNTS,
    LIST_COUNTS, LIST_IDS,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    seq_len, num_heads, num_blocks, total_items, stage_stride, list_stride,
    sm_scale, qk_scale_log2, num_programs,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
    TAIL_RAGGED: tl.constexpr, KEEP_DIAGONAL: tl.constexpr,
    ROUTE: tl.constexpr, CORRECTION: tl.constexpr, DOT_DTYPE: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
    TMA: tl.constexpr, K_HEADS_IN_COLUMNS: tl.constexpr, V_HEADS_IN_COLUMNS: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    stage = STAGE + pid * stage_stride
    # Full blocks are listed from the front of the staging row, the ragged tail at its end.
    tail_slot = stage + stage_stride - 1
    last_block = num_blocks - 1
    for item in range(pid, total_items, num_programs):
        qblk = item % num_blocks
        bh = item // num_blocks
        h = bh % num_heads
        b = bh // num_heads
        rows = qblk * BLOCK_M + offs_m
        row_ok = rows < seq_len
        q_ptrs = Q + head_offset(b, h, stride_qb, stride_qh) + rows[:, None].to(OFFSET_DTYPE) * stride_qn + offs_d[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        k_base = K + head_offset(b, h, stride_kb, stride_kh)
        v_base = V + head_offset(b, h, stride_vb, stride_vh)
        if ROUTE:
            # The previous item's exact pass may still read the staging row.
            tl.debug_barrier()
            n_valid_rows = tl.minimum(seq_len - qblk * BLOCK_M, BLOCK_M).to(tl.float32)
            tau = tl.load(TAU + bh * num_blocks + qblk)
            pool_off = bh.to(tl.int64) * num_blocks * HEAD_DIM
            n_full = 0
            n_tail = 0
            for c0 in range(0, num_blocks, CHUNK):
                cols = c0 + offs_c
                col_ok = cols < num_blocks
                kp = tl.load(K_POOL + pool_off + cols[:, None] * HEAD_DIM + offs_d[None, :],
                             mask=col_ok[:, None], other=0.0)
                s = tl.dot(q, tl.trans(kp.to(DOT_DTYPE))) * sm_scale
                proxy = tl.sum(s, 0) / n_valid_rows
                picked = (proxy <= tau) == 0
                picked = picked | (tl.load(FORCED + cols, mask=col_ok, other=0) != 0)
                if KEEP_DIAGONAL:
                    picked = picked | (tl.abs(cols - qblk) <= 1)
                picked = picked & col_ok
                if TAIL_RAGGED:
                    is_tail = cols == last_block
                    n_tail += tl.sum((picked & is_tail).to(tl.int32), 0)
                    listed = picked & (cols != last_block)
                else:
                    listed = picked
                pos = n_full + tl.cumsum(listed.to(tl.int32), 0) - 1
                tl.store(stage + pos, cols, mask=listed)
                n_full += tl.sum(listed.to(tl.int32), 0)
                if CORRECTION:
                    # Every unpicked block is one column standing for its len_j keys.
                    approx = col_ok & (picked == 0)
                    s2 = tl.where(approx[None, :], s * 1.4426950408889634, float("-inf"))
                    lens = tl.load(BLOCK_LEN + cols, mask=col_ok, other=0.0)
                    vp = tl.load(V_POOL + pool_off + cols[:, None] * HEAD_DIM + offs_d[None, :],
                                 mask=col_ok[:, None], other=0.0)
                    acc, l_i, m_i = softmax_update(acc, l_i, m_i, s2, vp, DOT_DTYPE, lens, True)
            if TAIL_RAGGED:
                tl.store(tail_slot, last_block)
            # Make the staged indices visible to every thread of the program.
            tl.debug_barrier()
            full_ids = stage
            tail_ids = tail_slot
        else:
            list_row = LIST_IDS + (bh.to(tl.int64) * num_blocks + qblk) * list_stride
            n_full = tl.load(LIST_COUNTS + (bh * num_blocks + qblk) * 2)
            n_tail = tl.load(LIST_COUNTS + (bh * num_blocks + qblk) * 2 + 1)
            full_ids = list_row
            tail_ids = list_row + n_full
        # Sol's key blocks are the tiles (64, 1, 1) of the token "grid" (L, 1, 1).
        acc, l_i, m_i = attend_full_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, full_ids, n_full, BLOCK_LEN, BLOCK_LEN,
            K_DESC, V_DESC, b, h, num_heads, 1, 1, qk_scale_log2,
            BLOCK_M, BLOCK_M, HEAD_DIM, DOT_DTYPE, False, OFFSET_DTYPE, TMA,
            K_HEADS_IN_COLUMNS, V_HEADS_IN_COLUMNS,
            BLOCK_M, 1, 1, BLOCK_M)
        if TAIL_RAGGED:
            acc, l_i, m_i = attend_listed_blocks(
                acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, tail_ids, n_tail, BLOCK_LEN, BLOCK_LEN,
                qk_scale_log2, BLOCK_M, BLOCK_M, HEAD_DIM, True, DOT_DTYPE, False, OFFSET_DTYPE)
        tl.store(COUNTS + item, n_full + n_tail)
        # Only a row without any term (l = 0) is set to 0 / 1; a NaN stays NaN.
        l_safe = tl.where(l_i == 0, 1.0, l_i)
        out = acc / l_safe[:, None]
        o_ptrs = O + head_offset(b, h, stride_ob, stride_oh) + rows[:, None].to(OFFSET_DTYPE) * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None])


def _programs_for(total_items: int, device, per_sm: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(total_items, sms * per_sm))
    return max(1, min(total_items, 4))


def launch_sol_kernel(q, k, v, k_pool, v_pool, tau, forced, block_len, *, scale, keep_diagonal,
                      route=True, correction=True, block_lists=None, num_warps=4, num_stages=3, programs_per_sm=2,
                      tma=True, chunk=SOL_CHUNK):
    """Run the Sol kernel; returns (out (B, L, H, D), exact-block counts (B, H, N) int32).

    ``chunk``: pooled keys per step of the routing pass (a power of two >= 16).
    With ``route=False``, ``block_lists`` = (counts int32 (B, H, N, 2) [full, tail],
    ids int32 (B, H, N, W)) gives the exact blocks of each query block instead.
    ``tma`` fetches full key blocks with TMA descriptors where the layout allows it.
    """
    B, L, H, D = q.shape
    n = block_len.shape[0]
    out = torch.empty((B, L, H, D), device=q.device, dtype=q.dtype)
    counts = torch.empty((B, H, n), device=q.device, dtype=torch.int32)
    total = B * H * n
    programs = _programs_for(total, q.device, programs_per_sm)
    stage_stride = n + 1
    stage = torch.empty((programs, stage_stride) if route else (1,), device=q.device, dtype=torch.int32)
    if block_lists is None:
        list_counts = list_ids = counts  # unused when routing
        list_stride = 0
    else:
        list_counts, list_ids = block_lists
        list_stride = list_ids.shape[-1]
    descs = grid_descriptors((k, v), (L, 1, 1), (SOL_BLOCK_M, 1, 1)) if tma else None
    k_desc, v_desc = descs[0] if descs else (k, v)
    _sol_kernel[(programs,)](
        q, k, v, out, k_desc, v_desc, k_pool, v_pool, tau, forced, block_len, stage, counts,
        list_counts, list_ids,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        L, H, n, total, stage_stride, list_stride,
        scale, scale * math.log2(math.e), programs,
        HEAD_DIM=D, BLOCK_M=SOL_BLOCK_M, CHUNK=chunk,
        TAIL_RAGGED=(L % SOL_BLOCK_M) != 0, KEEP_DIAGONAL=bool(keep_diagonal),
        ROUTE=route, CORRECTION=correction, DOT_DTYPE=dot_dtype_for(q.dtype),
        OFFSET_DTYPE=row_offset_dtype(L + SOL_BLOCK_M, q, k, v, out),
        TMA=descs is not None, K_HEADS_IN_COLUMNS=bool(descs and descs[1][0]),
        V_HEADS_IN_COLUMNS=bool(descs and descs[1][1]),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, counts


def block_lists_from_selection(selection: torch.Tensor, seq_len: int):
    """Compact per-query-block lists for ``route=False`` from a bool (B, H, N, N) block mask.

    Returns (counts int32 (B, H, N, 2) = [full blocks, ragged tail], ids int32 (B, H, N, W)):
    ascending full-block ids first, then the tail block if picked. Used by the benchmark's
    precomputed-mask baseline and by studies; the fused kernel never builds these.
    """
    B, H, N, _ = selection.shape
    picked = selection.clone()
    tail = torch.zeros(B, H, N, dtype=torch.int32, device=selection.device)
    if seq_len % SOL_BLOCK_M:
        tail = selection[..., N - 1].to(torch.int32)
        picked[..., N - 1] = False
    n_full = picked.sum(-1, dtype=torch.int32)
    width = max(1, int((n_full + tail).max()))
    # A stable sort brings the picked blocks to the front in ascending order.
    ids = torch.argsort((~picked).to(torch.int8), dim=-1, stable=True)[..., :width].to(torch.int32)
    at_tail = (torch.arange(width, device=selection.device) == n_full[..., None]) & (tail[..., None] == 1)
    ids = torch.where(at_tail, torch.full_like(ids, N - 1), ids)
    return torch.stack([n_full, tail], dim=-1).contiguous(), ids.contiguous()

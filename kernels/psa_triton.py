"""PSA Triton kernel: one kernel for every stripe mask, at dense speed per visited block.

The kernel works in PSABlock-major order (``layout.TileLayout`` with 3D padding): grid
blocks of ``BLOCK_TOKENS`` slots whose real tokens come first, then the extra (text) tokens
cut into blocks of the same size. It reads q/k/v and writes the output in their own (B, L,
H, D) order through a slot → token map, so no permuted or padded copy is ever made. A program owns one query tile (up to 128 rows of one
block) and walks that block's key list with the shared tile loop: full blocks unmasked,
short blocks (padding, the last text block) masked. The lists come from a schedule computed
once per (grid, tile, params, extra tokens) and cached; the programs run heaviest first, so
heads of very different density do not leave a tail of idle multiprocessors.
"""
import functools
import math

import torch
import triton
import triton.language as tl

from .tile_loop import NEG_BIG, attend_listed_blocks, dot_dtype_for, row_offset_dtype

PSA_BLOCK_N = 128  # measured best on the H200 (benchmarks/NOTES.md)


@triton.jit
def _psa_kernel(
    Q, K, V, O, WORK, LIST_COUNTS, LIST_IDS, BLOCK_LEN, ROW_MAP,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    num_heads, num_blocks, tiles_per_block, list_stride, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, GATHER: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
):
    # WORK lists (head, query block) pairs heaviest first; axis 1 is the tile, axis 2 the batch.
    hq = tl.load(WORK + tl.program_id(0))
    q_tile = tl.program_id(1)
    b = tl.program_id(2)
    h = hq // num_blocks
    qblk = hq % num_blocks
    if q_tile < tiles_per_block:
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        local = q_tile * BLOCK_M + offs_m
        row_ok = local < tl.load(BLOCK_LEN + qblk)
        rows = (qblk * BLOCK_TOKENS + local).to(OFFSET_DTYPE)
        if GATHER:
            rows = tl.load(ROW_MAP + rows, mask=row_ok, other=0).to(OFFSET_DTYPE)
        q = tl.load(Q + b.to(tl.int64) * stride_qb + h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
        k_base = K + b.to(tl.int64) * stride_kb + h * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h * stride_vh
        ids = LIST_IDS + hq.to(tl.int64) * list_stride
        n_full = tl.load(LIST_COUNTS + hq * 2)
        n_short = tl.load(LIST_COUNTS + hq * 2 + 1)
        acc, l_i, m_i = attend_listed_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, ids, n_full, BLOCK_LEN, ROW_MAP,
            qk_scale_log2, BLOCK_TOKENS, BLOCK_N, HEAD_DIM, False, DOT_DTYPE, GATHER, OFFSET_DTYPE)
        acc, l_i, m_i = attend_listed_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, ids + n_full, n_short, BLOCK_LEN, ROW_MAP,
            qk_scale_log2, BLOCK_TOKENS, BLOCK_N, HEAD_DIM, True, DOT_DTYPE, GATHER, OFFSET_DTYPE)
        out = acc / l_i[:, None]
        tl.store(O + b.to(tl.int64) * stride_ob + h * stride_oh + rows[:, None] * stride_on + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None])


@functools.lru_cache(maxsize=32)
def _cached_kernel_schedule(grid, tile, params_bytes, num_heads, extra_tokens, block_n, device_str):
    from .layout import tile_layout
    from .psa_mask import psa_block_mask

    params = torch.frombuffer(bytearray(params_bytes), dtype=torch.int64).reshape(num_heads, 6)
    layout = tile_layout(grid, tile, pad=True)
    block_tokens = layout.block_tokens
    nb = layout.n_blocks
    extra_blocks = -(-extra_tokens // block_tokens)
    total = nb + extra_blocks
    keep = torch.ones(num_heads, total, total, dtype=torch.bool)
    keep[:, :nb, :nb] = psa_block_mask(grid, params, tile)
    lengths = torch.cat([layout.block_lengths.cpu().to(torch.int32),
                         torch.full((extra_blocks,), block_tokens, dtype=torch.int32)])
    if extra_blocks:
        lengths[-1] = extra_tokens - (extra_blocks - 1) * block_tokens
    # A block runs unmasked only when it is full and cut into whole BLOCK_N sub-tiles.
    is_full = (lengths == block_tokens) & (block_tokens % block_n == 0)
    full_pick = keep & is_full
    short_pick = keep & ~is_full
    n_full = full_pick.sum(-1)
    n_short = short_pick.sum(-1)
    width = int((n_full + n_short).max())
    # Full blocks first, then short ones, each ascending: sort on (class, index).
    key = torch.where(full_pick, 0, torch.where(short_pick, 1, 2)) * total + torch.arange(total)
    ids = torch.sort(key, dim=-1).values[..., :width] % total
    counts = torch.stack([n_full, n_short], dim=-1).to(torch.int32)
    work = torch.argsort((n_full + n_short).reshape(-1), descending=True, stable=True)
    # Slot -> token of the caller's sequence; padding slots point at token 0 and are never
    # read unmasked (they lie past their block's length).
    n_grid = layout.n_tokens
    row_map = torch.cat([layout.perm.cpu().clamp_min(0),
                         n_grid + torch.arange(extra_blocks * block_tokens)])
    dev = torch.device(device_str)
    return tuple(t.to(torch.int32).to(dev).contiguous() for t in (counts, ids, lengths, work, row_map))


def psa_kernel_schedule(grid, params, tile, extra_tokens: int, device, block_n: int = PSA_BLOCK_N):
    """Per-(head, query block) key lists over grid blocks and extra-token blocks, cached.

    Returns (counts int32 (H, NB, 2) [full, short], ids int32 (H, NB, W), block lengths
    int32 (NB,), work order int32 (H·NB,) heaviest first, slot → token map int32),
    NB = grid blocks + extra blocks.
    Extra (text) blocks are attended by every query block and attend to every block.
    ``params`` must already be validated (int64 (H, 6)).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    p = params.cpu().to(torch.int64).contiguous()
    return _cached_kernel_schedule(tuple(grid), tuple(tile), p.numpy().tobytes(), p.shape[0],
                                   int(extra_tokens), block_n, str(dev))


def launch_psa_kernel(qb, kb, vb, schedule, block_tokens, *, scale, block_m=128, block_n=PSA_BLOCK_N,
                      num_warps=8, num_stages=3, gather=True):
    """Run the PSA kernel on q/k/v (B, L, H, D) in sequence order; returns (B, L, H, D).

    ``gather=False`` takes q/k/v already in blocked order (a benchmark of the slot map's cost).
    """
    counts, ids, lengths, work, row_map = schedule
    B, S, H, D = qb.shape
    nb = lengths.shape[0]
    block_m = min(block_m, max(16, triton.next_power_of_2(block_tokens)))
    tiles = -(-block_tokens // block_m)
    out = torch.empty((B, S, H, D), device=qb.device, dtype=qb.dtype)
    _psa_kernel[(H * nb, tiles, B)](
        qb, kb, vb, out, work, counts, ids, lengths, row_map,
        qb.stride(0), qb.stride(1), qb.stride(2),
        kb.stride(0), kb.stride(1), kb.stride(2),
        vb.stride(0), vb.stride(1), vb.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        H, nb, tiles, ids.shape[-1], scale * math.log2(math.e),
        HEAD_DIM=D, BLOCK_TOKENS=block_tokens, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype_for(qb.dtype), GATHER=gather,
        OFFSET_DTYPE=row_offset_dtype(max(S, nb * block_tokens), qb, kb, vb, out), num_warps=num_warps, num_stages=num_stages,
    )
    return out

"""PSA Triton kernel: one kernel for every stripe mask, at dense speed per visited block.

The kernel works in PSABlock-major order (``layout.TileLayout`` with 3D padding): grid
blocks of ``BLOCK_TOKENS`` slots whose real tokens come first, then the extra (text) tokens
cut into blocks of the same size. It reads q/k/v and writes the output in their own (B, L,
H, D) order through a slot → token map, so no permuted or padded copy is ever made. A
program owns one query tile (up to 128 rows of one block) and walks that block's key list
with the shared tile loop: full blocks unmasked, grid tiles cut by the 3D padding through
the same TMA boxes with the outside rows masked, other short blocks (the last text block;
all short blocks without TMA) through the masked pointer loop. The lists come from a schedule
computed once per (grid, tile, params, extra tokens) and cached.

Work order (``WORK``, one entry per program: (head, query block, query tile) flattened) decides
what shares the L2 cache. The query tiles of one block visit the same key list, so they are
always adjacent. ``order="heaviest"`` runs (head, block) pairs heaviest first, so heads of very
different density leave no tail of idle multiprocessors; ``order="head"`` keeps each head's
blocks together in grid order (neighbouring query blocks read overlapping keys), heads
heaviest first. "head" is the default: 3.6 % faster at density 0.15 and 4.5 % at 0.40 on
Wan 720p (``benchmarks/results/kernels_h200_order.json``); heads of very different density
still finish together because the lightest head runs last.
"""
import functools
import math

import torch
import triton
import triton.language as tl

from .tile_loop import (
    NEG_BIG,
    attend_full_blocks,
    attend_grid_blocks_tma,
    attend_listed_blocks,
    dot_dtype_for,
    grid_descriptors,
    head_offset,
    row_offset_dtype,
    tma_box_origin,
)

PSA_BLOCK_N = 128  # measured best on the H200 (benchmarks/NOTES.md)


@triton.jit
def _psa_kernel(
    Q, K, V, O, K_DESC, V_DESC, WORK, LIST_COUNTS, LIST_IDS, BLOCK_LEN, ROW_MAP,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    num_heads, num_blocks, tiles_per_block, list_stride, qk_scale_log2, grid_hw, grid_w,
    tokens_t, tokens_h, tokens_w,
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, GATHER: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
    TMA: tl.constexpr, K_HEADS_IN_COLUMNS: tl.constexpr, V_HEADS_IN_COLUMNS: tl.constexpr,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, SUB_T: tl.constexpr,
):
    # WORK lists (head, query block, query tile) in launch order; axis 1 is the batch.
    work = tl.load(WORK + tl.program_id(0))
    hq = work // tiles_per_block
    q_tile = work % tiles_per_block
    b = tl.program_id(1)
    h = hq // num_blocks
    qblk = hq % num_blocks
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    local = q_tile * BLOCK_M + offs_m
    row_ok = local < tl.load(BLOCK_LEN + qblk)
    rows = (qblk * BLOCK_TOKENS + local).to(OFFSET_DTYPE)
    if GATHER:
        rows = tl.load(ROW_MAP + rows, mask=row_ok, other=0).to(OFFSET_DTYPE)
    q = tl.load(Q + head_offset(b, h, stride_qb, stride_qh) + rows[:, None] * stride_qn + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    k_base = K + head_offset(b, h, stride_kb, stride_kh)
    v_base = V + head_offset(b, h, stride_vb, stride_vh)
    ids = LIST_IDS + hq.to(tl.int64) * list_stride
    n_full = tl.load(LIST_COUNTS + hq * 3)
    n_padded = tl.load(LIST_COUNTS + hq * 3 + 1)
    n_other = tl.load(LIST_COUNTS + hq * 3 + 2)
    # With TMA, full blocks are whole grid tiles fetched as 3D boxes in the caller's order.
    acc, l_i, m_i = attend_full_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, ids, n_full, BLOCK_LEN, ROW_MAP,
        K_DESC, V_DESC, b, h, num_heads, grid_hw, grid_w, qk_scale_log2,
        BLOCK_TOKENS, BLOCK_N, HEAD_DIM, DOT_DTYPE, GATHER, OFFSET_DTYPE, TMA,
        K_HEADS_IN_COLUMNS, V_HEADS_IN_COLUMNS,
        TILE_T, TILE_H, TILE_W, SUB_T)
    if TMA:
        # Grid tiles cut by the 3D padding: the same boxes, the outside rows masked.
        k_b, k_col = tma_box_origin(b, h, num_heads, HEAD_DIM, K_HEADS_IN_COLUMNS)
        v_b, v_col = tma_box_origin(b, h, num_heads, HEAD_DIM, V_HEADS_IN_COLUMNS)
        acc, l_i, m_i = attend_grid_blocks_tma(
            acc, l_i, m_i, q, K_DESC, V_DESC, k_b, k_col, v_b, v_col,
            ids + n_full, n_padded, grid_hw, grid_w, tokens_t, tokens_h, tokens_w,
            qk_scale_log2, TILE_T, TILE_H, TILE_W, SUB_T, HEAD_DIM, DOT_DTYPE, True)
        short_ids = ids + n_full + n_padded
        n_short = n_other
    else:
        short_ids = ids + n_full
        n_short = n_padded + n_other
    acc, l_i, m_i = attend_listed_blocks(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, short_ids, n_short, BLOCK_LEN, ROW_MAP,
        qk_scale_log2, BLOCK_TOKENS, BLOCK_N, HEAD_DIM, True, DOT_DTYPE, GATHER, OFFSET_DTYPE)
    out = acc / l_i[:, None]
    tl.store(O + head_offset(b, h, stride_ob, stride_oh) + rows[:, None] * stride_on + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


# One entry per distinct (grid, per-layer params): a preset gives every layer its own masks,
# so the cache must hold all layers of the deepest model (HunyuanVideo: 60 blocks). With 32
# entries the 40 Wan / 60 HunyuanVideo layers evicted each other and every call rebuilt its
# schedule on the CPU (8 / 38 ms per call in benchmarks/results/e2e_comfyui_h200_*.json).
SCHEDULE_CACHE_LAYERS = 128


@functools.lru_cache(maxsize=SCHEDULE_CACHE_LAYERS)
def _cached_kernel_schedule(grid, tile, params_bytes, num_heads, extra_tokens, block_m, block_n, grid_only_full,
                            order, device_str):
    from .layout import tile_layout
    from .psa_mask import check_mask_size, psa_block_mask

    params = torch.frombuffer(bytearray(params_bytes), dtype=torch.int64).reshape(num_heads, 6)
    layout = tile_layout(grid, tile, pad=True)
    block_tokens = layout.block_tokens
    nb = layout.n_blocks
    extra_blocks = -(-extra_tokens // block_tokens)
    total = nb + extra_blocks
    check_mask_size((total,), num_heads, "PSA kernel schedule")
    keep = torch.ones(num_heads, total, total, dtype=torch.bool)
    keep[:, :nb, :nb] = psa_block_mask(grid, params, tile)
    lengths = torch.cat([layout.block_lengths.cpu().to(torch.int32),
                         torch.full((extra_blocks,), block_tokens, dtype=torch.int32)])
    if extra_blocks:
        lengths[-1] = extra_tokens - (extra_blocks - 1) * block_tokens
    # Three classes of key block, each run by its own loop: full blocks cut into whole
    # BLOCK_N sub-tiles (unmasked; for the TMA loop only tiles of the grid), grid tiles cut
    # by the 3D padding (masked TMA boxes, or the masked pointer loop), the rest (masked
    # pointer loop: text tokens, and without TMA every short block).
    in_grid = torch.arange(total) < nb
    # The TMA loop reads whole tiles in boxes (``tma_sub_frames``), the pointer loop BLOCK_N rows.
    is_full = (lengths == block_tokens) & (in_grid if grid_only_full else block_tokens % block_n == 0)
    block_class = torch.where(is_full, 0, torch.where(in_grid, 1, 2))
    per_class = [(keep & (block_class == c)).sum(-1) for c in range(3)]
    visits = sum(per_class)
    width = int(visits.max())
    # Class by class, each ascending: sort on (class, index); unvisited blocks sort last.
    # One head at a time: the sort key is 8 bytes per block pair.
    ids = torch.stack([torch.sort(torch.where(k, block_class, 3) * total + torch.arange(total), dim=-1)
                       .values[..., :width] % total for k in keep])
    counts = torch.stack(per_class, dim=-1).to(torch.int32)
    work = _work_order(visits, lengths, block_m, -(-block_tokens // block_m), order)
    # Slot -> token of the caller's sequence; padding slots point at token 0 and are never
    # read unmasked (they lie past their block's length).
    n_grid = layout.n_tokens
    row_map = torch.cat([layout.perm.cpu().clamp_min(0),
                         n_grid + torch.arange(extra_blocks * block_tokens)])
    dev = torch.device(device_str)
    # Block ids fit in 16 bits on any real grid: half the memory of 128 cached schedules.
    ids = ids.to(torch.int16 if total < 2**15 else torch.int32)
    counts, lengths, work, row_map = (t.to(torch.int32).to(dev).contiguous() for t in (counts, lengths, work, row_map))
    return counts, ids.to(dev).contiguous(), lengths, work, row_map


def _work_order(visits, lengths, block_m, tiles, order):
    """Launch order of (head, query block, query tile) = (hq · tiles + tile) entries.

    ``visits`` (H, NB) key blocks per (head, query block). Tiles past a block's real rows
    (3D padding) get no program at all; the tiles of one block stay adjacent.
    """
    H, nb = visits.shape
    if order == "heaviest":
        pairs = torch.argsort(visits.reshape(-1), descending=True, stable=True)
    elif order == "head":
        heads = torch.argsort(visits.sum(-1), descending=True, stable=True)
        pairs = (heads[:, None] * nb + torch.arange(nb)).reshape(-1)
    else:
        raise ValueError(f"order must be 'heaviest' or 'head', got {order!r}")
    entries = pairs[:, None] * tiles + torch.arange(tiles)
    live = torch.arange(tiles)[None, :] * block_m < lengths.long()[pairs % nb][:, None]
    return entries[live]


def psa_kernel_schedule(grid, params, tile, extra_tokens: int, device, block_m: int = 128,
                        block_n: int = PSA_BLOCK_N, grid_only_full: bool = False, order: str = "head"):
    """Per-(head, query block) key lists over grid blocks and extra-token blocks, cached.

    Returns (counts int32 (H, NB, 3) [full, padded grid tiles, other short], ids
    int16/int32 (H, NB, W) in that order, block lengths int32 (NB,), work int32 (programs,) =
    (head·NB + query block)·tiles + tile in launch order (see ``_work_order``), slot → token
    map int32), NB = grid blocks + extra blocks.
    Extra (text) blocks are attended by every query block and attend to every block.
    ``params`` must already be validated (int64 (H, 6)).
    """
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    p = params.cpu().to(torch.int64).contiguous()
    return _cached_kernel_schedule(tuple(grid), tuple(tile), p.numpy().tobytes(), p.shape[0],
                                   int(extra_tokens), int(block_m), int(block_n), bool(grid_only_full), order,
                                   str(dev))


def tma_sub_frames(tile, max_rows: int = 128):
    """Frames per TMA box for a tile (bt, bh, bw): the most frames f dividing bt such that
    f·bh·bw is a power of two in [16, max_rows] (a dot operand), or None."""
    bt, bh, bw = tile
    for frames in range(bt, 0, -1):
        rows = frames * bh * bw
        if bt % frames == 0 and 16 <= rows <= max_rows and rows & (rows - 1) == 0:
            return frames
    return None


def launch_psa_kernel(q, k, v, grid, params, tile, extra_tokens, *, scale, block_m=128, block_n=PSA_BLOCK_N,
                      num_warps=8, num_stages=3, gather=True, tma=True, order="head"):
    """Run the PSA kernel on q/k/v (B, L, H, D) in sequence order; returns (B, L, H, D).

    ``order``: the programs' work order (module docstring).
    ``tma`` fetches whole grid tiles with TMA boxes where the layout and tile allow it;
    ``gather=False`` takes q/k/v already in blocked order (a benchmark of the slot map's cost).
    """
    sub_frames = tma_sub_frames(tile) if (tma and gather) else None
    descs = grid_descriptors((k, v), grid, (sub_frames, tile[1], tile[2])) if sub_frames else None
    block_tokens = tile[0] * tile[1] * tile[2]
    block_m = min(block_m, max(16, triton.next_power_of_2(block_tokens)))
    counts, ids, lengths, work, row_map = psa_kernel_schedule(
        grid, params, tile, extra_tokens, q.device, block_m=block_m, block_n=block_n,
        grid_only_full=descs is not None, order=order)
    n_w = -(-grid[2] // tile[2])
    n_hw = -(-grid[1] // tile[1]) * n_w
    k_desc, v_desc = descs[0] if descs else (k, v)
    B, S, H, D = q.shape
    nb = lengths.shape[0]
    tiles = -(-block_tokens // block_m)
    out = torch.empty((B, S, H, D), device=q.device, dtype=q.dtype)
    _psa_kernel[(work.shape[0], B)](
        q, k, v, out, k_desc, v_desc, work, counts, ids, lengths, row_map,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        H, nb, tiles, ids.shape[-1], scale * math.log2(math.e), n_hw, n_w, *grid,
        HEAD_DIM=D, BLOCK_TOKENS=block_tokens, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_DTYPE=dot_dtype_for(q.dtype), GATHER=gather,
        OFFSET_DTYPE=row_offset_dtype(max(S, nb * block_tokens), q, k, v, out),
        TMA=descs is not None, K_HEADS_IN_COLUMNS=bool(descs and descs[1][0]),
        V_HEADS_IN_COLUMNS=bool(descs and descs[1][1]),
        TILE_T=tile[0], TILE_H=tile[1], TILE_W=tile[2], SUB_T=sub_frames or 1,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out

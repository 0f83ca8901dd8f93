"""The one online-softmax tile loop that Sol-Attn and PSA share.

Both methods reduce to: a resident query tile visits a list of key blocks. A key block is
``BLOCK_TOKENS`` consecutive rows of K/V (64 for Sol, one PSABlock for PSA) whose first
``len`` rows are real; it is walked in sub-tiles of ``BLOCK_N`` rows. Lists of blocks known to
be full run the unmasked specialisation (no mask arithmetic in the hot loop); short blocks
(ragged tail, 3D padding, text tokens) run the masked one. On Hopper, key blocks that are
tiles of a token grid are fetched as TMA boxes instead (``attend_grid_blocks_tma``); tiles cut
by the grid's padding are masked there from the box coordinates.

Online-softmax state: running max ``m_i`` (log2 domain), running sum ``l_i``, accumulator
``acc``. ``m_i`` starts at a large finite negative number rather than -inf, so a tile whose
entries are all masked leaves the state unchanged instead of producing NaN.
"""
import torch
import triton
import triton.language as tl


def dot_dtype_for(dtype: torch.dtype):
    """Operand dtype of the tile loop's dots. Triton's CPU interpreter computes bf16 dots
    wrongly, so interpreted bf16 runs in float32 (CUDA always uses the input dtype)."""
    from ._checks import triton_interpreting

    if dtype == torch.float16:
        return tl.float16
    return tl.float32 if triton_interpreting() else tl.bfloat16


# Finite stand-in for -inf in the running max; see the module docstring.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def softmax_update(acc, l_i, m_i, s, v, P_DTYPE: tl.constexpr, col_weight=None, WEIGHTED: tl.constexpr = False):
    """Fold scores ``s`` (log2 domain, BLOCK_M × n) with values ``v`` (n × D) into the state.

    WEIGHTED: column j stands for ``col_weight[j]`` keys sharing one score and one value
    (Sol's pooled blocks: weight = block length, ``v`` = the block's mean value), so it counts
    that many times in the denominator and the numerator. The weight goes into p, not into
    v: a block's value sum can overflow fp16, p·len cannot (p <= 1, len <= 64).
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    if WEIGHTED:
        p = p * col_weight[None, :]
    l_i = l_i * alpha + tl.sum(p, 1)
    # The rescaled accumulator goes into the MMA as its C operand: no separate add.
    acc = tl.dot(p.to(P_DTYPE), v.to(P_DTYPE), acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def head_offset(b, h, stride_b, stride_h):
    """Element offset of (batch ``b``, head ``h``) in a (B, L, H, D) tensor, in 64 bits. With
    heads-first storage (HunyuanVideo hands q/k/v over as (B, H, L, D)) ``h * stride_h``
    passes 2^31 once (H - 1)·L·D does (64 heads of 270,336 tokens × 128), and a 32-bit
    product would silently address another head's memory."""
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h


@triton.jit
def next_block_id(block_ids, blk_next, t, n_steps, SUB: tl.constexpr):
    """Block of loop step ``t`` (``blk_next``, fetched one step earlier) and the block of step
    t + 1. Fetching the id in the step that uses it put its load latency in front of every
    pipelined K/V copy: with every block visited the loop ran at 60 % of cuDNN, with the id
    one step ahead at 80 % (benchmarks/results/kernels_h200_idmode.json)."""
    # Ids may be stored in 16 bits; row arithmetic on them must not be.
    nxt = tl.load(block_ids + (t + 1) // SUB, mask=t + 1 < n_steps, other=0).to(tl.int32)
    return blk_next, nxt


@triton.jit
def attend_listed_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_vn,
    block_ids, count, block_len, row_map,
    qk_scale_log2,
    BLOCK_TOKENS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr, GATHER: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
):
    """Visit ``count`` key blocks whose indices are at ``block_ids[0:count]``.

    ``block_len`` points at the real length of every block (read only when MASKED).
    ``q`` is already in DOT_DTYPE; ``k_base``/``v_base`` point at row 0 of this (batch, head).
    With GATHER, block slots are not rows of K/V: ``row_map[slot]`` is the row, so a blocked
    order (PSA's tile-major layout) is read in place, without a permuted copy.
    OFFSET_DTYPE is int32 whenever every row offset of one (batch, head) fits (the host
    checks), since 64-bit address arithmetic on every tile element costs twice the
    instructions.
    """
    SUB: tl.constexpr = (BLOCK_TOKENS + BLOCK_N - 1) // BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    blk_next = tl.load(block_ids, mask=count > 0, other=0).to(tl.int32)
    for t in range(0, count * SUB):
        blk, blk_next = next_block_id(block_ids, blk_next, t, count * SUB, SUB)
        first = (t % SUB) * BLOCK_N
        rows = blk * BLOCK_TOKENS + first + offs_n
        if MASKED:
            valid = (first + offs_n) < tl.load(block_len + blk)
            if GATHER:
                rows = tl.load(row_map + rows, mask=valid, other=0)
        elif GATHER:
            rows = tl.load(row_map + rows)
        # K and V rows have their own strides (a v that is a view of a fused qkv, say).
        k_off = rows[:, None].to(OFFSET_DTYPE) * stride_kn + offs_d[None, :]
        v_off = rows[:, None].to(OFFSET_DTYPE) * stride_vn + offs_d[None, :]
        if MASKED:
            k = tl.load(k_base + k_off, mask=valid[:, None], other=0.0)
            v = tl.load(v_base + v_off, mask=valid[:, None], other=0.0)
        else:
            k = tl.load(k_base + k_off)
            v = tl.load(v_base + v_off)
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE))) * qk_scale_log2
        if MASKED:
            s = tl.where(valid[None, :], s, float("-inf"))
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, s, v, DOT_DTYPE)
    return acc, l_i, m_i


@triton.jit
def attend_grid_blocks_tma(
    acc, l_i, m_i, q,
    k_desc, v_desc, k_b, k_col, v_b, v_col,
    block_ids, count, grid_hw, grid_w, tokens_t, tokens_h, tokens_w,
    qk_scale_log2,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, SUB_T: tl.constexpr,
    HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, MASKED: tl.constexpr,
):
    """The key loop with K/V tiles fetched by the tensor memory accelerator (Hopper).

    Key blocks are 3D tiles (TILE_T, TILE_H, TILE_W) of a token grid seen through a 5D
    descriptor (batch-or-batch·head, T, H, W, columns); each is walked in boxes of SUB_T
    frames, BLOCK_N = SUB_T·TILE_H·TILE_W rows. Sol's blocks are the case grid (L, 1, 1),
    tile (64, 1, 1). No per-element address arithmetic: one coordinate per box. K and V each
    have their own (first, last) box coordinates: their layouts may differ.
    MASKED: tiles that stick out of the (tokens_t, tokens_h, tokens_w) grid (3D padding).
    The copy engine fills the outside rows with zeros; their scores become -inf here, from
    the box coordinates alone, so padded tiles need neither a slot map nor address tensors.
    """
    SUB: tl.constexpr = TILE_T // SUB_T
    BLOCK_N: tl.constexpr = SUB_T * TILE_H * TILE_W
    if MASKED:
        # (frame, row, column) of every row of a box, relative to its corner.
        box_row = tl.arange(0, BLOCK_N)
        box_t = box_row // (TILE_H * TILE_W)
        box_h = (box_row // TILE_W) % TILE_H
        box_w = box_row % TILE_W
    blk_next = tl.load(block_ids, mask=count > 0, other=0).to(tl.int32)
    for t in range(0, count * SUB):
        blk, blk_next = next_block_id(block_ids, blk_next, t, count * SUB, SUB)
        tb = blk // grid_hw
        hb = (blk % grid_hw) // grid_w
        wb = blk % grid_w
        t0 = tb * TILE_T + (t % SUB) * SUB_T
        k = k_desc.load([k_b, t0, hb * TILE_H, wb * TILE_W, k_col]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([v_b, t0, hb * TILE_H, wb * TILE_W, v_col]).reshape(BLOCK_N, HEAD_DIM)
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE))) * qk_scale_log2
        if MASKED:
            inside = ((t0 + box_t < tokens_t) & (hb * TILE_H + box_h < tokens_h)
                      & (wb * TILE_W + box_w < tokens_w))
            s = tl.where(inside[None, :], s, float("-inf"))
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, s, v, DOT_DTYPE)
    return acc, l_i, m_i


@triton.jit
def tma_box_origin(b, h, num_heads, HEAD_DIM: tl.constexpr, HEADS_IN_COLUMNS: tl.constexpr):
    """(first, last) box coordinates of (batch b, head h) in a ``grid_descriptors`` view."""
    if HEADS_IN_COLUMNS:
        return b, h * HEAD_DIM
    return b * num_heads + h, 0


@triton.jit
def attend_full_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_vn, block_ids, count, block_len, row_map,
    k_desc, v_desc, b, h, num_heads, grid_hw, grid_w,
    qk_scale_log2,
    BLOCK_TOKENS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr, GATHER: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
    TMA: tl.constexpr, K_HEADS_IN_COLUMNS: tl.constexpr, V_HEADS_IN_COLUMNS: tl.constexpr,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, SUB_T: tl.constexpr,
):
    """The unmasked loop of both kernels: TMA boxes when ``grid_descriptors`` made descriptors,
    else the pointer loop. The box coordinates follow ``grid_descriptors``' two layouts, per
    tensor (HunyuanVideo's single blocks hand over k heads first and v as a view of qkv)."""
    if TMA:
        k_b, k_col = tma_box_origin(b, h, num_heads, HEAD_DIM, K_HEADS_IN_COLUMNS)
        v_b, v_col = tma_box_origin(b, h, num_heads, HEAD_DIM, V_HEADS_IN_COLUMNS)
        # Full tiles lie inside the grid: no extents needed.
        acc, l_i, m_i = attend_grid_blocks_tma(
            acc, l_i, m_i, q, k_desc, v_desc, k_b, k_col, v_b, v_col,
            block_ids, count, grid_hw, grid_w, 0, 0, 0,
            qk_scale_log2, TILE_T, TILE_H, TILE_W, SUB_T, HEAD_DIM, DOT_DTYPE, False)
    else:
        acc, l_i, m_i = attend_listed_blocks(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, block_ids, count, block_len, row_map,
            qk_scale_log2, BLOCK_TOKENS, BLOCK_N, HEAD_DIM, False, DOT_DTYPE, GATHER, OFFSET_DTYPE)
    return acc, l_i, m_i


def grid_descriptors(tensors, grid, sub_tile):
    """5D TMA descriptors viewing the first T·H·W tokens of (B, L, heads, D) tensors as a grid.

    Returns (descriptors, heads_in_columns per tensor) or None when the memory layout of any
    tensor does not allow it (then the pointer loop runs). Two layouts qualify, each tensor on
    its own: heads and head dim contiguous
    ((B, L, heads·D) as Wan and LTX hand it over): view (B, T, H, W, heads·D), coordinates
    (b, …, h·D); or heads first ((B, heads, L, D) as HunyuanVideo): view (B·heads, T, H, W, D),
    coordinates (b·heads + h, …, 0). ``sub_tile`` = (frames, H, W) of one box.
    """
    from ._checks import triton_interpreting

    if not _tma_available() and not triton_interpreting():
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    T, H, W = grid
    descs, heads_in_columns = [], []
    for x in tensors:
        B, L, nh, D = x.shape
        sb, sl, sh, sd = x.stride()
        if sd != 1 or x.data_ptr() % 16 or (sl * x.element_size()) % 16:
            return None
        if sh == D:
            shape = [B, T, H, W, nh * D]
            strides = [sb, H * W * sl, W * sl, sl, 1]
            heads_in_columns.append(True)
        elif sl == D and sb == nh * sh:
            shape = [B * nh, T, H, W, D]
            strides = [sh, H * W * sl, W * sl, sl, 1]
            heads_in_columns.append(False)
        else:
            return None
        if any((st * x.element_size()) % 16 for st in strides[:-1]):
            return None
        descs.append(TensorDescriptor(x, shape=shape, strides=strides, block_shape=[1, *sub_tile, D]))
    return descs, heads_in_columns


def _tma_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def row_offset_dtype(rows: int, *tensors):
    """int32 when ``rows`` rows of every tensor are addressable with 32-bit offsets."""
    reach = max(rows * t.stride(1) + t.stride(2) * t.shape[2] for t in tensors)
    return tl.int32 if reach < 2**31 else tl.int64

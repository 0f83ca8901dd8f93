"""The online-softmax loops of the portable engine kernel (``engine.portable``).

A resident query tile visits a list of key blocks (``block_mask.BlockLayout`` blocks, read in
place). Three loops fold into one online-softmax state, running max ``m_i`` (log2 domain),
running sum ``l_i`` and accumulator ``acc``:

- :func:`attend_tma_boxes` (Hopper and later): grid blocks fetched as boxes of a 5D TMA
  descriptor over the token grid, no per-element address arithmetic. Rows of a tile cut by
  the grid's 3D padding come back as zeros and get a score of -inf from the box coordinates.
- :func:`attend_grid_rows`: the pointer loop over grid blocks (before Hopper); every key
  row's token is computed from the block id and the tile, and rows outside the grid read
  row 0 and get a score of -inf.
- :func:`attend_gathered_blocks`: the pointer loop through the slot → token map, padding
  slots (map -1) read row 0 and get a score of -inf: extra (text) blocks, which are not
  tiles of the grid.
- :func:`attend_pooled_blocks`: Sol-Attn's correction. Every key block that is not visited
  exactly enters as one column, its pooled key K̄_j and mean value V̄_j, with logit
  s·q·K̄_j + log(len_j): exp(s·q·K̄_j)·len_j in the denominator and the same times V̄_j in the
  numerator (len_j·V̄_j is the block's value sum, which as a float16 operand would overflow).

The exact loops take their QKᵀ operands in the input dtype, or as codes (``QUANTIZED``,
``precision`` "int8" or "fp8", ``engine.quantize``; the codes' dtype is the key pointers'):
the dot of the codes (int32, or float32 accumulation for float8 e4m3) times the query tile's
scale, the softmax scale (both in ``score_scale``) and the key block's scale
(:func:`exact_scores`). P·V stays in the input dtype either way.

Masking is an additive bias on the scaled scores (0 or -inf), one fused multiply-add per
element, so a padded tile costs no more than a full one. ``m_i`` starts at a large finite
negative number rather than -inf, so a tile whose entries are all -inf leaves the state
unchanged instead of producing NaN; a NaN score propagates into ``l_i`` and ``acc`` (NaN in,
NaN out, as in dense attention).
"""
import torch
import triton
import triton.language as tl


# Finite stand-in for -inf in the running max; see the module docstring.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def softmax_update(acc, l_i, m_i, s, v, P_DTYPE: tl.constexpr, SPLIT_PV: tl.constexpr):
    """Fold scores ``s`` (log2 domain, BLOCK_M × n) with values ``v`` (n × D, or with SPLIT_PV
    its two halves of the head dim, :func:`load_values`) into the state.

    SPLIT_PV: P·V as two dots of D/2 columns each. Triton lays out the warps of a chain of
    ``mma.sync`` dots (every GPU before Hopper) along the query rows only when a dot has at
    least as many rows as columns; a 64-row tile with d 128 got them along the columns
    instead, so that every key step passed P and the row statistics between the warps through
    shared memory (11 barriers a step in the sm_89 build, 2 with the split; kernels/DESIGN.md)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(P_DTYPE)
    # The rescaled accumulator goes into the MMA as its C operand: no separate add.
    if SPLIT_PV:
        M: tl.constexpr = acc.shape[0]
        D: tl.constexpr = acc.shape[1]
        lo, hi = tl.split(tl.permute(tl.reshape(acc, [M, 2, D // 2]), (0, 2, 1)))
        lo = tl.dot(p, v[0].to(P_DTYPE), lo * alpha[:, None])
        hi = tl.dot(p, v[1].to(P_DTYPE), hi * alpha[:, None])
        acc = tl.reshape(tl.permute(tl.join(lo, hi), (0, 2, 1)), [M, D])
    else:
        acc = tl.dot(p, v.to(P_DTYPE), acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def load_values(row_ptrs, HEAD_DIM: tl.constexpr, SPLIT_PV: tl.constexpr, row_ok=None):
    """Value rows at ``row_ptrs`` (a pointer to each row's first element; rows not ``row_ok``
    read as zeros): the n × HEAD_DIM tile, or with SPLIT_PV (:func:`softmax_update`) its two
    halves of the head dim, each loaded by itself."""
    mask = None if row_ok is None else row_ok[:, None]
    other = None if row_ok is None else 0.0
    if SPLIT_PV:
        offs_h = tl.arange(0, HEAD_DIM // 2)
        v = (tl.load(row_ptrs[:, None] + offs_h[None, :], mask=mask, other=other),
             tl.load(row_ptrs[:, None] + HEAD_DIM // 2 + offs_h[None, :], mask=mask, other=other))
    else:
        v = tl.load(row_ptrs[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=mask, other=other)
    return v


@triton.jit
def exact_scores(q, k, score_scale, key_scales, blk, DOT_DTYPE: tl.constexpr, QUANTIZED: tl.constexpr):
    """Scores (log2 domain) of a query tile against key rows ``k`` of block ``blk``: q·kᵀ
    times ``score_scale``; with codes (QUANTIZED: int8 or float8 e4m3, q and k alike) their dot
    times ``score_scale`` (the query tile's scale times the softmax scale) and the key block's
    scale at ``key_scales + blk``. An int8 dot is an exact int32 sum, and exact in float32
    (|sum| <= 127² · 128 < 2²⁴); a float8 dot accumulates in float32 (on sm_90 Triton lets
    wgmma accumulate fp8 at the tensor cores' own, lower, precision: its default
    ``max_num_imprecise_acc``)."""
    if QUANTIZED:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * (score_scale * tl.load(key_scales + blk))
    else:
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE))) * score_scale
    return s


@triton.jit
def next_block_id(block_ids, blk_next, t, n_steps, SUB: tl.constexpr):
    """Block of loop step ``t`` (``blk_next``, fetched one step earlier) and the block of step
    t + 1. Fetching the id in the step that uses it put its load latency in front of every
    pipelined K/V copy: with every block visited the loop ran at 60 % of cuDNN, with the id
    one step ahead at 80 % (H200)."""
    # Ids may be stored in 16 bits; row arithmetic on them must not be.
    nxt = tl.load(block_ids + (t + 1) // SUB, mask=t + 1 < n_steps, other=0).to(tl.int32)
    return blk_next, nxt


@triton.jit
def attend_key_rows(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, rows, bias, blk, score_scale, key_scales,
                    HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
                    PADDED: tl.constexpr, QUANTIZED: tl.constexpr, SPLIT_PV: tl.constexpr):
    """One key step of the pointer loops: the K and V ``rows`` (tokens) of block ``blk`` folded
    into the state, with ``bias`` (0 or -inf per key) added to the scores when PADDED;
    SPLIT_PV: :func:`softmax_update`."""
    offs_d = tl.arange(0, HEAD_DIM)
    k = tl.load(k_base + rows[:, None].to(OFFSET_DTYPE) * stride_kn + offs_d[None, :])
    v = load_values(v_base + rows.to(OFFSET_DTYPE) * stride_vn, HEAD_DIM, SPLIT_PV)
    s = exact_scores(q, k, score_scale, key_scales, blk, DOT_DTYPE, QUANTIZED)
    if PADDED:
        s = s + bias[None, :]
    return softmax_update(acc, l_i, m_i, s, v, DOT_DTYPE, SPLIT_PV)


@triton.jit
def attend_gathered_blocks(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_vn, block_ids, count, row_map, score_scale, key_scales,
    BLOCK_TOKENS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OFFSET_DTYPE: tl.constexpr, QUANTIZED: tl.constexpr, SPLIT_PV: tl.constexpr,
):
    """Visit ``count`` key blocks listed at ``block_ids``, each in ceil(BLOCK_TOKENS / BLOCK_N)
    sub-tiles of BLOCK_N slots whose rows come from ``row_map`` (slot → token, -1 = padding).

    ``k_base``/``v_base`` point at row 0 of this (batch, head); K and V rows have their own
    strides (a v that is a view of a fused qkv, say). The blocks it runs, the extra (text)
    blocks, may have padding slots (the last one is short), whose scores become -inf, as do
    the slots past the block when BLOCK_N does not divide it. OFFSET_DTYPE is int32
    whenever every row offset of one (batch, head) fits (the host checks), since 64-bit address
    arithmetic on every tile element costs twice the instructions. ``score_scale``,
    ``key_scales``, QUANTIZED: :func:`exact_scores` (k then points at the key codes); SPLIT_PV:
    :func:`softmax_update`.
    """
    SUB: tl.constexpr = (BLOCK_TOKENS + BLOCK_N - 1) // BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    blk_next = tl.load(block_ids, mask=count > 0, other=0).to(tl.int32)
    for t in range(0, count * SUB):
        blk, blk_next = next_block_id(block_ids, blk_next, t, count * SUB, SUB)
        local = (t % SUB) * BLOCK_N + offs_n
        rows = tl.load(row_map + blk * BLOCK_TOKENS + local, mask=local < BLOCK_TOKENS, other=-1)
        acc, l_i, m_i = attend_key_rows(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, tl.maximum(rows, 0),
                                        tl.where(rows >= 0, 0.0, float("-inf")), blk, score_scale, key_scales,
                                        HEAD_DIM, DOT_DTYPE, OFFSET_DTYPE, True, QUANTIZED, SPLIT_PV)
    return acc, l_i, m_i


@triton.jit
def attend_grid_rows(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_vn, block_ids, count, GRID_HW: tl.constexpr, GRID_W: tl.constexpr,
    tokens_t, tokens_h, tokens_w, score_scale, key_scales,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, OFFSET_DTYPE: tl.constexpr, PADDED: tl.constexpr,
    QUANTIZED: tl.constexpr, SPLIT_PV: tl.constexpr,
):
    """The pointer loop over grid blocks, every key row's token computed from the block id
    (the tile's frames, rows and columns, as the TMA boxes address them) rather than read from
    the slot map, so that the K/V gather waits on one load (the block id), not two: faster on
    every pointer-loop launch row measured, up to 1.5× (kernels/DESIGN.md, "The portable
    loop").

    A block is walked in ceil(tile / BLOCK_N) sub-tiles of BLOCK_N rows in the tile's (frame,
    row, column) order; PADDED: keys past the grid, or past the tile in its last sub-tile, get
    -inf and read row 0. Softmax does not depend on the order of a block's keys, so the slot
    map's order (real tokens first) need not be kept. ``score_scale``, ``key_scales``,
    QUANTIZED: :func:`exact_scores`; SPLIT_PV: :func:`softmax_update`."""
    BLOCK_TOKENS: tl.constexpr = TILE_T * TILE_H * TILE_W
    SUB: tl.constexpr = (BLOCK_TOKENS + BLOCK_N - 1) // BLOCK_N
    offs_n = tl.arange(0, BLOCK_N)
    blk_next = tl.load(block_ids, mask=count > 0, other=0).to(tl.int32)
    for t in range(0, count * SUB):
        blk, blk_next = next_block_id(block_ids, blk_next, t, count * SUB, SUB)
        local = (t % SUB) * BLOCK_N + offs_n
        frame = (blk // GRID_HW) * TILE_T + local // (TILE_H * TILE_W)
        row = ((blk % GRID_HW) // GRID_W) * TILE_H + (local // TILE_W) % TILE_H
        col = (blk % GRID_W) * TILE_W + local % TILE_W
        token = (frame * tokens_h + row) * tokens_w + col
        inside = (local < BLOCK_TOKENS) & (frame < tokens_t) & (row < tokens_h) & (col < tokens_w)
        if PADDED:
            token = tl.where(inside, token, 0)
        acc, l_i, m_i = attend_key_rows(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, token,
                                        tl.where(inside, 0.0, float("-inf")), blk, score_scale, key_scales,
                                        HEAD_DIM, DOT_DTYPE, OFFSET_DTYPE, PADDED, QUANTIZED, SPLIT_PV)
    return acc, l_i, m_i


@triton.jit
def attend_tma_boxes(
    acc, l_i, m_i, q,
    k_desc, v_desc, k_b, k_col, v_b, v_col,
    block_ids, count, GRID_HW: tl.constexpr, GRID_W: tl.constexpr, tokens_t, tokens_h, tokens_w,
    score_scale, key_scales,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, SUB_T: tl.constexpr,
    HEAD_DIM: tl.constexpr, DOT_DTYPE: tl.constexpr, PADDED: tl.constexpr, QUANTIZED: tl.constexpr,
):
    """The key loop with K/V tiles fetched by the tensor memory accelerator (Hopper).

    Key blocks are 3D tiles (TILE_T, TILE_H, TILE_W) of the token grid seen through a 5D
    descriptor (batch-or-batch·head, T, H, W, columns); each is walked in boxes of SUB_T
    frames, BLOCK_N = SUB_T·TILE_H·TILE_W rows. Row-major blocks are the case grid (L, 1, 1),
    tile (64, 1, 1). K and V each have their own (first, last) box coordinates: their layouts
    may differ. PADDED: the grid has tiles sticking out of (tokens_t, tokens_h, tokens_w); the
    copy engine fills the outside rows with zeros and their scores become -inf here, from the
    box coordinates alone. ``score_scale``, ``key_scales``, QUANTIZED: :func:`exact_scores`
    (``k_desc`` then describes the key codes).
    """
    SUB: tl.constexpr = TILE_T // SUB_T
    BLOCK_N: tl.constexpr = SUB_T * TILE_H * TILE_W
    if PADDED:
        # (frame, row, column) of every row of a box, relative to its corner.
        box_row = tl.arange(0, BLOCK_N)
        box_t = box_row // (TILE_H * TILE_W)
        box_h = (box_row // TILE_W) % TILE_H
        box_w = box_row % TILE_W
    blk_next = tl.load(block_ids, mask=count > 0, other=0).to(tl.int32)
    for t in range(0, count * SUB):
        blk, blk_next = next_block_id(block_ids, blk_next, t, count * SUB, SUB)
        tb = blk // GRID_HW
        hb = (blk % GRID_HW) // GRID_W
        wb = blk % GRID_W
        t0 = tb * TILE_T + (t % SUB) * SUB_T
        k = k_desc.load([k_b, t0, hb * TILE_H, wb * TILE_W, k_col]).reshape(BLOCK_N, HEAD_DIM)
        v = v_desc.load([v_b, t0, hb * TILE_H, wb * TILE_W, v_col]).reshape(BLOCK_N, HEAD_DIM)
        s = exact_scores(q, k, score_scale, key_scales, blk, DOT_DTYPE, QUANTIZED)
        if PADDED:
            inside = ((t0 + box_t < tokens_t) & (hb * TILE_H + box_h < tokens_h)
                      & (wb * TILE_W + box_w < tokens_w))
            s = s + tl.where(inside, 0.0, float("-inf"))[None, :]
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, s, v, DOT_DTYPE, False)
    return acc, l_i, m_i


@triton.jit
def attend_pooled_blocks(
    acc, l_i, m_i, q,
    k_pool, v_pool, log2_len, routed_bits, num_blocks, qk_scale_log2,
    HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr, DOT_DTYPE: tl.constexpr, SPLIT_PV: tl.constexpr,
):
    """Sol-Attn's pooled term: every key block whose bit in ``routed_bits`` (the bitmap as 32-bit
    words: bit j % 32 of word j // 32) is clear enters as one column (``k_pool``/``v_pool``: this
    (batch, head)'s (NB, D) pooled keys and mean values; ``log2_len``: log2 of the blocks'
    lengths), CHUNK blocks a step; SPLIT_PV: :func:`softmax_update`.

    Every load of a step depends on ``cols`` alone (the lengths are loaded whatever the bit
    says, then masked), so the loop pipelines; two chunks in flight, not the kernel's stages,
    so that no row holds fewer programs an SM (kernels/DESIGN.md, "The pooled term's loads")."""
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, HEAD_DIM)
    for c0 in tl.range(0, num_blocks, CHUNK, num_stages=2):
        cols = c0 + offs_c
        col_ok = cols < num_blocks
        kp = tl.load(k_pool + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        vp = load_values(v_pool + cols * HEAD_DIM, HEAD_DIM, SPLIT_PV, col_ok)
        words = tl.load(routed_bits + cols // 32, mask=col_ok, other=0)
        routed = ((words >> (cols % 32)) & 1) != 0
        lengths = tl.load(log2_len + cols, mask=col_ok, other=float("-inf"))
        bias = tl.where(routed, float("-inf"), lengths)
        s = tl.dot(q, tl.trans(kp.to(DOT_DTYPE))) * qk_scale_log2 + bias[None, :]
        acc, l_i, m_i = softmax_update(acc, l_i, m_i, s, vp, DOT_DTYPE, SPLIT_PV)
    return acc, l_i, m_i


@triton.jit
def tma_box_origin(b, h, num_heads, HEAD_DIM: tl.constexpr, HEADS_IN_COLUMNS: tl.constexpr):
    """(first, last) box coordinates of (batch b, head h) in a ``grid_descriptors`` view."""
    if HEADS_IN_COLUMNS:
        return b, h * HEAD_DIM
    return b * num_heads + h, 0


def tma_views(x: torch.Tensor, grid):
    """How TMA sees a (B, L, heads, D) tensor: (grid view, sequence view, heads_in_columns), each
    view a (shape, strides) pair, or None when its memory layout does not allow it.

    Two layouts qualify: heads and head dim contiguous ((B, L, heads·D) as Wan and LTX hand it
    over): grid (B, T, H, W, heads·D), sequence (B, L, heads·D), coordinates (b, …, h·D); or
    heads first ((B, heads, L, D) as HunyuanVideo): grid (B·heads, T, H, W, D), sequence
    (B·heads, L, D), coordinates (b·heads + h, …, 0). The grid view covers the first T·H·W
    tokens.
    """
    T, H, W = grid
    B, L, nh, D = x.shape
    sb, sl, sh, sd = x.stride()
    if sd != 1 or x.data_ptr() % 16 or (sl * x.element_size()) % 16:
        return None
    if sh == D:
        views = ([B, T, H, W, nh * D], [sb, H * W * sl, W * sl, sl, 1]), ([B, L, nh * D], [sb, sl, 1])
        heads_in_columns = True
    elif sl == D and sb == nh * sh:
        views = ([B * nh, T, H, W, D], [sh, H * W * sl, W * sl, sl, 1]), ([B * nh, L, D], [sh, sl, 1])
        heads_in_columns = False
    else:
        return None
    if any((st * x.element_size()) % 16 for view in views for st in view[1][:-1]):
        return None
    return views[0], views[1], heads_in_columns


def grid_descriptors(tensors, grid, sub_tile):
    """5D TMA descriptors (``tma_views``' grid view) of (B, L, heads, D) tensors, boxes of
    ``sub_tile`` = (frames, H, W): (descriptors, heads_in_columns per tensor), or None when the
    memory layout of any tensor does not allow it (then the pointer loop runs)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    views = [tma_views(x, grid) for x in tensors]
    if any(view is None for view in views):
        return None
    descs = [TensorDescriptor(x, shape=shape, strides=strides, block_shape=[1, *sub_tile, x.shape[3]])
             for x, ((shape, strides), _, _) in zip(tensors, views)]
    return descs, [view[2] for view in views]


def tma_sub_frames(tile, max_rows: int = 128):
    """Frames per TMA box for a tile (bt, bh, bw): the most frames f dividing bt such that
    f·bh·bw is a power of two in [16, max_rows] (a dot operand), or None."""
    bt, bh, bw = tile
    for frames in range(bt, 0, -1):
        rows = frames * bh * bw
        if bt % frames == 0 and 16 <= rows <= max_rows and rows & (rows - 1) == 0:
            return frames
    return None


def row_offset_dtype(rows: int, *tensors):
    """int32 when ``rows`` rows of every tensor are addressable with 32-bit offsets from the
    (batch, head) base pointer; the base offsets themselves are always 64-bit."""
    reach = max(rows * t.stride(1) + t.shape[3] for t in tensors)
    return tl.int32 if reach < 2**31 else tl.int64

"""The portable engine kernel: a query tile visits the key blocks its id lists name.

A program owns one query tile (``block_m`` rows of one block of the ``BlockLayout``, read in
place through the slot map) and folds, in one online softmax (``tile_loop``):

1. Sol-Attn only (``pooled``): every key block the mask does not visit, as one pooled column
   (``attend_pooled_blocks``); this partial state seeds the exact loop;
2. the listed grid blocks, exactly: TMA boxes on Hopper and later, before that the pointer
   loop with rows computed from the tile (``attend_grid_rows``);
3. the listed extra (text) blocks, exactly, through the pointer loop over the slot map.

The output is written in place, in the caller's token order. Programs run in the lists' work
order (axis 0) for every batch entry (axis 1). A ``head_base`` lets one call cover a group of
heads (Sol runs its heads in groups to bound its scratch memory, see ``sol``).

With quantized keys (``quantize.QuantizedKeys``, ``precision`` "int8" or "fp8") the exact loops
read the group's key codes instead of k, and the program quantizes its query tile itself, in
the same code format (``quantize.quantize_query_tile``), after Sol's pooled term, which takes
the tile in the input dtype.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._device import device_guard
from .._triton_common import dot_dtype_for, head_offset
from ..block_mask import BlockMask, PooledBlocks
from .id_lists import id_lists
from .launch_args import grid_geometry, strides
from .launch_config import LaunchConfig
from .quantize import CODE_FORMATS, QuantizedKeys, quantize_query_tile
from .tile_loop import (
    NEG_BIG,
    attend_gathered_blocks,
    attend_grid_rows,
    attend_pooled_blocks,
    attend_tma_boxes,
    grid_descriptors,
    row_offset_dtype,
    tma_box_origin,
)

CODE_DTYPES = {code.torch_dtype: code.triton_dtype for code in CODE_FORMATS.values()}  # codes' torch -> Triton dtype


@triton.jit
def _block_sparse_kernel(
    Q, K, V, O, K_DESC, V_DESC,
    WORK, COUNTS, IDS, ROW_MAP,
    K_POOL, V_POOL, LOG2_LEN, ROUTED_BITS, K_SCALES,
    stride_qb, stride_qn, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_on, stride_oh,
    num_heads, head_base, group_heads, num_blocks, tiles_per_block,
    list_batch_stride, list_stride, bits_stride,
    qk_scale_log2, tokens_t, tokens_h, tokens_w,
    GRID_HW: tl.constexpr, GRID_W: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, OFFSET_DTYPE: tl.constexpr,
    TMA: tl.constexpr, K_HEADS_IN_COLUMNS: tl.constexpr, V_HEADS_IN_COLUMNS: tl.constexpr,
    TILE_T: tl.constexpr, TILE_H: tl.constexpr, TILE_W: tl.constexpr, SUB_T: tl.constexpr,
    GRID_PADDED: tl.constexpr, POOLED: tl.constexpr, POOL_CHUNK: tl.constexpr, QUANTIZED: tl.constexpr,
    CODE_DTYPE: tl.constexpr, SPLIT_PV: tl.constexpr,
):
    # K: k, or (QUANTIZED) the key codes (CODE_DTYPE: int8 or float8e4nv) of the group's heads
    # only, with their (B, Hg, NB) scales in K_SCALES.
    work = tl.load(WORK + tl.program_id(0))
    hq = work // tiles_per_block
    q_tile = work % tiles_per_block
    b = tl.program_id(1)
    qblk = hq % num_blocks
    h = head_base + hq // num_blocks
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    local = q_tile * BLOCK_M + offs_m
    rows = tl.load(ROW_MAP + qblk * BLOCK_TOKENS + local, mask=local < BLOCK_TOKENS, other=-1)
    row_ok = rows >= 0
    rows = tl.maximum(rows, 0).to(OFFSET_DTYPE)
    q = tl.load(Q + head_offset(b, h, stride_qb, stride_qh) + rows[:, None] * stride_qn + offs_d[None, :],
                mask=row_ok[:, None], other=0.0).to(DOT_DTYPE)
    if QUANTIZED:
        q_nan = tl.max((q != q).to(tl.int32), 1) > 0  # q itself is not kept past its codes
        hk = hq // num_blocks  # the codes hold the group's heads only
        k_heads = group_heads
        key_scales = K_SCALES + (b.to(tl.int64) * group_heads + hk) * num_blocks
    else:
        hk = h
        k_heads = num_heads
        key_scales = K_SCALES
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], NEG_BIG, dtype=tl.float32)
    k_base = K + head_offset(b, hk, stride_kb, stride_kh)
    v_base = V + head_offset(b, h, stride_vb, stride_vh)
    list_row = b.to(tl.int64) * list_batch_stride + hq
    n_grid = tl.load(COUNTS + list_row * 2)
    n_extra = tl.load(COUNTS + list_row * 2 + 1)
    ids = IDS + list_row * list_stride
    if POOLED:
        pool_off = (b.to(tl.int64) * group_heads + hq // num_blocks) * num_blocks * HEAD_DIM
        acc, l_i, m_i = attend_pooled_blocks(
            acc, l_i, m_i, q, K_POOL + pool_off, V_POOL + pool_off, LOG2_LEN,
            ROUTED_BITS + list_row * bits_stride, num_blocks, qk_scale_log2, HEAD_DIM, POOL_CHUNK, DOT_DTYPE,
            SPLIT_PV)
    if QUANTIZED:
        # The tile's codes and scale (engine.quantize), made after the pooled term, which takes
        # q itself: the codes are not held through that loop.
        q_exact, q_scale = quantize_query_tile(q, row_ok, CODE_DTYPE)
        score_scale = q_scale * qk_scale_log2
    else:
        q_exact = q
        score_scale = qk_scale_log2
    if TMA:
        k_b, k_col = tma_box_origin(b, hk, k_heads, HEAD_DIM, K_HEADS_IN_COLUMNS)
        v_b, v_col = tma_box_origin(b, h, num_heads, HEAD_DIM, V_HEADS_IN_COLUMNS)
        acc, l_i, m_i = attend_tma_boxes(
            acc, l_i, m_i, q_exact, K_DESC, V_DESC, k_b, k_col, v_b, v_col,
            ids, n_grid, GRID_HW, GRID_W, tokens_t, tokens_h, tokens_w,
            score_scale, key_scales, TILE_T, TILE_H, TILE_W, SUB_T, HEAD_DIM, DOT_DTYPE, GRID_PADDED, QUANTIZED)
    else:
        acc, l_i, m_i = attend_grid_rows(
            acc, l_i, m_i, q_exact, k_base, v_base, stride_kn, stride_vn, ids, n_grid, GRID_HW, GRID_W,
            tokens_t, tokens_h, tokens_w, score_scale, key_scales, TILE_T, TILE_H, TILE_W, BLOCK_N, HEAD_DIM,
            DOT_DTYPE, OFFSET_DTYPE, GRID_PADDED, QUANTIZED, SPLIT_PV)
    acc, l_i, m_i = attend_gathered_blocks(
        acc, l_i, m_i, q_exact, k_base, v_base, stride_kn, stride_vn, ids + n_grid, n_extra, ROW_MAP, score_scale,
        key_scales, BLOCK_TOKENS, BLOCK_N, HEAD_DIM, DOT_DTYPE, OFFSET_DTYPE, QUANTIZED, SPLIT_PV)
    # A row with no term at all (Sol without its pooled term, nothing picked) is zero, unless
    # its query is NaN: NaN in, NaN out.
    empty = l_i == 0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    if not QUANTIZED:
        q_nan = tl.max((q != q).to(tl.int32), 1) > 0
    out = tl.where((empty & q_nan)[:, None], float("nan"), out)
    tl.store(O + head_offset(b, h, stride_ob, stride_oh) + rows[:, None] * stride_on + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])


def tile_warps(config: LaunchConfig, block_m: int) -> int:
    """Warps of a program with ``block_m``-row query tiles: Sol's (64 rows) or PSA's (more)."""
    return config.psa_warps if block_m > 64 else config.sol_warps


def tile_stages(config: LaunchConfig, block_m: int, quantized: bool) -> int:
    """Software-pipelining depth of a program with ``block_m``-row query tiles: Sol's (64 rows)
    or PSA's (more), whose ``quantized`` (int8, fp8) launches take a depth of their own."""
    if block_m <= 64:
        return config.sol_stages
    return config.psa_quantized_stages if quantized else config.num_stages


def split_pv(config: LaunchConfig, block_m: int, head_dim: int) -> bool:
    """Whether the kernel computes P·V as two dots over the halves of the head dim
    (``tile_loop.softmax_update``): on the rows whose dots are ``mma.sync`` (no TMA, every GPU
    before Hopper) when the query tile has fewer rows than the head dim but enough for every
    warp to own 16 of them (Triton then lays the warps along the rows; with fewer rows they
    would repeat each other's work)."""
    return not config.tma and 16 * tile_warps(config, block_m) <= block_m < head_dim


def portable_attention(q, k, v, mask: BlockMask, *, scale: float, out: torch.Tensor, head_base: int,
                       pooled: PooledBlocks | None, config: LaunchConfig, block_m: int,
                       sub_frames: int | None, keys: QuantizedKeys | None = None) -> torch.Tensor:
    """``engine.block_sparse_attention`` with the portable kernel: the mask lowered to id lists
    of ``block_m``-row tiles; TMA boxes of ``sub_frames`` frames where given; quantized exact
    blocks when ``keys`` holds the group's quantized keys, in the format of their codes (int8
    or fp8; the pooled keys then already shifted by their mean, ``quantize.shifted``)."""
    lay = mask.layout
    B, L, H, D = q.shape
    lists = id_lists(mask, block_m)
    bt = lay.block_tokens
    k_read = k if keys is None else keys.codes
    sub_tile = (sub_frames, lay.tile[1], lay.tile[2])
    descs = grid_descriptors((k_read, v), lay.grid, sub_tile) if sub_frames else None
    k_desc, v_desc = descs[0] if descs else (k_read, v)
    block_n = min(config.psa_block_n, max(16, triton.next_power_of_2(bt)))
    batch_shared = mask.counts.shape[0] == 1
    pool = pooled if pooled is not None else PooledBlocks(k, v, lay.lengths)  # unused tensors when not pooled
    bits = mask.bits.view(torch.int32) if pooled is not None else mask.counts  # tile_loop reads 32-bit words
    with device_guard(q):
        _block_sparse_kernel[(lists.work.shape[0], B)](
            Q=q, K=k_read, V=v, O=out, K_DESC=k_desc, V_DESC=v_desc,
            WORK=lists.work, COUNTS=mask.counts, IDS=lists.ids, ROW_MAP=lay.row_map,
            K_POOL=pool.k_mean, V_POOL=pool.v_mean, LOG2_LEN=pool.log2_len, ROUTED_BITS=bits,
            K_SCALES=pool.log2_len if keys is None else keys.scales,  # unused without quantized keys
            **strides(q=q, k=k_read, v=v, o=out),
            num_heads=H, head_base=head_base, group_heads=mask.num_heads, num_blocks=lay.n_blocks,
            tiles_per_block=lists.tiles_per_block,
            list_batch_stride=0 if batch_shared else mask.num_heads * lay.n_blocks,
            list_stride=lists.ids.shape[-1], bits_stride=bits.shape[-1],
            qk_scale_log2=scale * math.log2(math.e),
            **grid_geometry(lay),
            HEAD_DIM=D, BLOCK_TOKENS=bt, BLOCK_M=block_m, BLOCK_N=block_n,
            DOT_DTYPE=dot_dtype_for(q.dtype), OFFSET_DTYPE=row_offset_dtype(L, q, k_read, v, out),
            TMA=descs is not None, K_HEADS_IN_COLUMNS=bool(descs and descs[1][0]),
            V_HEADS_IN_COLUMNS=bool(descs and descs[1][1]), SUB_T=sub_frames or 1,
            GRID_PADDED=lay.padded or bt % block_n != 0, POOLED=pooled is not None,
            POOL_CHUNK=config.pool_chunk, QUANTIZED=keys is not None,
            CODE_DTYPE=None if keys is None else CODE_DTYPES[keys.codes.dtype],
            SPLIT_PV=split_pv(config, block_m, D),
            num_warps=tile_warps(config, block_m),
            num_stages=tile_stages(config, block_m, keys is not None),
        )
    return out

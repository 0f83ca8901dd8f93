"""The engine's block loop for Hopper (sm_90), warp-specialised, in Gluon.

The portable engine (``portable._block_sparse_kernel``) runs one query tile per program
with every warp doing everything: issue the copies, wait for them, the two MMAs and the
softmax in turn. Here a program splits that work (FlashAttention-3's layout):

- one **producer** warp issues the TMA copies of K and V into a ring of ``STAGES``
  shared-memory slots and moves on as soon as a slot is released;
- two **consumer** warpgroups of 64 query rows each wait on a slot, run QKᵀ, the online
  softmax and PV, and release the slot (a slot is free once both have). The warp scheduler
  interleaves the two warpgroups; on PSA's tiles they take turns at the tensor cores,
  FlashAttention-3's ping-pong: one consumer's softmax runs while the other's MMAs do.

Two ways to feed the consumers, chosen by the mask's query tile (``SHARED_LIST``):

- 128-row tiles (PSA): both warpgroups take the halves of one tile and every step is for
  both: every K/V tile in shared memory serves 128 query rows;
- 64-row tiles (Sol-Attn's 64-token blocks): each warpgroup runs its own work item, two
  neighbouring query blocks of one head (``pair_streams``). The ring carries one stream of
  128-key steps, two of their routed blocks in the halves of each slot, each step for the
  items that routed its blocks: a block both routed is loaded once for both, and a consumer
  passes over the steps of the other's blocks without computing them. Their pooled chunks
  are the same and come through the ring once.

Each consumer folds, in one online softmax and in this order: Sol's pooled term (chunks of
``BLOCK_N`` pooled blocks, the routed ones masked out by the bitmap), the listed grid blocks
(boxes of a 5D descriptor over the token grid; rows outside the grid's padding get -inf),
the listed extra (text) blocks (boxes of a 3D descriptor over the sequence, rows past the
block's length get -inf); Sol's steps mix grid and text blocks, their padding masked through
``key_bits``. A grid cut in rows leaves the last block row's tiles partly filled; where it
pays (``edge_cover_rows``), PSA's blocks there run the edge cover: two boxes of half a slot
per step, the top half rows of each frame, then each remaining row across half-tile-height
frames, so that fewer steps read padding (at 720p, 45 = 5·8 + 5 rows, 3×8×W tiles: 2 steps
instead of 3). With quantized keys (``QUANTIZED``) the exact blocks' K boxes are boxes of
the key codes, the query tiles are quantized in the consumers and QKᵀ runs on 8-bit operands;
P·V stays in the input dtype. PSA's query codes take the query tile's place in shared memory.
Sol's pooled chunks still need q and the ring in the input dtype, so its ring keeps slots of
that dtype, a step's key codes fill the first half of its slot (``_exact_key_slots``), and the
query codes take the first half of the query tile's buffer once the pooled chunks are done
(``_store_query_codes``): a buffer of their own would cost a ring slot. The semantics are the
portable kernel's; the float references are the same.
Only Hopper builds this kernel (``launch_config``'s ``warp_specialized``), and only with
Triton >= 3.6 (``engine.load_hopper_loop``); B200 needs tcgen05 MMAs and keeps the portable
kernel.
"""

import functools
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import constexpr_function
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.language.core import _aggregate as aggregate
from triton.language.core import base_value

from .._device import triton_interpreting
from .id_lists import id_lists
from .launch_args import grid_geometry, strides
from .pair_streams import pair_streams
from .quantize import code_range, code_scale, encode, quantize_query_tile
from .tile_loop import tma_views

__all__ = ["ROWS", "cover_box", "cover_steps", "edge_cover_rows", "ws_block_sparse_attention", "ws_supported"]

ROWS = gl.constexpr(64)  # query rows of one consumer warpgroup: the M of a Hopper warpgroup MMA
NEG_BIG = gl.constexpr(-1.0e30)  # finite stand-in for -inf in the running max (see tile_loop)
PRODUCER_REGS = gl.constexpr(24)  # a producer holds scalars only; the minimum setmaxnreg allows
CONSUMER_REGS = gl.constexpr(240)  # two accumulators (64×D and 64×BLOCK_N fp32) and the softmax
KERNEL_MAXNREG = 168  # 12 warps (3 warpgroups) × 168 registers fill the 64K register file


# A scalar argument equal to 1 reaches the kernel as a constexpr (Triton's specialisation).
_SCALAR = (gl.tensor, gl.constexpr)


@constexpr_function  # a plain function here is not one the JIT's dependency hash takes
def _set_fields(aggregate_value, fields):
    """The keyword constructor of the aggregates below: Gluon values (tensors, shared memory,
    TMA descriptors) are kept, anything else (numbers, layouts, flags; specialised scalars
    arrive as Python numbers) becomes a constexpr."""
    for name, value in fields.items():
        keep = isinstance(value, base_value) and not isinstance(value, gl.constexpr)
        setattr(aggregate_value, name, value if keep else gl.constexpr(value))


@aggregate
class LoopShape:
    """What every partition knows at compile time: the head dim, the key rows of a ring slot
    (``BLOCK_N``), the blocks (``BLOCK_TOKENS``, tile, TMA box frames ``SUB_T``, block grid),
    the ring depth, and which phases, layouts and key covers this launch has: the padding bias
    of a padded grid (under the edge cover, of the blocks above the last block row), and the
    edge cover's real rows of the last block row (``EDGE_ROWS``, 0 without the cover), and
    whether QKᵀ takes quantized operands (``QUANTIZED``: the K descriptors box the key codes
    of the group's heads, int8 or float8 e4m3, and the query tiles are quantized here)."""

    HEAD_DIM: gl.constexpr
    BLOCK_N: gl.constexpr
    BLOCK_TOKENS: gl.constexpr
    TILE_T: gl.constexpr
    TILE_H: gl.constexpr
    TILE_W: gl.constexpr
    SUB_T: gl.constexpr
    GRID_HW: gl.constexpr
    GRID_W: gl.constexpr
    STAGES: gl.constexpr
    SHARED_LIST: gl.constexpr
    K_HEADS_IN_COLUMNS: gl.constexpr
    V_HEADS_IN_COLUMNS: gl.constexpr
    POOLED: gl.constexpr
    HAS_EXTRA: gl.constexpr
    GRID_PADDED: gl.constexpr
    EDGE_ROWS: gl.constexpr
    QUANTIZED: gl.constexpr

    @constexpr_function
    def __init__(self, **fields):
        _set_fields(self, fields)


@aggregate
class LoopCall:
    """The run-time arguments of a launch: q/o pointers and strides, the mask (work order,
    counts, ids), the layout (slot map, block lengths, Sol's key bits), Sol's pooled term (log2
    lengths, routed bitmap), the key blocks' scales of quantized keys (``K_SCALES``, (B, Hg,
    NB)), the TMA descriptors (the edge cover's half-slot boxes: ``*_half`` the top half rows of
    one frame, ``*_row`` one row of half-tile-height frames) and the scalars of the geometry."""

    Q: gl.tensor
    O: gl.tensor
    WORK: gl.tensor
    COUNTS: gl.tensor
    IDS: gl.tensor
    ROW_MAP: gl.tensor
    LENGTHS: gl.tensor
    KEY_BITS: gl.tensor
    LOG2_LEN: gl.tensor
    ROUTED_BITS: gl.tensor
    K_SCALES: gl.tensor
    k_grid: tma.tensor_descriptor
    v_grid: tma.tensor_descriptor
    k_seq: tma.tensor_descriptor
    v_seq: tma.tensor_descriptor
    k_pool: tma.tensor_descriptor
    v_pool: tma.tensor_descriptor
    k_half: tma.tensor_descriptor
    v_half: tma.tensor_descriptor
    k_row: tma.tensor_descriptor
    v_row: tma.tensor_descriptor
    stride_qb: _SCALAR
    stride_qn: _SCALAR
    stride_qh: _SCALAR
    stride_ob: _SCALAR
    stride_on: _SCALAR
    stride_oh: _SCALAR
    n_work: _SCALAR
    tiles_per_block: _SCALAR
    num_blocks: _SCALAR
    head_base: _SCALAR
    list_batch_stride: _SCALAR
    list_stride: _SCALAR
    bits_batch_stride: _SCALAR
    bits_stride: _SCALAR
    num_heads: _SCALAR
    group_heads: _SCALAR
    n_grid_blocks: _SCALAR
    n_grid_tokens: _SCALAR
    tokens_t: _SCALAR
    tokens_h: _SCALAR
    tokens_w: _SCALAR
    qk_scale_log2: _SCALAR

    @constexpr_function
    def __init__(self, **fields):
        _set_fields(self, fields)


@aggregate
class Ring:
    """Shared memory of a program: the two consumers' query tiles and the key ring (K and V
    slots with their ready and empty barriers) and the ping-pong's turn barriers."""

    q_bufs: gl.shared_memory_descriptor
    k_ring: gl.shared_memory_descriptor
    v_ring: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    turn: gl.shared_memory_descriptor

    @constexpr_function
    def __init__(self, **fields):
        _set_fields(self, fields)


@gluon.jit
def _work_item(call, shape, c: gl.constexpr):
    """The work item of consumer ``c`` of this program: (head, query block, first query row
    in the block, list row, grid count, extra count, live). PSA: the list of the tile's query
    block, counts 0 past the work. Sol: the program's pair stream; an item of -1 (a query block
    left without a partner) is not live but still walks the stream, releasing its slots."""
    pid = gl.program_id(0)
    b = gl.program_id(1)
    if shape.SHARED_LIST:
        live = pid < call.n_work
        work = gl.load(call.WORK + gl.minimum(pid, call.n_work - 1))
        list_row = b.to(gl.int64) * call.list_batch_stride + work // call.tiles_per_block
        n_grid = gl.where(live, gl.load(call.COUNTS + list_row * 2), 0)
        n_extra = gl.where(live, gl.load(call.COUNTS + list_row * 2 + 1), 0)
        first_row = (work % call.tiles_per_block) * (2 * ROWS) + c * ROWS
    else:
        work = gl.load(call.WORK + pid * 2 + c)
        live = work >= 0
        work = gl.maximum(work, 0)
        list_row = b.to(gl.int64) * call.list_batch_stride + pid
        n_grid = gl.load(call.COUNTS + list_row * 2)
        n_extra = gl.load(call.COUNTS + list_row * 2 + 1)
        first_row = (work % call.tiles_per_block) * ROWS
    hq = work // call.tiles_per_block
    h = call.head_base + hq // call.num_blocks
    return h, hq, hq % call.num_blocks, first_row, list_row, n_grid, n_extra, live


@gluon.jit
def _ring_slot(shape, i):
    """Slot and phase of ring step ``i``: the producer and both consumers walk the same steps."""
    return i % shape.STAGES, (i // shape.STAGES) & 1


@gluon.jit
def _box_corner(blk, t, shape):
    """Grid coordinates (frame, row, column) of the TMA box of step ``t`` of listed block ``blk``."""
    SUB: gl.constexpr = shape.TILE_T // shape.SUB_T
    t0 = (blk // shape.GRID_HW) * shape.TILE_T + (t % SUB) * shape.SUB_T
    h0 = ((blk % shape.GRID_HW) // shape.GRID_W) * shape.TILE_H
    w0 = (blk % shape.GRID_W) * shape.TILE_W
    return t0, h0, w0


@gluon.jit
def _listed_block(ids, j, n):
    """Listed entry ``j`` of ``n`` as int32 (0 past the list; ids may be stored in 16 bits),
    read a block ahead of its use by the loops below."""
    return gl.load(ids + j, mask=j < n, other=0).to(gl.int32)


@gluon.jit
def _step_blocks(ids, t, n):
    """Step ``t`` of ``n`` of a Sol pair stream (``pair_streams.PairStreams``): its two key blocks
    (the second repeats the first when that half is empty), whether the second half is empty,
    and its users (bit 0: item 0 computes it, bit 1: item 1). Read a step ahead of its use."""
    first = _listed_block(ids, 2 * t, 2 * n)
    second = _listed_block(ids, 2 * t + 1, 2 * n)
    empty = second < 0
    return first >> 2, gl.where(empty, first >> 2, second >> 2), empty, first & 3


@constexpr_function  # the host's rule and the kernel's loops count the same steps
def cover_steps(tile_t, tile_h, rows):
    """Ring steps of the edge cover over a tile of ``tile_t`` frames cut to ``rows`` of its
    ``tile_h`` rows: one half-slot box for the top ``tile_h / 2`` rows of each frame, then, for
    each row below those, one box per ``tile_h / 2`` frames; two boxes a step."""
    half = tile_h // 2
    row_boxes = max(0, rows - half) * -(-tile_t // half)
    return -(-(tile_t + row_boxes) // 2)


@gluon.jit
def _covered_steps(blk, shape):
    """Under the edge cover: the ring steps of listed grid block ``blk`` (``cover_steps`` in
    the last block row, else one per frame) and whether it is in that row."""
    EDGE_STEPS: gl.constexpr = cover_steps(shape.TILE_T, shape.TILE_H, shape.EDGE_ROWS)
    on_edge = (blk % shape.GRID_HW) // shape.GRID_W == shape.GRID_HW // shape.GRID_W - 1
    return gl.where(on_edge, EDGE_STEPS, shape.TILE_T), on_edge


@constexpr_function  # the producer's boxes, the consumer's masks and the CPU model take the same
def cover_box(tile_t, tile_h, q):
    """Where half-slot box ``q`` of an edge block starts in its tile (frame, row) and whether it
    is a row box (one row of ``tile_h / 2`` frames) rather than a top half (the first
    ``tile_h / 2`` rows of one frame), in the order of ``cover_steps``: box q < tile_t is frame
    q's top half, then row ``tile_h / 2 + i`` from frame ``g · tile_h / 2`` for i, g in row-major
    order. The box after the last (an odd count's padding) comes out as the row below the
    block's real rows, which the consumer masks."""
    half = tile_h // 2
    if q < tile_t:
        return q, 0, False
    row_boxes = -(-tile_t // half)
    return ((q - tile_t) % row_boxes) * half, half + (q - tile_t) // row_boxes, True


@constexpr_function
def _cover_step_whole(tile_t, tile_h, rows, e):
    """Whether both boxes of cover step ``e`` hold only the block's keys on a grid that cuts
    its tiles in rows only (no key of it to mask)."""
    half = tile_h // 2
    for q in (2 * e, 2 * e + 1):
        frame, row, along_t = cover_box(tile_t, tile_h, q)
        if (frame + half > tile_t or row >= rows) if along_t else half > rows:
            return False
    return True


@gluon.jit
def _cover_origins(shape, e: gl.constexpr):
    """Frame, row and kind (1: a row box) of the two boxes of cover step ``e`` (``cover_box``)."""
    F0: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e)[0]
    R0: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e)[1]
    A0: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e)[2] * 1
    F1: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e + 1)[0]
    R1: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e + 1)[1]
    A1: gl.constexpr = cover_box(shape.TILE_T, shape.TILE_H, 2 * e + 1)[2] * 1
    return F0, R0, A0, F1, R1, A1


@gluon.jit
def _step_origins(shape, s, FIRST: gl.constexpr):
    """``_cover_origins`` of run-time cover step ``s``, one of steps ``FIRST`` on."""
    EDGE_STEPS: gl.constexpr = cover_steps(shape.TILE_T, shape.TILE_H, shape.EDGE_ROWS)
    f0, r0, a0, f1, r1, a1 = _cover_origins(shape, FIRST)
    for e in gl.static_range(FIRST + 1, EDGE_STEPS):
        e_f0, e_r0, e_a0, e_f1, e_r1, e_a1 = _cover_origins(shape, e)
        f0, r0, a0 = gl.where(s == e, e_f0, f0), gl.where(s == e, e_r0, r0), gl.where(s == e, e_a0, a0)
        f1, r1, a1 = gl.where(s == e, e_f1, f1), gl.where(s == e, e_r1, r1), gl.where(s == e, e_a1, a1)
    return f0, r0, a0, f1, r1, a1


@gluon.jit
def _cover_keys(shape, origins, offs_n):
    """The frame and row in its tile of every slot column's key at a cover step whose boxes
    start at ``origins`` (``_cover_origins``: constexprs, or run-time scalars)."""
    f0, r0, a0, f1, r1, a1 = origins
    HALF: gl.constexpr = shape.BLOCK_N // 2
    second = offs_n >= HALF
    down = (offs_n % HALF) // shape.TILE_W  # a box's second axis: rows of a top half, frames of a row box
    frame = gl.where(second, f1 + down * a1, f0 + down * a0)
    row = gl.where(second, r1 + down * (1 - a1), r0 + down * (1 - a0))
    return frame, row


@gluon.jit
def _produce_into(desc, coord, ring, slot, bar):
    """One TMA box of ``desc`` at ``coord`` into ring slot ``slot``, completing on ``bar``."""
    mbarrier.expect(bar, desc.block_type.nbytes)
    dst = ring.index(slot)._reinterpret(desc.dtype, desc.block_type.shape, desc.layout)
    tma.async_copy_global_to_shared(desc, coord, bar, dst)


@gluon.jit
def _produce_step(k_desc, v_desc, k_coord, v_coord, ring, slot, phase):
    """K and V of one step into ring slot ``slot``, once the consumers have released it."""
    mbarrier.wait(ring.empty.index(slot), phase ^ 1)
    _produce_into(k_desc, k_coord, ring.k_ring, slot, ring.k_ready.index(slot))
    _produce_into(v_desc, v_coord, ring.v_ring, slot, ring.v_ready.index(slot))


@gluon.jit
def _copy_half(desc, coord, ring_buf, slot, half: gl.constexpr, bar):
    """One box of half a slot into half ``half`` of ring slot ``slot``, completing on ``bar``
    (the caller expects the bytes). A slot of D columns is stored as D / CHUNK column chunks of
    128 bytes, each holding all its rows (the 128-byte swizzle), so a half slot is one run of
    rows in every chunk: the box is CHUNK columns wide and is copied once per chunk, from the
    column in ``coord``'s last entry on (5D grid boxes or 3D sequence boxes)."""
    RANK: gl.constexpr = len(desc.block_type.shape)
    CHUNK: gl.constexpr = desc.block_type.shape[RANK - 1]
    CHUNKS: gl.constexpr = ring_buf.shape[2] // CHUNK
    HALF: gl.constexpr = ring_buf.shape[1] // 2
    # (slot, chunk, half) → HALF rows × CHUNK columns; a subview may not be reinterpreted, an index may.
    runs = ring_buf._reinterpret(ring_buf.dtype, [ring_buf.shape[0] * CHUNKS * 2, HALF, CHUNK],
                                 gl.NVMMASharedLayout.get_default_for([HALF, CHUNK], ring_buf.dtype))
    for chunk in gl.static_range(CHUNKS):
        dst = runs.index((slot * CHUNKS + chunk) * 2 + half)._reinterpret(desc.dtype, desc.block_type.shape,
                                                                           desc.layout)
        col = coord[RANK - 1] + chunk * CHUNK
        if RANK == 5:
            tma.async_copy_global_to_shared(desc, [coord[0], coord[1], coord[2], coord[3], col], bar, dst)
        else:
            tma.async_copy_global_to_shared(desc, [coord[0], coord[1], col], bar, dst)


@gluon.jit
def _produce_halves(desc, coord, second_desc, second_coord, ring_buf, slot, bar):
    """Two boxes of half a slot into the halves of ring slot ``slot``, completing on ``bar``
    together (one expect for both: a barrier of count 1 would complete on the first alone)."""
    CHUNKS: gl.constexpr = ring_buf.shape[2] // desc.block_type.shape[4]
    mbarrier.expect(bar, CHUNKS * (desc.block_type.nbytes + second_desc.block_type.nbytes))
    _copy_half(desc, coord, ring_buf, slot, 0, bar)
    _copy_half(second_desc, second_coord, ring_buf, slot, 1, bar)


@gluon.jit
def _copy_block_half(call, shape, grid_desc, seq_desc, at, blk, ring_buf, slot, half: gl.constexpr, bar):
    """Key block ``blk`` (64 keys) of a Sol pair step into half ``half`` of ring slot ``slot``:
    a grid box, or for an extra (text) block a sequence box."""
    hb, col = at
    extra = False
    if shape.HAS_EXTRA:
        extra = blk >= call.n_grid_blocks
    if extra:
        row = call.n_grid_tokens + (blk - call.n_grid_blocks) * shape.BLOCK_TOKENS
        _copy_half(seq_desc, [hb, row, col], ring_buf, slot, half, bar)
    else:
        t0, h0, w0 = _box_corner(blk, 0, shape)
        _copy_half(grid_desc, [hb, t0, h0, w0, col], ring_buf, slot, half, bar)


@gluon.jit
def _exact_key_slots(ring, shape, code_dtype, slot):
    """The K ring as the exact blocks' key slots, and ring slot ``slot``'s index there: the
    ring itself, or for Sol's quantized calls (a ring of the input dtype, which the pooled
    chunks need) the ring seen as 8-bit slots of half a slot's bytes, a step's codes in the
    first half of its slot."""
    slots = ring.k_ring
    index = slot
    if shape.QUANTIZED and shape.POOLED:
        slots = ring.k_ring._reinterpret(code_dtype, [2 * shape.STAGES, shape.BLOCK_N, shape.HEAD_DIM],
                                         gl.NVMMASharedLayout.get_default_for([shape.BLOCK_N, shape.HEAD_DIM],
                                                                              code_dtype))
        index = 2 * slot
    return slots, index


@gluon.jit
def _produce_pair_step(call, ring, shape, blocks, k_at, v_at, slot, phase):
    """The two key blocks of a Sol pair step into the halves of ring slot ``slot``."""
    blk0, blk1 = blocks
    # Column chunks of 128 bytes a half: K's codes are 8-bit, V in the input dtype.
    K_CHUNKS: gl.constexpr = shape.HEAD_DIM // call.k_grid.block_type.shape[4]
    V_CHUNKS: gl.constexpr = shape.HEAD_DIM // call.v_grid.block_type.shape[4]
    k_slots, k_slot = _exact_key_slots(ring, shape, call.k_grid.dtype, slot)
    mbarrier.wait(ring.empty.index(slot), phase ^ 1)
    mbarrier.expect(ring.k_ready.index(slot), 2 * K_CHUNKS * call.k_grid.block_type.nbytes)
    _copy_block_half(call, shape, call.k_grid, call.k_seq, k_at, blk0, k_slots, k_slot, 0, ring.k_ready.index(slot))
    _copy_block_half(call, shape, call.k_grid, call.k_seq, k_at, blk1, k_slots, k_slot, 1, ring.k_ready.index(slot))
    mbarrier.expect(ring.v_ready.index(slot), 2 * V_CHUNKS * call.v_grid.block_type.nbytes)
    _copy_block_half(call, shape, call.v_grid, call.v_seq, v_at, blk0, ring.v_ring, slot, 0, ring.v_ready.index(slot))
    _copy_block_half(call, shape, call.v_grid, call.v_seq, v_at, blk1, ring.v_ring, slot, 1, ring.v_ready.index(slot))


@gluon.jit
def _produce_cover_boxes(call, ring, corner, origins, k_at, v_at, slot, A0: gl.constexpr, A1: gl.constexpr):
    """Two half-slot boxes of an edge block into ring slot ``slot``: from ``origins`` (frame
    and row of each in its tile, ``_cover_origins``), of kinds ``A0`` and ``A1`` (1: a row
    box, 0: a top half). A box's keys outside the block (rows below its real ones, frames of
    the next tile) are masked by the consumer; those outside the grid come zero-filled."""
    t0, h0, w0 = corner
    f0, r0, _, f1, r1, _ = origins
    k_b, k_col = k_at
    v_b, v_col = v_at
    k0, k1 = [k_b, t0 + f0, h0 + r0, w0, k_col], [k_b, t0 + f1, h0 + r1, w0, k_col]
    v0, v1 = [v_b, t0 + f0, h0 + r0, w0, v_col], [v_b, t0 + f1, h0 + r1, w0, v_col]
    if A0:
        _produce_halves(call.k_row, k0, call.k_row, k1, ring.k_ring, slot, ring.k_ready.index(slot))
        _produce_halves(call.v_row, v0, call.v_row, v1, ring.v_ring, slot, ring.v_ready.index(slot))
    elif A1:
        _produce_halves(call.k_half, k0, call.k_row, k1, ring.k_ring, slot, ring.k_ready.index(slot))
        _produce_halves(call.v_half, v0, call.v_row, v1, ring.v_ring, slot, ring.v_ready.index(slot))
    else:
        _produce_halves(call.k_half, k0, call.k_half, k1, ring.k_ring, slot, ring.k_ready.index(slot))
        _produce_halves(call.v_half, v0, call.v_half, v1, ring.v_ring, slot, ring.v_ready.index(slot))


@gluon.jit
def _produce_edge_step(call, ring, shape, s, corner, k_at, v_at, slot, phase):
    """Step ``s`` of an edge block under the cover, once the consumers have released ring slot
    ``slot``, in the order of ``cover_box``: steps of two
    top halves (frames 2s and 2s + 1), with an odd frame count a step of the last top half and
    the first row box, then steps of two row boxes: one branch per kind of step (the kinds
    and the bounds between them are constexpr), only the row boxes' origins chosen at run
    time (``_step_origins``)."""
    EDGE_STEPS: gl.constexpr = cover_steps(shape.TILE_T, shape.TILE_H, shape.EDGE_ROWS)
    TOPS: gl.constexpr = shape.TILE_T // 2
    MIXED: gl.constexpr = shape.TILE_T % 2
    ROW_FROM: gl.constexpr = TOPS + MIXED
    mbarrier.wait(ring.empty.index(slot), phase ^ 1)
    tops = (2 * s, 0, 0, 2 * s + 1, 0, 0)
    if EDGE_STEPS == TOPS:
        _produce_cover_boxes(call, ring, corner, tops, k_at, v_at, slot, 0, 0)
    elif s < TOPS:
        _produce_cover_boxes(call, ring, corner, tops, k_at, v_at, slot, 0, 0)
    elif MIXED == 0:
        _produce_cover_boxes(call, ring, corner, _step_origins(shape, s, ROW_FROM), k_at, v_at, slot, 1, 1)
    elif EDGE_STEPS == ROW_FROM:
        _produce_cover_boxes(call, ring, corner, _cover_origins(shape, TOPS), k_at, v_at, slot, 0, 1)
    elif s == TOPS:
        _produce_cover_boxes(call, ring, corner, _cover_origins(shape, TOPS), k_at, v_at, slot, 0, 1)
    else:
        _produce_cover_boxes(call, ring, corner, _step_origins(shape, s, ROW_FROM), k_at, v_at, slot, 1, 1)


@gluon.jit
def _producer(call, ring, shape):
    """Issue every K/V box the program's consumers read, in the order they read them."""
    b = gl.program_id(1)
    h, hq, qblk, first_row, list_row, n_grid, n_extra, live = _work_item(call, shape, 0)
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    ids = call.IDS + list_row * call.list_stride
    if shape.QUANTIZED:  # the key codes (B, L, Hg, D) hold the group's heads only
        k_b = b
        k_col = (h - call.head_base) * shape.HEAD_DIM
    elif shape.K_HEADS_IN_COLUMNS:
        k_b = b
        k_col = h * shape.HEAD_DIM
    else:
        k_b = b * call.num_heads + h
        k_col = 0
    if shape.V_HEADS_IN_COLUMNS:
        v_b = b
        v_col = h * shape.HEAD_DIM
    else:
        v_b = b * call.num_heads + h
        v_col = 0
    i = 0
    if shape.POOLED:
        pool_row = b * call.group_heads + hq // call.num_blocks
        for chunk in range(gl.cdiv(call.num_blocks, BLOCK_N)):
            slot, phase = _ring_slot(shape, i)
            _produce_step(call.k_pool, call.v_pool, [pool_row, chunk * BLOCK_N, 0], [pool_row, chunk * BLOCK_N, 0],
                          ring, slot, phase)
            i += 1
    SUB: gl.constexpr = shape.TILE_T // shape.SUB_T
    if not shape.SHARED_LIST:
        # Sol: the pair stream's steps, two key blocks each (text blocks among them).
        step_next = _step_blocks(ids, 0, n_grid)
        for t in range(n_grid):
            blk0, blk1, _, _ = step_next
            step_next = _step_blocks(ids, t + 1, n_grid)
            slot, phase = _ring_slot(shape, i)
            _produce_pair_step(call, ring, shape, (blk0, blk1), (k_b, k_col), (v_b, v_col), slot, phase)
            i += 1
    elif shape.EDGE_ROWS > 0:
        blk_next = _listed_block(ids, 0, n_grid)
        for j in range(n_grid):
            blk = blk_next
            blk_next = _listed_block(ids, j + 1, n_grid)
            n_sub, on_edge = _covered_steps(blk, shape)
            for s in range(n_sub):
                slot, phase = _ring_slot(shape, i)
                if on_edge:
                    _produce_edge_step(call, ring, shape, s, _box_corner(blk, 0, shape), (k_b, k_col), (v_b, v_col),
                                       slot, phase)
                else:
                    t0, h0, w0 = _box_corner(blk, s, shape)
                    _produce_step(call.k_grid, call.v_grid, [k_b, t0, h0, w0, k_col], [v_b, t0, h0, w0, v_col], ring,
                                  slot, phase)
                i += 1
    else:
        blk_next = _listed_block(ids, 0, n_grid)
        for t in range(n_grid * SUB):
            blk = blk_next
            blk_next = _listed_block(ids, (t + 1) // SUB, n_grid)
            t0, h0, w0 = _box_corner(blk, t, shape)
            slot, phase = _ring_slot(shape, i)
            _produce_step(call.k_grid, call.v_grid, [k_b, t0, h0, w0, k_col], [v_b, t0, h0, w0, v_col], ring, slot,
                          phase)
            i += 1
    XSUB: gl.constexpr = (shape.BLOCK_TOKENS + BLOCK_N - 1) // BLOCK_N
    if shape.HAS_EXTRA and shape.SHARED_LIST:
        for t in range(n_extra * XSUB):
            blk = gl.load(ids + n_grid + t // XSUB).to(gl.int32)
            row = call.n_grid_tokens + (blk - call.n_grid_blocks) * shape.BLOCK_TOKENS + (t % XSUB) * BLOCK_N
            slot, phase = _ring_slot(shape, i)
            _produce_step(call.k_seq, call.v_seq, [k_b, row, k_col], [v_b, row, v_col], ring, slot, phase)
            i += 1


@aggregate
class Consumer:
    """What every step of one consumer warpgroup shares: its index ``c`` (which turn barrier
    it waits on, which bit of a Sol stream entry is its item's), the layouts of its scores
    (those the softmax reads, and those of a QKᵀ on 8-bit codes with their accumulator type:
    int32 for int8, float32 for fp8; one layout of registers, the wgmma's K step aside),
    accumulator and P operand, and the softmax scale."""

    c: gl.constexpr
    BLOCK_N: gl.constexpr
    s_layout: gl.constexpr
    code_layout: gl.constexpr
    code_acc: gl.constexpr
    acc_layout: gl.constexpr
    p_layout: gl.constexpr
    qk_scale_log2: _SCALAR

    @constexpr_function
    def __init__(self, **fields):
        _set_fields(self, fields)


@gluon.jit
def _softmax_update(s, m_i, l_i, acc, bias, scale, me):
    """Fold the scores ``s`` (times ``scale``, + ``bias``) of one key tile into the running max
    and sum and rescale the accumulator; returns P as the PV operand."""
    s = s.to(gl.float32) * scale + bias[None, :]
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, me.acc_layout))[:, None]
    return m_new, l_i, acc, p


@gluon.jit
def _no_scores(k_buf, me):
    """The zero accumulator of a QKᵀ against ``k_buf``: of the 8-bit layout on key codes."""
    if k_buf.dtype.primitive_bitwidth == 8:
        zero = gl.zeros([ROWS, me.BLOCK_N], me.code_acc, me.code_layout)
    else:
        zero = gl.zeros([ROWS, me.BLOCK_N], gl.float32, me.s_layout)
    return zero


@gluon.jit
def _attend(state, qk, ring, slot, phase, bias, scales, me):
    """One key tile of the online softmax against ring slot ``slot``, QKᵀ on the operands
    ``qk`` (the query tile and the slot's keys, in shared memory), the scores of
    the slot's first and second halves times ``scales`` (one value twice for a slot of one
    block: the two products fold into one); ``state`` is the accumulator, the running max and
    the running sum."""
    acc, m_i, l_i = state
    q_op, k_buf = qk
    v_buf = ring.v_ring.index(slot)
    mbarrier.wait(ring.k_ready.index(slot), phase)
    s = warpgroup_mma(q_op, k_buf.permute((1, 0)), _no_scores(k_buf, me), use_acc=False, is_async=True)
    s, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_op, k_buf))
    # The halves' factors are chosen here, after the wait, by a column test the compiler
    # recomputes, rather than as a column vector built before the step (registers a consumer
    # does not have to spare).
    first, second = scales
    s = gl.convert_layout(s, me.s_layout).to(gl.float32)
    in_first = gl.arange(0, me.BLOCK_N, layout=gl.SliceLayout(0, me.s_layout)) < me.BLOCK_N // 2
    s = gl.where(in_first[None, :], s * first, s * second)
    m_i, l_i, acc, p = _softmax_update(s, m_i, l_i, acc, bias, 1.0, me)
    p_op = gl.convert_layout(p.to(v_buf.dtype), me.p_layout)
    mbarrier.wait(ring.v_ready.index(slot), phase)
    acc = warpgroup_mma(p_op, v_buf, acc, is_async=True)
    acc, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, v_buf))
    mbarrier.arrive(ring.empty.index(slot), count=1)
    return acc, m_i, l_i


@gluon.jit
def _pass(ring, slot, phase):
    """Release a slot without computing it (a Sol stream step of the other item's block), once
    it holds this lap's copy: an arrival before that would count for the last lap. Both
    consumers walk every ring step, computing or passing it: one that skipped steps would wait
    on a parity a lap ahead, which a barrier that has not got there yet reads as done
    (tests/kernels/test_ring_protocol.py models this)."""
    mbarrier.wait(ring.k_ready.index(slot), phase)
    mbarrier.arrive(ring.empty.index(slot), count=1)


@gluon.jit
def _stream_step(state, qk, ring, slot, phase, bias, scales, me, users):
    """One step of a Sol pair stream: computed if ``users`` has this consumer's item, else passed."""
    if ((users >> me.c) & 1) != 0:
        state = _attend(state, qk, ring, slot, phase, bias, scales, me)
    else:
        _pass(ring, slot, phase)
    return state


@gluon.jit
def _take_turn(ring, turns, c: gl.constexpr):
    """Wait for turn number ``turns`` of consumer ``c`` (consumer 0 has the first)."""
    mbarrier.wait(ring.turn.index(c), (turns & 1) ^ (1 if c == 0 else 0))


@gluon.jit
def _attend_in_turn(state, q_smem, ring, slot, phase, bias, scale, me):
    """``_attend`` ping-pong (FlashAttention-3), for the two consumers of a shared ring: they
    take turns at the tensor cores. In its turn a consumer issues the previous tile's PV and
    this tile's QKᵀ and hands the turn over; its softmax then runs while the other's MMAs do.
    ``state`` adds the previous tile's P (zeros before the first tile, whose slot stands in
    for the previous one), its slot and phase, whether it exists, and the turns taken."""
    acc, m_i, l_i, p_prev, prev_slot, prev_phase, has_prev, turns = state
    _take_turn(ring, turns, me.c)
    v_prev = ring.v_ring.index(prev_slot)
    mbarrier.wait(ring.v_ready.index(prev_slot), prev_phase)
    acc = warpgroup_mma(p_prev, v_prev, acc, is_async=True)
    k_buf = ring.k_ring.index(slot)
    mbarrier.wait(ring.k_ready.index(slot), phase)
    s = warpgroup_mma(q_smem, k_buf.permute((1, 0)), _no_scores(k_buf, me), use_acc=False, is_async=True)
    mbarrier.arrive(ring.turn.index(1 - me.c), count=1)
    acc, s, _, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s, q_smem, k_buf, v_prev))
    mbarrier.arrive(ring.empty.index(prev_slot), count=1, pred=has_prev)
    m_i, l_i, acc, p = _softmax_update(s, m_i, l_i, acc, bias, scale, me)
    p_op = gl.convert_layout(p.to(v_prev.dtype), me.p_layout)
    return acc, m_i, l_i, p_op, slot, phase, turns >= 0, turns + 1


@gluon.jit
def _block_scale(shape, k_scales, blk, score_scale):
    """The factor of the scores of key block ``blk``: ``score_scale`` (the softmax scale in
    log2 units, times the query tile's scale with quantized keys), times the block's scale
    with quantized keys."""
    if shape.QUANTIZED:
        score_scale = score_scale * gl.load(k_scales + blk)
    return score_scale


@gluon.jit
def _quantized_query(call, shape, q, rows_ok, partner_row, qblk, q_base, live, load_layout: gl.constexpr,
                     CODE_DTYPE: gl.constexpr):
    """The codes of a consumer's query rows ``q`` (``rows_ok``: those holding tokens) and the
    scale of the 128-row query tile it shares with the other consumer, whose rows start at
    ``partner_row`` of query block ``qblk``: the tile the float reference and the portable
    kernel quantize as one (``quantize.quantize_query_tile``'s rule), so its largest element is
    taken over both halves; the other half is read for its range only."""
    local = partner_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, load_layout))
    slots = gl.load(call.ROW_MAP + qblk * shape.BLOCK_TOKENS + local, mask=live & (local < shape.BLOCK_TOKENS),
                    other=-1)
    other_ok = slots >= 0
    rows = gl.maximum(slots, 0).to(gl.int64)
    offs_d = gl.arange(0, shape.HEAD_DIM, layout=gl.SliceLayout(0, load_layout))
    other = gl.load(q_base + rows[:, None] * call.stride_qn + offs_d[None, :], mask=other_ok[:, None], other=0.0)
    x = q.to(gl.float32)
    amax, bad = code_range(x, rows_ok[:, None])
    other_max, other_bad = code_range(other.to(gl.float32), other_ok[:, None])
    bad = bad | other_bad
    scale, divisor = code_scale(gl.maximum(amax, other_max), bad, CODE_DTYPE)
    return encode(x, divisor, bad, CODE_DTYPE), scale


@gluon.jit
def _store_query_codes(call, ring, c: gl.constexpr, q_base, rows, rows_ok, offs_d):
    """Sol's quantized calls, once consumer ``c``'s pooled chunks are done: the codes of its
    query block (the block is the query tile) in the first half of its query tile's shared
    memory, which no step reads any more (each step ended with its warps in step, releasing
    its slot), and their scale. q is read again rather than kept in registers through the
    pooled chunks."""
    CODE_DTYPE: gl.constexpr = call.k_grid.dtype
    HEAD_DIM: gl.constexpr = ring.q_bufs.shape[2]
    q = gl.load(q_base + rows[:, None] * call.stride_qn + offs_d[None, :], mask=rows_ok[:, None], other=0.0)
    codes, q_scale = quantize_query_tile(q, rows_ok, CODE_DTYPE)
    slots = ring.q_bufs._reinterpret(CODE_DTYPE, [2 * ring.q_bufs.shape[0], ROWS, HEAD_DIM],
                                     gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], CODE_DTYPE))
    q_codes = slots.index(2 * c)
    q_codes.store(codes)
    fence_async_shared()
    return q_codes, q_scale


@gluon.jit
def _last_pv_in_turn(state, ring, c: gl.constexpr):
    """The last tile's PV, in turn (both consumers of a shared ring run as many tiles, so
    they take the same number of turns); returns the accumulator and the running sum."""
    acc, m_i, l_i, p_prev, prev_slot, prev_phase, has_prev, turns = state
    if has_prev:
        _take_turn(ring, turns, c)
        v_prev = ring.v_ring.index(prev_slot)
        mbarrier.wait(ring.v_ready.index(prev_slot), prev_phase)
        acc = warpgroup_mma(p_prev, v_prev, acc, is_async=True)
        mbarrier.arrive(ring.turn.index(1 - c), count=1)
        acc, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, v_prev))
        mbarrier.arrive(ring.empty.index(prev_slot), count=1)
    return acc, l_i


@gluon.jit
def _pair_step_bias(call, shape, blk0, blk1, empty1, offs_n, WHOLE: gl.constexpr):
    """The key bias of a Sol pair step, per slot column: 0, or -inf on the second half when it
    is empty and, unless the step holds whole blocks (``WHOLE``: the stream's first steps), on
    the padding keys of a block: a grid block's rows past the grid, an extra block's past its
    length, read as 32-bit words of the block's key bits (``key_bits``) so that one select and
    one shift per column do it."""
    HALF: gl.constexpr = shape.BLOCK_N // 2
    second = offs_n >= HALF
    if (shape.GRID_PADDED or shape.HAS_EXTRA) and not WHOLE:
        high = (offs_n % HALF) >= 32
        words = call.KEY_BITS + 2 * blk0
        low0, high0 = gl.load(words), gl.load(words + 1)
        words = call.KEY_BITS + 2 * blk1
        low1 = gl.where(empty1, 0, gl.load(words))
        high1 = gl.where(empty1, 0, gl.load(words + 1))
        word = gl.where(second, gl.where(high, high1, low1), gl.where(high, high0, low0))
        ok = ((word >> (offs_n % 32)) & 1) != 0
    else:
        ok = ~(second & empty1)
    return gl.where(ok, 0.0, float("-inf"))


@gluon.jit
def _grid_box_bias(call, corner, box_t, box_h, box_w):
    """The key bias of a grid box from ``corner`` whose keys lie ``box_t``, ``box_h``, ``box_w``
    from it: -inf past the grid, else 0."""
    t0, h0, w0 = corner
    inside = (t0 + box_t < call.tokens_t) & (h0 + box_h < call.tokens_h) & (w0 + box_w < call.tokens_w)
    return gl.where(inside, 0.0, float("-inf"))


@gluon.jit
def _edge_bias(call, shape, corner, s, offs_n):
    """The key bias of step ``s`` of an edge block under the cover on a grid that also cuts
    tiles in frames or columns (``corner``: its tile's first key), per slot column: -inf on
    the keys of its two half-slot boxes that are not the block's (rows from ``EDGE_ROWS`` on,
    frames of the next tile) or lie past the grid's frames or columns."""
    t0, _, w0 = corner
    frame, row = _cover_keys(shape, _step_origins(shape, s, 0), offs_n)
    inside = ((frame < shape.TILE_T) & (row < shape.EDGE_ROWS) & (t0 + frame < call.tokens_t)
              & (w0 + offs_n % shape.TILE_W < call.tokens_w))
    return gl.where(inside, 0.0, float("-inf"))


@gluon.jit
def _cover_bias(shape, on_edge, s, offs_n, zero_bias):
    """The key bias of step ``s`` of a block under the cover on a grid cut in rows only: -inf
    on the keys of an edge block's step that are not the block's (``_cover_keys``; only the
    steps that hold such keys test ``s``), else 0."""
    EDGE_STEPS: gl.constexpr = cover_steps(shape.TILE_T, shape.TILE_H, shape.EDGE_ROWS)
    bias = zero_bias
    for e in gl.static_range(EDGE_STEPS):
        if not _cover_step_whole(shape.TILE_T, shape.TILE_H, shape.EDGE_ROWS, e):
            frame, row = _cover_keys(shape, _cover_origins(shape, e), offs_n)
            foreign = (frame >= shape.TILE_T) | (row >= shape.EDGE_ROWS)
            bias = gl.where(foreign & (on_edge & (s == e)), float("-inf"), bias)
    return bias


@gluon.jit
def _pooled_bias(call, bits, chunk, offs_n, BLOCK_N: gl.constexpr):
    """The key bias of pooled chunk ``chunk`` (``BLOCK_N`` pooled blocks, one per column):
    log2 of the block's length, -inf for a routed block (it is computed exactly) and past the
    last block. ``bits`` is the item's bitmap as 32-bit words: the chunk's words are loaded as
    scalars, one broadcast each, and every column picks its bit from them (the per-column
    gather of 64-bit words this replaces cost 0.6 ms of a 52 ms call at 75.6K tokens; the
    lengths stay a load: computed from the grid they cost more)."""
    cols = chunk * BLOCK_N + offs_n
    first = chunk * (BLOCK_N // 32)
    w0 = gl.load(bits + first, mask=first < call.bits_stride, other=0)
    w1 = gl.load(bits + first + 1, mask=first + 1 < call.bits_stride, other=0)
    odd = ((offs_n // 32) % 2) == 1
    word = gl.where(odd, w1, w0)
    if BLOCK_N == 128:
        w2 = gl.load(bits + first + 2, mask=first + 2 < call.bits_stride, other=0)
        w3 = gl.load(bits + first + 3, mask=first + 3 < call.bits_stride, other=0)
        word = gl.where(offs_n >= 64, gl.where(odd, w3, w2), word)
    routed = ((word >> (offs_n % 32)) & 1) != 0
    log2_len = gl.load(call.LOG2_LEN + cols, mask=cols < call.num_blocks, other=float("-inf"))
    return gl.where(routed, float("-inf"), log2_len)


@gluon.jit
def _consumer(call, ring, shape, c: gl.constexpr):
    """64 query rows of consumer ``c``'s work item: every listed tile, then the output."""
    b = gl.program_id(1)
    h, hq, qblk, first_row, list_row, n_grid, n_extra, live = _work_item(call, shape, c)
    HEAD_DIM: gl.constexpr = shape.HEAD_DIM
    BLOCK_N: gl.constexpr = shape.BLOCK_N
    TILE_T: gl.constexpr = shape.TILE_T
    TILE_H: gl.constexpr = shape.TILE_H
    TILE_W: gl.constexpr = shape.TILE_W

    # QKᵀ's wgmma reduces 32 8-bit codes a step, 16 half-precision elements: the scores the
    # softmax reads are laid out as PSA's QKᵀ makes them (on codes when quantized), Sol's as its
    # pooled chunks' (in the input dtype; its exact blocks' scores come in code_layout).
    code_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                          instr_shape=[16, BLOCK_N, 32])
    QK_K: gl.constexpr = 32 if shape.QUANTIZED and not shape.POOLED else 16
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, QK_K])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)

    # The query rows, through the slot map (-1: padding, read as zeros and never stored).
    local = first_row + gl.arange(0, ROWS, layout=gl.SliceLayout(1, load_layout))
    slots = gl.load(call.ROW_MAP + qblk * shape.BLOCK_TOKENS + local, mask=live & (local < shape.BLOCK_TOKENS),
                    other=-1)
    rows_ok = slots >= 0
    rows = gl.maximum(slots, 0).to(gl.int64)
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, load_layout))
    q_base = call.Q + b.to(gl.int64) * call.stride_qb + h.to(gl.int64) * call.stride_qh
    q = gl.load(q_base + rows[:, None] * call.stride_qn + offs_d[None, :], mask=rows_ok[:, None], other=0.0)
    q_nan = gl.max((q != q).to(gl.int32), 1) > 0
    q_smem = ring.q_bufs.index(c)
    score_scale = call.qk_scale_log2
    k_scales = call.K_SCALES
    if shape.QUANTIZED and not shape.POOLED:
        partner_row = first_row + ROWS if c == 0 else first_row - ROWS
        codes, q_scale = _quantized_query(call, shape, q, rows_ok, partner_row, qblk, q_base, live, load_layout,
                                          q_smem.dtype)
        q_smem.store(codes)
        score_scale = q_scale * call.qk_scale_log2
    else:
        q_smem.store(q)  # Sol's quantized calls too: the pooled chunks read q in the input dtype
    if shape.QUANTIZED:
        k_scales = call.K_SCALES + (b.to(gl.int64) * call.group_heads + h - call.head_base) * call.num_blocks
    fence_async_shared()

    ids = call.IDS + list_row * call.list_stride
    offs_n = gl.arange(0, BLOCK_N, layout=col_layout)
    me = Consumer(c=c, BLOCK_N=BLOCK_N, s_layout=s_layout, code_layout=code_layout,
                  code_acc=gl.int32 if call.k_grid.dtype == gl.int8 else gl.float32, acc_layout=acc_layout,
                  p_layout=p_layout, qk_scale_log2=call.qk_scale_log2)
    state = (gl.zeros([ROWS, HEAD_DIM], gl.float32, acc_layout),
             gl.full([ROWS], NEG_BIG, gl.float32, gl.SliceLayout(1, s_layout)),
             gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout)))
    if shape.SHARED_LIST:
        zero = n_grid * 0  # run-time zero: loop-carried state must not start as a constexpr
        first_slot, _ = _ring_slot(shape, zero)
        state = state + (gl.zeros([ROWS, BLOCK_N], ring.v_ring.dtype, p_layout), first_slot, zero, zero > 0, zero)
    i = 0
    if shape.POOLED:
        # Sol's pooled term: one column per pooled block, logit + log2(len), routed ones out.
        # Every chunk serves both items of a Sol program (one head); an item 1 that is not live
        # passes them.
        bits = call.ROUTED_BITS + (b.to(gl.int64) * call.bits_batch_stride + hq) * call.bits_stride
        users = live.to(gl.int32) << c
        for chunk in range(gl.cdiv(call.num_blocks, BLOCK_N)):
            bias = _pooled_bias(call, bits, chunk, offs_n, BLOCK_N)
            slot, phase = _ring_slot(shape, i)
            if shape.SHARED_LIST:
                state = _attend_in_turn(state, q_smem, ring, slot, phase, bias, score_scale, me)
            else:
                state = _stream_step(state, (q_smem, ring.k_ring.index(slot)), ring, slot, phase, bias,
                                     (me.qk_scale_log2, me.qk_scale_log2), me, users)
            i += 1
    SUB: gl.constexpr = TILE_T // shape.SUB_T
    box_t = offs_n // (TILE_H * TILE_W)
    box_h = (offs_n // TILE_W) % TILE_H
    box_w = offs_n % TILE_W
    zero_bias = gl.zeros([BLOCK_N], gl.float32, col_layout)
    if shape.EDGE_ROWS > 0:
        # The consumer reads each block id in its own iteration, not a block ahead as the
        # producer does: where every cover step is whole (no bias needs the block), Triton 3.6
        # dropped the look-ahead id from the loop's carried values and counted every block's
        # steps from the first one's, so producer and consumers disagreed and the launch hung.
        for j in range(n_grid):
            blk = _listed_block(ids, j, n_grid)
            n_sub, on_edge = _covered_steps(blk, shape)
            block_scale = _block_scale(shape, k_scales, blk, score_scale)
            for s in range(n_sub):
                if not shape.GRID_PADDED:
                    bias = _cover_bias(shape, on_edge, s, offs_n, zero_bias)
                elif on_edge:
                    bias = _edge_bias(call, shape, _box_corner(blk, 0, shape), s, offs_n)
                else:
                    bias = _grid_box_bias(call, _box_corner(blk, s, shape), box_t, box_h, box_w)
                slot, phase = _ring_slot(shape, i)
                state = _attend_in_turn(state, q_smem, ring, slot, phase, bias, block_scale, me)
                i += 1
    elif shape.SHARED_LIST:
        for t in range(n_grid * SUB):
            block_scale = score_scale
            bias = zero_bias
            if shape.GRID_PADDED or shape.QUANTIZED:
                blk = gl.load(ids + t // SUB).to(gl.int32)
                block_scale = _block_scale(shape, k_scales, blk, score_scale)
                if shape.GRID_PADDED:
                    bias = _grid_box_bias(call, _box_corner(blk, t, shape), box_t, box_h, box_w)
            slot, phase = _ring_slot(shape, i)
            state = _attend_in_turn(state, q_smem, ring, slot, phase, bias, block_scale, me)
            i += 1
    else:
        # Sol: the pair stream's steps, a key block in each half of the slot (with quantized
        # keys, each half's scores times its block's scale).
        q_codes = q_smem
        if shape.QUANTIZED:
            q_codes, q_scale = _store_query_codes(call, ring, c, q_base, rows, rows_ok, offs_d)
            score_scale = q_scale * call.qk_scale_log2
        # The steps of whole blocks come first (``pair_streams``: the stream's second count),
        # so only the rest take the padding keys' bias: one loop per part.
        bounds = (0, n_extra, n_grid)
        step_next = _step_blocks(ids, 0, n_grid)
        for part in gl.static_range(2):
            for t in range(bounds[part], bounds[part + 1]):
                blk0, blk1, empty1, users = step_next
                step_next = _step_blocks(ids, t + 1, n_grid)
                bias = _pair_step_bias(call, shape, blk0, blk1, empty1, offs_n, part == 0)
                slot, phase = _ring_slot(shape, i)
                k_slots, k_slot = _exact_key_slots(ring, shape, call.k_grid.dtype, slot)
                scales = (score_scale, score_scale)
                if shape.QUANTIZED:
                    scales = (score_scale * gl.load(k_scales + blk0), score_scale * gl.load(k_scales + blk1))
                state = _stream_step(state, (q_codes, k_slots.index(k_slot)), ring, slot, phase, bias, scales, me,
                                     users)
                i += 1
    XSUB: gl.constexpr = (shape.BLOCK_TOKENS + BLOCK_N - 1) // BLOCK_N
    if shape.HAS_EXTRA and shape.SHARED_LIST:
        for t in range(n_extra * XSUB):
            blk = gl.load(ids + n_grid + t // XSUB).to(gl.int32)
            length = gl.load(call.LENGTHS + blk)
            bias = gl.where((t % XSUB) * BLOCK_N + offs_n < length, 0.0, float("-inf"))
            slot, phase = _ring_slot(shape, i)
            state = _attend_in_turn(state, q_smem, ring, slot, phase, bias,
                                    _block_scale(shape, k_scales, blk, score_scale), me)
            i += 1

    if shape.SHARED_LIST:
        acc, l_i = _last_pv_in_turn(state, ring, c)
    else:
        acc, m_i, l_i = state
    # A row with no term at all is zero, unless its query is NaN: NaN in, NaN out.
    row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    l_acc = gl.convert_layout(l_i, row_layout)
    empty_row = l_acc == 0
    out = acc / gl.where(empty_row, 1.0, l_acc)[:, None]
    nan_row = empty_row & gl.convert_layout(q_nan, row_layout)
    out = gl.where(nan_row[:, None], float("nan"), out)
    out_rows = gl.convert_layout(rows, row_layout)
    out_ok = gl.convert_layout(rows_ok, row_layout)
    out_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    o_base = call.O + b.to(gl.int64) * call.stride_ob + h.to(gl.int64) * call.stride_oh
    gl.store(o_base + out_rows[:, None] * call.stride_on + out_d[None, :], out.to(call.O.dtype.element_ty),
             mask=out_ok[:, None])


@gluon.jit
def _ws_block_sparse_kernel(
    Q, O, K_GRID, V_GRID, K_SEQ, V_SEQ, K_POOL, V_POOL, K_HALF, V_HALF, K_ROW, V_ROW,
    WORK, COUNTS, IDS, ROW_MAP, LENGTHS, KEY_BITS, LOG2_LEN, ROUTED_BITS, K_SCALES,
    stride_qb, stride_qn, stride_qh, stride_ob, stride_on, stride_oh,
    n_work, tiles_per_block, num_blocks, head_base, list_batch_stride, list_stride, bits_batch_stride, bits_stride,
    num_heads, group_heads, n_grid_blocks, n_grid_tokens, tokens_t, tokens_h, tokens_w, qk_scale_log2,
    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_TOKENS: gl.constexpr,
    TILE_T: gl.constexpr, TILE_H: gl.constexpr, TILE_W: gl.constexpr, SUB_T: gl.constexpr,
    GRID_HW: gl.constexpr, GRID_W: gl.constexpr, STAGES: gl.constexpr,
    SHARED_LIST: gl.constexpr, K_HEADS_IN_COLUMNS: gl.constexpr, V_HEADS_IN_COLUMNS: gl.constexpr,
    POOLED: gl.constexpr, HAS_EXTRA: gl.constexpr, GRID_PADDED: gl.constexpr, EDGE_ROWS: gl.constexpr,
    QUANTIZED: gl.constexpr,
):
    # The query tiles and K ring hold QKᵀ's operands: the input dtype, or the key codes' (PSA's
    # QUANTIZED calls; Sol's pooled chunks keep them in the input dtype). PV's: the input dtype.
    v_dtype: gl.constexpr = V_GRID.dtype
    qk_dtype: gl.constexpr = v_dtype if POOLED else K_GRID.dtype
    q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, HEAD_DIM], qk_dtype)
    k_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], qk_dtype)
    v_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], v_dtype)
    slot_barriers: gl.constexpr = [STAGES, 1]
    ring = Ring(q_bufs=gl.allocate_shared_memory(qk_dtype, [2, ROWS, HEAD_DIM], q_layout),
                k_ring=gl.allocate_shared_memory(qk_dtype, [STAGES, BLOCK_N, HEAD_DIM], k_layout),
                v_ring=gl.allocate_shared_memory(v_dtype, [STAGES, BLOCK_N, HEAD_DIM], v_layout),
                k_ready=gl.allocate_shared_memory(gl.int64, slot_barriers, mbarrier.MBarrierLayout()),
                v_ready=gl.allocate_shared_memory(gl.int64, slot_barriers, mbarrier.MBarrierLayout()),
                empty=gl.allocate_shared_memory(gl.int64, slot_barriers, mbarrier.MBarrierLayout()),
                turn=gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout()))
    mbarrier.init(ring.turn.index(0), count=1)
    mbarrier.init(ring.turn.index(1), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ring.k_ready.index(s), count=1)
        mbarrier.init(ring.v_ready.index(s), count=1)
        mbarrier.init(ring.empty.index(s), count=2)  # free again once both consumers are done with it
    shape = LoopShape(HEAD_DIM=HEAD_DIM, BLOCK_N=BLOCK_N, BLOCK_TOKENS=BLOCK_TOKENS, TILE_T=TILE_T, TILE_H=TILE_H,
                      TILE_W=TILE_W, SUB_T=SUB_T, GRID_HW=GRID_HW, GRID_W=GRID_W, STAGES=STAGES,
                      SHARED_LIST=SHARED_LIST, K_HEADS_IN_COLUMNS=K_HEADS_IN_COLUMNS,
                      V_HEADS_IN_COLUMNS=V_HEADS_IN_COLUMNS, POOLED=POOLED, HAS_EXTRA=HAS_EXTRA,
                      GRID_PADDED=GRID_PADDED, EDGE_ROWS=EDGE_ROWS, QUANTIZED=QUANTIZED)
    call = LoopCall(
        Q=Q, O=O, WORK=WORK, COUNTS=COUNTS, IDS=IDS, ROW_MAP=ROW_MAP, LENGTHS=LENGTHS, KEY_BITS=KEY_BITS,
        LOG2_LEN=LOG2_LEN, ROUTED_BITS=ROUTED_BITS, K_SCALES=K_SCALES, k_grid=K_GRID, v_grid=V_GRID, k_seq=K_SEQ,
        v_seq=V_SEQ, k_pool=K_POOL, v_pool=V_POOL, k_half=K_HALF, v_half=V_HALF, k_row=K_ROW, v_row=V_ROW,
        stride_qb=stride_qb, stride_qn=stride_qn, stride_qh=stride_qh, stride_ob=stride_ob, stride_on=stride_on,
        stride_oh=stride_oh, n_work=n_work, tiles_per_block=tiles_per_block, num_blocks=num_blocks,
        head_base=head_base, list_batch_stride=list_batch_stride, list_stride=list_stride,
        bits_batch_stride=bits_batch_stride, bits_stride=bits_stride, num_heads=num_heads, group_heads=group_heads,
        n_grid_blocks=n_grid_blocks, n_grid_tokens=n_grid_tokens, tokens_t=tokens_t, tokens_h=tokens_h,
        tokens_w=tokens_w,
        qk_scale_log2=qk_scale_log2)
    # Consumer 0 is the default partition (it runs in the kernel's 4 warps).
    gl.warp_specialize([(_consumer, (call, ring, shape, 0)), (_consumer, (call, ring, shape, 1)),
                        (_producer, (call, ring, shape))],
                       [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# Shared memory a launch may fill (of the 227 KB a block may ask for on sm_90), leaving room
# for the barriers and the compiler's scratch.
SHARED_MEMORY_BUDGET = 232448 - 2048


def ring_stages(block_m: int, block_n: int, head_dim: int, element_size: int, most: int,
                key_size: int | None = None) -> int:
    """Slots of the key ring: as many as fit beside the two 64-row query tiles, at most ``most``
    (the configuration's ``num_stages``) per work item: Sol's two items of a program share
    the ring, so with 64-row tiles it has twice that. ``element_size``: bytes of a value (and
    of a key and a query, unless ``key_size`` gives those: 1 for 8-bit codes)."""
    key_size = element_size if key_size is None else key_size
    slot = block_n * head_dim * (key_size + element_size)  # a K and a V tile
    free = SHARED_MEMORY_BUDGET - 2 * ROWS.value * head_dim * key_size
    return max(0, min(most * (1 if block_m == 128 else 2), free // slot))


def ws_supported(q, k, v, layout, block_m: int, sub_frames, num_stages: int, pooled: bool,
                 quantized: bool = False) -> bool:
    """Whether a call on ``layout`` with ``block_m``-row query tiles runs the warp-specialised
    loop (else the portable kernel runs): fp16/bf16, D 64 or 128, 64- or 128-row query tiles,
    TMA boxes of 64 or 128 rows whose ring fits at least 2 slots, and TMA views of K and V.
    64-row tiles only with Sol's pooled term: on bare key lists this loop was 6 % slower than the
    portable one on gaussian inputs and within run-to-run noise on video-like ones (H200).
    ``quantized`` (int8 or fp8 key codes, which the engine writes contiguous, so TMA can box
    them): PSA's 128-row tiles and Sol's 64-row ones (Sol's ring keeps slots of the input dtype
    for its pooled chunks; a pooled term on 128-row tiles has no such path). Never under
    Triton's interpreter, which does not run Gluon. It reads no mask, so the engine also asks
    it for the memory of a call's work form before the call routes."""
    if triton_interpreting():
        return False
    if q.dtype not in (torch.float16, torch.bfloat16) or q.shape[3] not in (64, 128):
        return False
    if block_m not in (64, 128) or sub_frames is None or (block_m == 64 and not pooled):
        return False
    if quantized and pooled and block_m != 64:
        return False
    box_rows = sub_frames * layout.tile[1] * layout.tile[2]
    if box_rows not in (64, 128) or (block_m == 64 and box_rows != 64):
        return False
    if ring_stages(block_m, step_keys(block_m, box_rows), q.shape[3], q.element_size(), num_stages,
                   key_size=1 if quantized and not pooled else None) < 2:
        return False
    return all(tma_views(x, layout.grid) is not None for x in (k, v))


@functools.lru_cache(maxsize=64)
def key_bits(lay) -> torch.Tensor:
    """int32 (n_blocks, 2) on the layout's device: bit j of word j // 32 of a 64-token block is
    set when key j of the half slot its box fills holds a token. A grid block's box is its
    tile in (frame, row, column) order, so its padding is where the tile leaves the grid (not
    last, as in the block's slots of ``row_map``: a tile cut in rows or frames interleaves
    them); a text block's sequence box holds its first ``length`` keys. Sol's pair steps mask
    their padding with it. Cached, read-only."""
    T, H, W = lay.grid
    bt, bh, bw = lay.tile
    _, nH, nW = lay.block_grid
    dev = lay.device  # built where the layout lives: no copy to the host, so no sync on a first call
    key = torch.arange(lay.block_tokens, device=dev)
    blk = torch.arange(lay.n_grid_blocks, device=dev)[:, None]
    inside = (((blk // (nH * nW)) * bt + key // (bh * bw) < T)
              & (((blk % (nH * nW)) // nW) * bh + (key // bw) % bh < H)
              & ((blk % nW) * bw + key % bw < W))
    text = key < lay.lengths[lay.n_grid_blocks:, None]
    keys = torch.cat([inside, text]).to(torch.int64).view(lay.n_blocks, 2, 32)
    words = (keys << torch.arange(32, dtype=torch.int64, device=dev)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def step_keys(block_m: int, box_rows: int) -> int:
    """Key rows of a ring step: PSA's TMA box; for Sol (64-row tiles) two 64-key blocks."""
    return box_rows if block_m == 128 else 2 * box_rows


# The element types the loop reads: q, k, v, and the key codes of quantized calls.
_GLUON_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.int8: gl.int8,
                 torch.float8_e4m3fn: gl.float8e4nv}


def _tma_descriptor(x, shape, strides, box):
    """A Gluon TMA descriptor of ``x`` seen as ``shape``/``strides``, in boxes ``box`` with the
    box's default swizzled shared layout (the one the ring's slots are reinterpreted as)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dtype = _GLUON_DTYPES[x.dtype]
    return TensorDescriptor(x, shape, strides, box, gl.NVMMASharedLayout.get_default_for(box, dtype))


def edge_cover_rows(lay, sub_frames) -> int:
    """The real rows of the last block row when a launch on ``lay`` runs the edge cover there,
    else 0 (the launch takes it for PSA's 128-row query tiles only). The cover takes one-frame
    boxes of tiles of even height cut by the grid's last rows (0 < rows < tile height), and
    only where it takes fewer steps per block of that row (``cover_steps``) than the one step
    per frame of the other blocks: at 720p (45 = 5·8 + 5 rows) 3×8×W tiles take 2 instead of
    3; a cut to at most half the height pays on tiles of 2 or more frames. Keys of a tile also
    cut in frames or columns are masked by their coordinates."""
    _, H, _ = lay.grid
    bt, bh, _ = lay.tile
    rows = H - (lay.block_grid[1] - 1) * bh
    if sub_frames != 1 or bh % 2 or rows == bh:
        return 0
    return rows if cover_steps(bt, bh, rows) < bt else 0


def _cut_in_frames_or_columns(lay) -> bool:
    """Whether the grid leaves some tiles partly filled in frames or columns (under the edge
    cover, the blocks above the last block row then need the padding bias)."""
    T, _, W = lay.grid
    bt, _, bw = lay.tile
    return T % bt != 0 or W % bw != 0


def _descriptors(x, lay, sub_frames, block_n, cover, halves):
    """The descriptors of K or V: grid boxes, sequence boxes for text blocks, the edge cover's
    two half-slot boxes (the top half rows of a frame, one row of half-tile-height frames; the
    grid boxes stand in without the cover), and whether its heads are in the columns
    (``tile_loop.tma_views``). With ``halves`` (Sol's pair steps) the grid and sequence boxes
    are one block × one 128-byte column chunk (``_copy_half``)."""
    (grid_shape, grid_strides), (seq_shape, seq_strides), heads_in_columns = tma_views(x, lay.grid)
    D = x.shape[3]
    _, bh, bw = lay.tile
    chunk = min(D, 128 // x.element_size())  # one 128-byte swizzle column chunk (_copy_half)
    columns = chunk if halves else D
    grid = _tma_descriptor(x, grid_shape, grid_strides, [1, sub_frames, bh, bw, columns])
    seq = _tma_descriptor(x, seq_shape, seq_strides, [1, block_n // 2 if halves else block_n, columns])
    if cover:
        half = _tma_descriptor(x, grid_shape, grid_strides, [1, 1, bh // 2, bw, chunk])
        row = _tma_descriptor(x, grid_shape, grid_strides, [1, bh // 2, 1, bw, chunk])
    else:
        half = row = grid
    return grid, seq, half, row, heads_in_columns


def _pool_descriptor(means, block_n):
    """The descriptor (B·heads, NB, D) of Sol's pooled keys or mean values, boxes of ``block_n``."""
    B, Hg, NB, D = means.shape
    return _tma_descriptor(means, [B * Hg, NB, D], [NB * D, D, 1], [1, block_n, D])


@functools.lru_cache(maxsize=16)
def l2_bytes(device) -> int:
    """The L2 cache of ``device`` in bytes (0 where torch does not say, or for a tensor off the
    GPU: ``tools/compile_kernels.py`` runs the launches on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))


def launch_per_head(device, kv_bytes_per_head: int) -> bool:
    """Whether Sol's loop runs one launch per head of a group: where one head's K and V exceed
    the L2 (at 131K tokens −10 % on gaussian inputs; at 75.6K, where they fit, +0.7 %; H200)."""
    l2 = l2_bytes(device)
    return 0 < l2 < kv_bytes_per_head


def ws_block_sparse_attention(q, k, v, mask, *, scale, out, head_base, pooled, block_m, sub_frames, num_stages,
                              keys=None):
    """``engine.block_sparse_attention`` with the warp-specialised loop (the caller checked
    ``ws_supported``): ``mask`` lowered to id lists of 128-row tiles, or to pair streams of
    64-row tiles; with ``keys`` (``quantize.QuantizedKeys`` of the group's heads) the exact
    blocks' QKᵀ reads their codes and quantizes the query tiles in the same format."""
    lay = mask.layout
    B, L, H, D = q.shape
    shared = block_m == 128
    block_n = step_keys(block_m, sub_frames * lay.tile[1] * lay.tile[2])
    edge_rows = edge_cover_rows(lay, sub_frames) if shared else 0
    cover = edge_rows > 0
    k_read = k if keys is None else keys.codes
    k_grid, k_seq, k_half, k_row, k_cols = _descriptors(k_read, lay, sub_frames, block_n, cover,
                                                        halves=not shared)
    v_grid, v_seq, v_half, v_row, v_cols = _descriptors(v, lay, sub_frames, block_n, cover, halves=not shared)
    if pooled is not None:
        k_pool, v_pool = _pool_descriptor(pooled.k_mean, block_n), _pool_descriptor(pooled.v_mean, block_n)
        # The bitmap as 32-bit words (little-endian: the low half of a 64-bit word first).
        log2_len, bits = pooled.log2_len, mask.bits.view(torch.int32)
    else:
        k_pool, v_pool, log2_len, bits = k_grid, v_grid, lay.lengths, mask.counts
    items_per_batch = 0 if mask.counts.shape[0] == 1 else mask.num_heads * lay.n_blocks
    descriptors = dict(K_GRID=k_grid, V_GRID=v_grid, K_SEQ=k_seq, V_SEQ=v_seq, K_POOL=k_pool, V_POOL=v_pool,
                       K_HALF=k_half, V_HALF=v_half, K_ROW=k_row, V_ROW=v_row)
    layout_args = dict(ROW_MAP=lay.row_map, LENGTHS=lay.lengths, KEY_BITS=lay.lengths if shared else key_bits(lay),
                       num_blocks=lay.n_blocks, n_grid_blocks=lay.n_grid_blocks, n_grid_tokens=lay.n_grid_tokens,
                       BLOCK_TOKENS=lay.block_tokens, HAS_EXTRA=lay.n_blocks > lay.n_grid_blocks,
                       GRID_PADDED=_cut_in_frames_or_columns(lay) if cover else lay.padded, EDGE_ROWS=edge_rows,
                       **grid_geometry(lay))
    key_size = q.element_size() if pooled is not None else k_read.element_size()  # Sol's ring: the input dtype
    stages = ring_stages(block_m, block_n, D, q.element_size(), num_stages, key_size=key_size)
    shape_args = dict(HEAD_DIM=D, BLOCK_N=block_n, SUB_T=sub_frames, STAGES=stages,
                      SHARED_LIST=shared, K_HEADS_IN_COLUMNS=k_cols, V_HEADS_IN_COLUMNS=v_cols,
                      POOLED=pooled is not None, QUANTIZED=keys is not None)

    def launch(work, counts, ids, list_batch_stride, tiles_per_block):
        _ws_block_sparse_kernel[(work.shape[0] // (1 if shared else 2), B)](
            Q=q, O=out, **descriptors, WORK=work, COUNTS=counts, IDS=ids, LOG2_LEN=log2_len, ROUTED_BITS=bits,
            K_SCALES=lay.lengths if keys is None else keys.scales,  # unused without quantized keys
            **strides(q=q, o=out), **layout_args, **shape_args,
            n_work=work.shape[0], tiles_per_block=tiles_per_block, head_base=head_base,
            list_batch_stride=list_batch_stride, list_stride=ids.shape[-1],
            bits_batch_stride=items_per_batch, bits_stride=bits.shape[-1],
            num_heads=H, group_heads=mask.num_heads, qk_scale_log2=scale * math.log2(math.e),
            num_warps=4, maxnreg=KERNEL_MAXNREG,
        )

    if shared:  # PSA: a program per 128-row query tile, its block's list
        lists = id_lists(mask, block_m)
        launch(lists.work, mask.counts, lists.ids, items_per_batch, lists.tiles_per_block)
        return out
    # Sol: a program per pair of query blocks, their stream.
    streams = pair_streams(mask)
    per_head = launch_per_head(q.device, L * D * (k.element_size() + v.element_size()))
    for part in streams.per_head(mask.num_heads) if per_head else (streams,):
        launch(part.work, part.counts, part.entries, part.batch_stride, 1)
    return out

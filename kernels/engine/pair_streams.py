"""A ``BlockMask`` lowered to pair streams: the Hopper loop's work form for 64-row query tiles.

A program of the Hopper loop runs two work items, neighbouring query blocks of one head, one
per consumer warpgroup. ``_pair_steps_kernel`` merges their bitmaps into one stream of steps
of two key blocks: a block both visit is loaded once for both, and each consumer computes
only the steps of its item. The pairs run heaviest first (``launch_order.heaviest_first``).
On the device, without a host sync.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._device import device_guard
from ..block_mask import BlockLayout, BlockMask
from .launch_order import heaviest_first

# Pair streams per program of _pair_steps_kernel: 8 rows took 0.39 ms, 16 rows 0.50 ms (75.6K
# tokens, H200).
PAIR_ROWS = 8
PAIR_CHUNK = 64   # key blocks per step of _pair_steps_kernel: one bitmap word
# Entries past a stream's blocks: its six groups (both items', each item's own; of whole and of
# padded blocks) may each round up by one empty half.
ENTRY_SLACK = 6


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
def _groups(mine0, mine1, part):
    """The blocks of a chunk (int32 0/1) of one part of the stream (``part``: 1 where a block
    is in it): those both items routed, item 0's own, item 1's own."""
    both = mine0 & mine1 & part
    return both, mine0 & (1 - mine1) & part, mine1 & (1 - mine0) & part


@triton.jit
def _part_entries(row, cols, mine0, mine1, part, placed, sizes, first_step, ENTRIES):
    """Write a chunk's entries of one part of the stream, whose steps start at ``first_step``:
    the blocks both items routed two a step, then each item's own two a step, the items'
    steps alternating. ``placed``: the part's blocks placed so far per group; ``sizes``: its
    groups' steps (both, item 0's, item 1's). Returns ``placed`` with this chunk's added."""
    both, own0, own1 = _groups(mine0, mine1, part)
    k_both, k_own0, k_own1 = placed
    s_both, s_own0, s_own1 = sizes
    shorter = tl.minimum(s_own0, s_own1)[:, None]
    at_both = k_both[:, None] + tl.cumsum(both, 1) - 1
    at_own0 = k_own0[:, None] + tl.cumsum(own0, 1) - 1
    at_own1 = k_own1[:, None] + tl.cumsum(own1, 1) - 1
    step0 = _interleaved_step(at_own0 // 2, s_both[:, None], shorter)
    step1 = _interleaved_step(at_own1 // 2, s_both[:, None], shorter) + (at_own1 // 2 < shorter).to(tl.int32)
    at = 2 * first_step[:, None] + tl.where(both != 0, at_both,
                                            tl.where(own0 != 0, 2 * step0 + at_own0 % 2, 2 * step1 + at_own1 % 2))
    tl.store(row[:, None] + at, (cols * 4 + mine0 + 2 * mine1).to(ENTRIES.dtype.element_ty),
             mask=(both | own0 | own1) != 0)
    return k_both + tl.sum(both, 1), k_own0 + tl.sum(own0, 1), k_own1 + tl.sum(own1, 1)


@triton.jit
def _part_empty_halves(row, counts, sizes, first_step, pair_ok, ENTRIES):
    """A group of odd size leaves the second half of its last step empty (-1)."""
    n_both, n_own0, n_own1 = counts
    s_both, s_own0, s_own1 = sizes
    shorter = tl.minimum(s_own0, s_own1)
    empty = tl.full(n_both.shape, -1, dtype=tl.int32).to(ENTRIES.dtype.element_ty)
    row = row + 2 * first_step
    tl.store(row + n_both, empty, mask=pair_ok & (n_both % 2 == 1))
    last0 = _interleaved_step(s_own0 - 1, s_both, shorter)
    tl.store(row + 2 * last0 + 1, empty, mask=pair_ok & (n_own0 % 2 == 1))
    last1 = _interleaved_step(s_own1 - 1, s_both, shorter) + (s_own1 - 1 < shorter).to(tl.int32)
    tl.store(row + 2 * last1 + 1, empty, mask=pair_ok & (n_own1 % 2 == 1))


@triton.jit
def _pair_steps_kernel(
    WORK, BITS, PADDED, COUNTS, ENTRIES,
    n_pairs, num_blocks, items_per_batch, bits_stride, entries_stride,
    ROWS: tl.constexpr, CHUNK: tl.constexpr,
):
    # One row per pair (program of the Hopper loop): its steps of two key blocks, entries
    # 4·block + users (1: item 0 computes it, 2: item 1, 3: both), -1 for an empty half. The
    # steps of whole blocks come first, then those of blocks with padding keys (``PADDED``, one
    # byte a block), so that the loop masks padding keys in the second part only. In each
    # part the blocks both items routed come first, two per step, then the blocks of one item
    # alone, two per step, the items' steps alternating: every step is for the same users in
    # both halves. Two passes over the bitmaps: the counts place the second pass's writes.
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
    zero = tl.zeros([ROWS], dtype=tl.int32)
    whole = (zero, zero, zero)
    padded = (zero, zero, zero)
    for c0 in range(0, num_blocks, CHUNK):
        mine0, mine1 = _pair_bits(first_bits, second_bits, first, second, c0, shift, CHUNK)
        pad = tl.load(PADDED + c0 + offs_c, mask=c0 + offs_c < num_blocks, other=0).to(tl.int32)[None, :]
        w_both, w_own0, w_own1 = _groups(mine0, mine1, 1 - pad)
        p_both, p_own0, p_own1 = _groups(mine0, mine1, pad)
        whole = (whole[0] + tl.sum(w_both, 1), whole[1] + tl.sum(w_own0, 1), whole[2] + tl.sum(w_own1, 1))
        padded = (padded[0] + tl.sum(p_both, 1), padded[1] + tl.sum(p_own0, 1), padded[2] + tl.sum(p_own1, 1))
    whole_steps = ((whole[0] + 1) // 2, (whole[1] + 1) // 2, (whole[2] + 1) // 2)
    padded_steps = ((padded[0] + 1) // 2, (padded[1] + 1) // 2, (padded[2] + 1) // 2)
    n_whole = whole_steps[0] + whole_steps[1] + whole_steps[2]
    placed_whole = (zero, zero, zero)
    placed_padded = (zero, zero, zero)
    for c0 in range(0, num_blocks, CHUNK):
        cols = (c0 + offs_c)[None, :]
        mine0, mine1 = _pair_bits(first_bits, second_bits, first, second, c0, shift, CHUNK)
        pad = tl.load(PADDED + c0 + offs_c, mask=c0 + offs_c < num_blocks, other=0).to(tl.int32)[None, :]
        placed_whole = _part_entries(row, cols, mine0, mine1, 1 - pad, placed_whole, whole_steps, zero, ENTRIES)
        placed_padded = _part_entries(row, cols, mine0, mine1, pad, placed_padded, padded_steps, n_whole, ENTRIES)
    _part_empty_halves(row, whole, whole_steps, zero, pair_ok, ENTRIES)
    _part_empty_halves(row, padded, padded_steps, n_whole, pair_ok, ENTRIES)
    n_padded = padded_steps[0] + padded_steps[1] + padded_steps[2]
    tl.store(COUNTS + (b * n_pairs + pairs) * 2, n_whole + n_padded, mask=pair_ok)
    tl.store(COUNTS + (b * n_pairs + pairs) * 2 + 1, n_whole, mask=pair_ok)


@dataclass(frozen=True)
class PairStreams:
    """The key streams of the Hopper loop's Sol programs, two work items each.

    ``work`` int32 (2·P,): program p runs items ``work[2p]`` and ``work[2p + 1]`` (entries
    head · N + query block of the group, -1 for none); ``counts`` int32 (B, P, 2): the ring
    steps of each program's stream, then how many of them come first as steps of whole blocks
    (the blocks with padding keys, whose keys the loop masks, come after them); ``entries``
    (B, P, N + ENTRY_SLACK), int16 below 8192 blocks:
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
    query blocks in time pick the most alike keys), extra blocks go two by two;
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
    return heaviest_first(counts, pair_partners(layout), paired=True)


@functools.lru_cache(maxsize=64)
def padded_blocks(layout: BlockLayout) -> torch.Tensor:
    """int8 (N,) on the layout's device: 1 for a block with padding keys (fewer real tokens
    than its slots: a grid tile cut by the grid, a short extra block). Cached, read-only."""
    return (layout.lengths < layout.block_tokens).to(torch.int8)


def entry_dtype(n_blocks: int) -> torch.dtype:
    """The dtype of pair-stream entries (4 · block + users): 16 bits while they fit."""
    return torch.int16 if n_blocks < 2**13 else torch.int32


def pair_streams(mask: BlockMask) -> PairStreams:
    """The Hopper loop's pair streams of ``mask``."""
    B, Hg, n, _ = mask.counts.shape
    work = pair_work(mask.counts, mask.layout)
    n_pairs = Hg * len(pair_partners(mask.layout))
    dev = mask.counts.device
    counts = torch.empty((B, n_pairs, 2), device=dev, dtype=torch.int32)
    entries = torch.empty((B, n_pairs, n + ENTRY_SLACK), device=dev, dtype=entry_dtype(n))
    with device_guard(mask.counts):
        _pair_steps_kernel[(triton.cdiv(n_pairs, PAIR_ROWS), B)](
            WORK=work, BITS=mask.bits, PADDED=padded_blocks(mask.layout), COUNTS=counts, ENTRIES=entries,
            n_pairs=n_pairs, num_blocks=n, items_per_batch=Hg * n, bits_stride=mask.bits.shape[-1],
            entries_stride=n + ENTRY_SLACK, ROWS=PAIR_ROWS, CHUNK=PAIR_CHUNK,
        )
    return PairStreams(work, counts, entries)


def pair_stream_bytes(n_blocks: int) -> int:
    """Device memory of one head's pair streams and their launch order."""
    return 8 * n_blocks + (n_blocks + 1) // 2 * (n_blocks + ENTRY_SLACK) * entry_dtype(n_blocks).itemsize

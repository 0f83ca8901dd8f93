"""A ``BlockMask`` lowered to group streams: Sol's work form for the Hopper loop with one key
block a ring step.

A program runs ``items`` (2 or 3) query blocks of one head at the same place in consecutive
frames of blocks, one per consumer warpgroup. ``_group_steps_kernel`` merges their bitmaps into
one stream of steps of one key block: a block several items routed is loaded once for them,
each consumer computes only the steps its item routed. Entries are 8 · block + users (bit c:
item c routed it); the steps of whole blocks come first, then those of blocks with padding
keys, each part in block order. The programs run heaviest first
(``launch_order.heaviest_first``). On the device, without a host sync.
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
from .pair_streams import padded_blocks

GROUP_ROWS = 8    # programs per program of _group_steps_kernel
GROUP_CHUNK = 64  # key blocks per step of _group_steps_kernel: one bitmap word
USER_BITS = 3     # an entry's low bits: which of up to three items compute the step


@triton.jit
def _chunk_users(WORK, BITS, programs, ok, b, c0, shift, items_per_batch, bits_stride,
                 ITEMS: tl.constexpr, CHUNK: tl.constexpr):
    """int32 (ROWS, CHUNK): bit c set where item c of each program routed the chunk's block."""
    users = tl.zeros([programs.shape[0], CHUNK], dtype=tl.int32)
    for c in tl.static_range(ITEMS):
        item = tl.load(WORK + programs * ITEMS + c, mask=ok, other=-1)
        bits = BITS + (b * items_per_batch + tl.maximum(item, 0)) * bits_stride
        word = tl.load(bits + c0 // CHUNK, mask=item >= 0, other=0)
        users |= (((word[:, None] >> shift) & 1).to(tl.int32)) << c
    return users


@triton.jit
def _group_steps_kernel(
    WORK, BITS, PADDED, COUNTS, ENTRIES,
    n_programs, num_blocks, items_per_batch, bits_stride, entries_stride,
    ITEMS: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr,
):
    # Two passes over the bitmaps: the first counts the whole blocks, which place the second's
    # writes (whole blocks from step 0, padded ones after them).
    b = tl.program_id(1).to(tl.int64)
    programs = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = programs < n_programs
    row = ENTRIES + (b * n_programs + programs) * entries_stride
    offs_c = tl.arange(0, CHUNK)
    shift = offs_c.to(tl.int64)[None, :]
    n_whole = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        users = _chunk_users(WORK, BITS, programs, ok, b, c0, shift, items_per_batch, bits_stride, ITEMS, CHUNK)
        pad = tl.load(PADDED + c0 + offs_c, mask=c0 + offs_c < num_blocks, other=1).to(tl.int32)[None, :]
        n_whole += tl.sum(((users != 0) & (pad == 0)).to(tl.int32), 1)
    placed_whole = tl.zeros([ROWS], dtype=tl.int32)
    placed_padded = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        users = _chunk_users(WORK, BITS, programs, ok, b, c0, shift, items_per_batch, bits_stride, ITEMS, CHUNK)
        pad = tl.load(PADDED + c0 + offs_c, mask=c0 + offs_c < num_blocks, other=1).to(tl.int32)[None, :]
        whole = ((users != 0) & (pad == 0)).to(tl.int32)
        padded = ((users != 0) & (pad != 0)).to(tl.int32)
        at = tl.where(whole != 0, placed_whole[:, None] + tl.cumsum(whole, 1) - 1,
                      n_whole[:, None] + placed_padded[:, None] + tl.cumsum(padded, 1) - 1)
        cols = (c0 + offs_c)[None, :]
        tl.store(row[:, None] + at, ((cols << 3) + users).to(ENTRIES.dtype.element_ty),
                 mask=ok[:, None] & (users != 0))
        placed_whole += tl.sum(whole, 1)
        placed_padded += tl.sum(padded, 1)
    tl.store(COUNTS + (b * n_programs + programs) * 2, placed_whole + placed_padded, mask=ok)
    tl.store(COUNTS + (b * n_programs + programs) * 2 + 1, n_whole, mask=ok)


@dataclass(frozen=True)
class GroupStreams:
    """The key streams of the Hopper loop's Sol programs, ``items`` work items each.

    ``work`` int32 (items·P,): program p runs items ``work[items·p + c]`` (head · N + query
    block of the group, -1 for none); ``counts`` int32 (B, P, 2): each program's ring steps,
    then how many of them come first as steps of whole blocks; ``entries`` (B, P, N), int16
    below 4096 blocks: one per step, 8 · block + users."""

    items: int
    work: torch.Tensor
    counts: torch.Tensor
    entries: torch.Tensor

    @property
    def n_programs(self) -> int:
        return int(self.counts.shape[1])

    @property
    def batch_stride(self) -> int:
        """Programs between two batch entries of ``counts`` and ``entries`` in memory."""
        return int(self.counts.stride(0) // self.counts.stride(1))

    def per_head(self, num_heads: int) -> tuple["GroupStreams", ...]:
        """The streams of each of the group's ``num_heads`` heads, as views."""
        per = self.n_programs // num_heads
        if per * num_heads != self.n_programs:
            raise ValueError(f"GroupStreams.per_head: {self.n_programs} programs do not split into {num_heads} heads")
        w = self.items * per
        return tuple(GroupStreams(self.items, self.work[w * i:w * (i + 1)], self.counts[:, per * i:per * (i + 1)],
                                  self.entries[:, per * i:per * (i + 1)]) for i in range(num_heads))


@functools.lru_cache(maxsize=64)
def group_partners(layout: BlockLayout, items: int) -> torch.Tensor:
    """int64 (P, items) on the layout's device: the query blocks that share a stream. Grid
    blocks go with those at the same place in the next frames of blocks (frames items·m to
    items·m + items - 1), extra blocks ``items`` by ``items``; a short group's last places are
    -1. Cached, read-only."""
    gt = layout.block_grid[0]
    frame = layout.n_grid_blocks // gt
    grid = torch.arange(layout.n_grid_blocks).reshape(gt, frame)
    groups = []
    for start in range(0, gt, items):
        frames = grid[start:start + items]
        pad = torch.full((items - frames.shape[0], frame), -1, dtype=grid.dtype)
        groups.append(torch.cat([frames, pad]).T)
    extra = torch.arange(layout.n_grid_blocks, layout.n_blocks)
    if len(extra):
        padded = torch.cat([extra, torch.full((-len(extra) % items,), -1, dtype=extra.dtype)])
        groups.append(padded.reshape(-1, items))
    return torch.cat(groups).to(layout.device)


def entry_dtype(n_blocks: int) -> torch.dtype:
    """The dtype of group-stream entries (8 · block + users): 16 bits while they fit."""
    return torch.int16 if n_blocks < 2**(15 - USER_BITS) else torch.int32


def group_streams(mask: BlockMask, items: int) -> GroupStreams:
    """The Hopper loop's group streams of ``mask``, ``items`` query blocks a program."""
    if items not in (2, 3):
        raise ValueError(f"group_streams: items must be 2 or 3, got {items}")
    B, Hg, n, _ = mask.counts.shape
    partners = group_partners(mask.layout, items)
    work = heaviest_first(mask.counts, partners)
    n_programs = Hg * partners.shape[0]
    dev = mask.counts.device
    counts = torch.empty((B, n_programs, 2), device=dev, dtype=torch.int32)
    entries = torch.empty((B, n_programs, n), device=dev, dtype=entry_dtype(n))
    with device_guard(mask.counts):
        _group_steps_kernel[(triton.cdiv(n_programs, GROUP_ROWS), B)](
            WORK=work, BITS=mask.bits, PADDED=padded_blocks(mask.layout), COUNTS=counts, ENTRIES=entries,
            n_programs=n_programs, num_blocks=n, items_per_batch=Hg * n, bits_stride=mask.bits.shape[-1],
            entries_stride=n, ITEMS=items, ROWS=GROUP_ROWS, CHUNK=GROUP_CHUNK,
        )
    return GroupStreams(items, work, counts, entries)


def group_stream_bytes(n_blocks: int) -> int:
    """Device memory of one head's group streams of pairs (the most programs) and their order."""
    return 8 * n_blocks + (n_blocks + 1) // 2 * n_blocks * entry_dtype(n_blocks).itemsize

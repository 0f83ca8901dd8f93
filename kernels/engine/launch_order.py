"""The order in which the engine's programs run: heaviest work first, so the last wave is short.

- :func:`work_order` (host, for a reused mask): each head's query blocks together in block
  order (neighbouring query blocks read overlapping keys), heads heaviest first so the
  lightest runs last; entries (head · NB + query block) · tiles + tile.
- :func:`work_by_count` (device, for a mask of one call): head by head, each head's query
  blocks heaviest first (the longest tiles first: 3-7 % faster than block order with Sol's
  64-row tiles on the H200); entries head · NB + query block.
- :func:`heaviest_first` (device): the same ranking for programs of up to two query blocks
  (the Hopper loop's pairs, ``pair_streams``).

The device orders read no count back to the host, so a call never synchronises the device.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .._device import device_guard
from ..block_mask import BlockLayout

ORDER_ROWS = 32   # programs ranked per program of _heaviest_first_kernel
ORDER_CHUNK = 128  # programs compared per step of _heaviest_first_kernel


def work_order(visits: torch.Tensor, layout: BlockLayout, block_m: int) -> torch.Tensor:
    """Launch order of query tiles, int32: entries (head · NB + query block) · tiles + tile,
    tiles = ceil(block slots / block_m), as the kernels decode them.

    ``visits`` (H, NB) key blocks per (head, query block) of ``layout``'s blocks. Tiles past a
    block's real rows get no program; the tiles of one block stay adjacent (they read the same
    key list). Host work."""
    H, nb = visits.shape
    # From the slots, not the longest block: where a tile sticks out of the grid on some axis
    # every block is short, and fewer tiles here would give the kernels another head's rows.
    tiles = -(-layout.block_tokens // block_m)
    heads = torch.argsort(visits.sum(-1), descending=True, stable=True)
    pairs = (heads[:, None] * nb + torch.arange(nb)).reshape(-1)
    entries = pairs[:, None] * tiles + torch.arange(tiles)
    live = torch.arange(tiles)[None, :] * block_m < layout.lengths.long().cpu()[pairs % nb][:, None]
    return entries[live].to(torch.int32)


@triton.jit
def _summed_loads(COUNTS, items, counts_batch_stride, head_row, batch):
    """Exact blocks of each item (block id within the head; < 0: none), grid and extra blocks,
    summed over the batch."""
    ok = items >= 0
    load = tl.zeros(items.shape, dtype=tl.int32)
    for b in range(batch):
        at = COUNTS + b * counts_batch_stride + (head_row + items) * 2
        load += tl.load(at, mask=ok, other=0) + tl.load(at + 1, mask=ok, other=0)
    return load


@triton.jit
def _program_cost(COUNTS, PARTNERS, programs, n_programs, counts_batch_stride, head_row, batch):
    ok = programs < n_programs
    first = tl.load(PARTNERS + programs * 2, mask=ok, other=-1).to(tl.int32)
    second = tl.load(PARTNERS + programs * 2 + 1, mask=ok, other=-1).to(tl.int32)
    cost = (_summed_loads(COUNTS, first, counts_batch_stride, head_row, batch)
            + _summed_loads(COUNTS, second, counts_batch_stride, head_row, batch))
    return first, second, cost, ok


@triton.jit
def _heaviest_first_kernel(
    COUNTS, PARTNERS, WORK, n_programs, num_blocks, batch, counts_batch_stride,
    ROWS: tl.constexpr, CHUNK: tl.constexpr, PAIRED: tl.constexpr,
):
    # A stable descending sort of each head's programs by cost, as ranks: a program's place is
    # the number of programs that cost more, or as much and come before it. One launch in
    # place of PyTorch's dozen (sums, gathers, a segmented sort, index arithmetic).
    h = tl.program_id(1)
    head_row = h * num_blocks
    mine = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    first, second, cost, ok = _program_cost(COUNTS, PARTNERS, mine, n_programs, counts_batch_stride, head_row,
                                            batch)
    rank = tl.zeros([ROWS], dtype=tl.int32)
    for j0 in range(0, n_programs, CHUNK):
        other = j0 + tl.arange(0, CHUNK)
        _, _, other_cost, other_ok = _program_cost(COUNTS, PARTNERS, other, n_programs, counts_batch_stride,
                                                   head_row, batch)
        ahead = ((other_cost[None, :] > cost[:, None])
                 | ((other_cost[None, :] == cost[:, None]) & (other[None, :] < mine[:, None])))
        rank += tl.sum((ahead & other_ok[None, :]).to(tl.int32), 1)
    place = h * n_programs + rank
    if PAIRED:
        tl.store(WORK + place * 2, tl.where(first >= 0, first + head_row, -1), mask=ok)
        tl.store(WORK + place * 2 + 1, tl.where(second >= 0, second + head_row, -1), mask=ok)
    else:
        tl.store(WORK + place, first + head_row, mask=ok)


def work_by_count(counts: torch.Tensor) -> torch.Tensor:
    """Launch order of a mask's one-tile query blocks, int32 entries head · N + query block:
    head by head, each head's query blocks heaviest first by their ``counts`` (B, H, N, 2)
    summed over the batch. On the device, without a host sync."""
    return heaviest_first(counts, _single_blocks(counts.shape[2], str(counts.device)), paired=False)


@functools.lru_cache(maxsize=64)
def _single_blocks(num_blocks: int, device_str: str) -> torch.Tensor:
    """(N, 2) partners of ``work_by_count``: every block alone."""
    blocks = torch.arange(num_blocks)
    return torch.stack([blocks, torch.full_like(blocks, -1)], -1).to(device_str)


def heaviest_first(counts: torch.Tensor, partners: torch.Tensor, *, paired: bool) -> torch.Tensor:
    """int32 (Hg·P·2,) or, unpaired, (Hg·P,): each head's programs (``partners``, (P, 2) query
    blocks, -1 for none) heaviest first by their blocks' counts (B, Hg, N, 2) summed over the
    batch, ties in program order; entries head · N + query block."""
    counts = counts.contiguous()
    B, Hg, n, _ = counts.shape
    P = partners.shape[0]
    work = torch.empty(Hg * P * (2 if paired else 1), device=counts.device, dtype=torch.int32)
    with device_guard(counts):
        _heaviest_first_kernel[(triton.cdiv(P, ORDER_ROWS), Hg)](
            COUNTS=counts, PARTNERS=partners, WORK=work, n_programs=P, num_blocks=n, batch=B,
            counts_batch_stride=counts.stride(0), ROWS=ORDER_ROWS, CHUNK=ORDER_CHUNK, PAIRED=paired,
        )
    return work

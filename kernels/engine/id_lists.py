"""A ``BlockMask`` lowered to id lists: the work form of the portable loop and of the Hopper
loop's shared 128-row tiles.

Per (batch, head, query block) the visited key blocks' ids, ascending (grid ids come first
because extra blocks are numbered after them), and the launch order of the query tiles of
``block_m`` rows. A reused mask is lowered once on the host, its lists as wide as its longest
(``launch_order.work_order``'s order); a mask of one call on the device, its lists with room
for every block so no count is read back (``launch_order.work_by_count``'s order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._device import device_guard
from ..block_mask import BlockMask
from .launch_order import work_by_count, work_order

LIST_ROWS = 32    # query blocks per program of _lists_from_bits_kernel
LIST_CHUNK = 64   # key blocks per step: one bitmap word


@dataclass(frozen=True)
class IdLists:
    """``ids`` int16/int32 (Bm, H, NB, W): the visited blocks of each query block, ascending
    (entries past its count unspecified); ``work`` int32: the launch order of query tiles,
    entry ``(head · NB + query block) · tiles_per_block + tile``; ``block_m`` query rows per
    tile."""

    ids: torch.Tensor
    work: torch.Tensor
    block_m: int
    tiles_per_block: int


def id_dtype(n_blocks: int) -> torch.dtype:
    """The dtype of block ids: 16 bits while they fit."""
    return torch.int16 if n_blocks < 2**15 else torch.int32


@triton.jit
def _lists_from_bits_kernel(BITS, IDS, num_blocks, bits_stride, ROWS: tl.constexpr, CHUNK: tl.constexpr):
    # One program per ROWS query blocks of one (batch, head): each block's set bits, appended
    # to its list in ascending order.
    bh = tl.program_id(1).to(tl.int64)
    qrows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = qrows < num_blocks
    list_rows = bh * num_blocks + qrows
    offs_c = tl.arange(0, CHUNK)
    n_listed = tl.zeros([ROWS], dtype=tl.int32)
    for c0 in range(0, num_blocks, CHUNK):
        word = tl.load(BITS + list_rows * bits_stride + c0 // CHUNK, mask=row_ok, other=0)
        flags = ((word[:, None] >> offs_c.to(tl.int64)[None, :]) & 1).to(tl.int32)
        pos = n_listed[:, None] + tl.cumsum(flags, 1) - 1
        tl.store(IDS + list_rows[:, None] * num_blocks + pos, (c0 + offs_c)[None, :].to(IDS.dtype.element_ty),
                 mask=flags != 0)
        n_listed += tl.sum(flags, 1)


def _lists_on_host(mask: BlockMask, block_m: int) -> IdLists:
    lay = mask.layout
    nb = lay.n_blocks
    keep = mask.to_dense().cpu()
    counts = mask.counts.cpu()
    width = max(1, int(counts.sum(-1).max()))
    ids = torch.empty(*keep.shape[:2], nb, width, dtype=id_dtype(nb))
    index = torch.arange(nb, dtype=torch.int32)
    for b in range(keep.shape[0]):
        for h in range(keep.shape[1]):  # one head at a time: the sort key is 4 bytes a pair
            # Visited blocks first, each group ascending: sort on (not visited, index).
            key = (~keep[b, h]).to(torch.int32) * nb + index
            ids[b, h] = (torch.sort(key, dim=-1).values[:, :width] % nb).to(ids.dtype)
    work = work_order(counts.sum(-1).sum(0), lay, block_m)
    return IdLists(ids.to(lay.device).contiguous(), work.to(lay.device), block_m, -(-lay.block_tokens // block_m))


def _lists_on_device(mask: BlockMask, block_m: int) -> IdLists:
    lay = mask.layout
    if block_m < lay.block_tokens:
        raise ValueError(f"a mask of one call is lowered to one {block_m}-row tile per block, and its blocks "
                         f"hold {lay.block_tokens} tokens")
    Bm, H, n, _ = mask.counts.shape
    ids = torch.empty((Bm, H, n, n), device=mask.counts.device, dtype=id_dtype(n))
    with device_guard(mask.bits):
        _lists_from_bits_kernel[(triton.cdiv(n, LIST_ROWS), Bm * H)](
            BITS=mask.bits, IDS=ids, num_blocks=n, bits_stride=mask.bits.shape[-1], ROWS=LIST_ROWS, CHUNK=LIST_CHUNK,
        )
    return IdLists(ids, work_by_count(mask.counts), block_m, 1)


def id_lists(mask: BlockMask, block_m: int) -> IdLists:
    """The id lists of ``mask`` for query tiles of ``block_m`` rows (kept with a reused mask)."""
    return mask.lowering(("id_lists", block_m),
                         lambda m: _lists_on_host(m, block_m) if m.reused else _lists_on_device(m, block_m))


def id_list_bytes(n_blocks: int) -> int:
    """Device memory of one head's id lists for a mask of one call."""
    return id_dtype(n_blocks).itemsize * n_blocks * n_blocks

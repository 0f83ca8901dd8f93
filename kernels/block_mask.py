"""The blocks of one attention call, and which (query block, key block) pairs it visits.

Both methods run on the same blocks and the same mask object:

- :class:`BlockLayout` cuts a sequence into blocks. The first T·H·W tokens are a video grid
  (T, H, W) in row-major order, cut into tiles (bt, bh, bw) with 3D padding
  (``layout.TileLayout``): every grid block owns ``bt·bh·bw`` slots, its real tokens first.
  Tokens after the grid (HunyuanVideo's text) are cut into blocks of the same size after the
  grid blocks. A sequence with no grid is the grid (L, 1, 1) with the tile (64, 1, 1): row-major
  64-token blocks. Kernels read q/k/v in place through the slot → token map ``row_map``
  (``-1`` on padding slots), so nothing is ever permuted or padded in memory.
- :class:`BlockMask` is the compact form of a block-sparse pattern (FlexAttention's idea): per
  (batch, head, query block) the number of visited grid blocks and extra blocks and their
  ids, ascending (grid ids come first because extra blocks are numbered after them), plus the
  launch order of the query tiles. PSA builds one per head from its static stripe mask
  (``psa_mask.PSAMask.block_mask``, cached), Sol-Attn's router one per call on the device
  (``sol_router``), tests any from a dense bool matrix (:func:`mask_from_dense`). The engine
  (``block_sparse``) consumes it; ``to_dense`` and ``density`` inspect it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch

from ._checks import cache_device, check_int, shown
from .layout import MAX_GRID_TOKENS, check_grid, check_tile, tile_layout

__all__ = ["BlockLayout", "BlockMask", "block_layout", "row_major_layout", "mask_from_dense", "work_order",
           "ROW_MAJOR_BLOCK"]

ROW_MAJOR_BLOCK = 64  # tokens per block of a sequence with no grid


@dataclass(frozen=True, eq=False)
class BlockLayout:
    """The blocks of a sequence of ``n_tokens`` = T·H·W grid tokens + ``extra_tokens``.

    ``lengths`` int32 (n_blocks,): real tokens per block; ``row_map`` int32
    (n_blocks · block_tokens,): the token of every slot, -1 on padding slots; ``padded``: some
    grid block is short (a kernel must mask its padding). Tensors are on ``device`` and shared
    by the cache: read-only.
    """

    grid: tuple
    tile: tuple
    extra_tokens: int
    block_grid: tuple
    n_grid_blocks: int
    n_blocks: int
    block_tokens: int
    lengths: torch.Tensor
    row_map: torch.Tensor
    padded: bool
    device: torch.device

    @property
    def n_grid_tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def n_tokens(self) -> int:
        return self.n_grid_tokens + self.extra_tokens

    @property
    def n_slots(self) -> int:
        return self.n_blocks * self.block_tokens

    def token_blocks(self) -> torch.Tensor:
        """Block id (int64, n_tokens) of every token in sequence order."""
        blocks = torch.empty(self.n_tokens, dtype=torch.int64, device=self.device)
        slots = torch.nonzero(self.row_map >= 0).squeeze(1)
        blocks[self.row_map[slots].long()] = slots // self.block_tokens
        return blocks

    def __repr__(self) -> str:
        return (f"BlockLayout(grid={self.grid}, tile={self.tile}, extra_tokens={self.extra_tokens}, "
                f"blocks={self.n_grid_blocks}+{self.n_blocks - self.n_grid_blocks}, "
                f"padding={100 * (self.n_slots / self.n_tokens - 1):.1f}%)")


@functools.lru_cache(maxsize=64)
def _cached_block_layout(grid, tile, extra_tokens, device_str):
    lay = tile_layout(grid, tile)
    bt = lay.block_tokens
    extra_blocks = -(-extra_tokens // bt)
    lengths = torch.cat([lay.block_lengths.to(torch.int32),
                         torch.full((extra_blocks,), bt, dtype=torch.int32)])
    if extra_blocks:
        lengths[-1] = extra_tokens - (extra_blocks - 1) * bt
    extra_slots = torch.arange(extra_blocks * bt, dtype=torch.int64)
    extra_map = torch.where(extra_slots < extra_tokens, lay.n_tokens + extra_slots, -1)
    row_map = torch.cat([lay.perm, extra_map]).to(torch.int32)
    dev = torch.device(device_str)
    return BlockLayout(
        grid=lay.grid, tile=lay.tile, extra_tokens=extra_tokens, block_grid=lay.block_grid,
        n_grid_blocks=lay.n_blocks, n_blocks=lay.n_blocks + extra_blocks, block_tokens=bt,
        lengths=lengths.to(dev), row_map=row_map.to(dev),
        padded=bool((lay.block_lengths < bt).any()), device=dev)


def block_layout(grid, tile, extra_tokens: int = 0, device="cpu") -> BlockLayout:
    """The :class:`BlockLayout` of a grid, tile and extra-token count on ``device`` (cached).
    The grid and the extra tokens together hold at most ``layout.MAX_GRID_TOKENS`` tokens,
    the longest sequence the kernels take."""
    grid, tile = check_grid(grid), check_tile(tile)
    extra_tokens = check_int(extra_tokens, "extra_tokens", 0, MAX_GRID_TOKENS - math.prod(grid))
    return _cached_block_layout(grid, tile, extra_tokens, str(cache_device(device)))


def row_major_layout(seq_len: int, device="cpu") -> BlockLayout:
    """Row-major blocks of ``ROW_MAJOR_BLOCK`` tokens (a sequence without a grid): the grid
    (L, 1, 1) cut into tiles (64, 1, 1), built directly (a video grid's per-axis limit of
    ``layout.check_grid`` does not apply to a flat sequence; its token limit does)."""
    seq_len = check_int(seq_len, "sequence length", 1)
    if seq_len > MAX_GRID_TOKENS:
        raise ValueError(f"sequence length {seq_len} is more than the {MAX_GRID_TOKENS} tokens the kernels take")
    return _cached_row_major_layout(seq_len, str(cache_device(device)))


@functools.lru_cache(maxsize=64)
def _cached_row_major_layout(seq_len: int, device_str: str) -> BlockLayout:
    bt = ROW_MAJOR_BLOCK
    n = -(-seq_len // bt)
    slots = torch.arange(n * bt, dtype=torch.int32)
    lengths = torch.full((n,), bt, dtype=torch.int32)
    lengths[-1] = seq_len - (n - 1) * bt
    dev = torch.device(device_str)
    return BlockLayout(
        grid=(seq_len, 1, 1), tile=(bt, 1, 1), extra_tokens=0, block_grid=(n, 1, 1), n_grid_blocks=n,
        n_blocks=n, block_tokens=bt, lengths=lengths.to(dev),
        row_map=torch.where(slots < seq_len, slots, -1).to(dev), padded=seq_len % bt != 0, device=dev)


@dataclass(frozen=True, eq=False)
class BlockMask:
    """Which key blocks every query block visits, in the form the engine reads.

    ``counts`` int32 (Bm, H, NB, 2): visited grid blocks and extra blocks per query block;
    ``ids`` int16/int32 (Bm, H, NB, W): their ids, ascending (entries past the count are
    unspecified); ``work`` int32: the launch order of query tiles, entry
    ``(head · NB + query block) · tiles_per_block + tile``; ``block_m`` query rows per tile.
    ``Bm`` is 1 for a mask shared by the whole batch (PSA) or the batch size (Sol).
    ``routed_bits`` int64 (Bm, H, NB, ceil(NB / 64)), Sol only: the same pairs as a bitmap
    (bit j % 64 of word j // 64), which the pooled correction reads to leave them out. A Sol
    mask routed for the Hopper loop has the bitmap only (``ids`` of width 0, ``work`` empty:
    ``has_lists``): that loop reads pair streams made from the bitmap.
    """

    layout: BlockLayout
    counts: torch.Tensor
    ids: torch.Tensor
    work: torch.Tensor
    block_m: int
    routed_bits: Optional[torch.Tensor] = None

    @property
    def num_heads(self) -> int:
        return int(self.counts.shape[1])

    @property
    def tiles_per_block(self) -> int:
        return -(-self.layout.block_tokens // self.block_m)

    @property
    def has_lists(self) -> bool:
        return self.ids.shape[-1] > 0

    def density(self) -> torch.Tensor:
        """Share of visited (query block, key block) pairs, float32 (Bm, H) (no host sync)."""
        return self.counts.sum(dim=(-1, -2), dtype=torch.float32) / self.layout.n_blocks ** 2

    def to_dense(self) -> torch.Tensor:
        """bool (Bm, H, NB, NB): the visited pairs (for tests and pictures; syncs the host)."""
        nb = self.layout.n_blocks
        if not self.has_lists:
            bit = torch.arange(64, device=self.routed_bits.device)
            dense = ((self.routed_bits[..., None] >> bit) & 1).bool()
            return dense.flatten(-2)[..., :nb]
        total = self.counts.sum(-1).long()
        width = self.ids.shape[-1]
        listed = torch.arange(width, device=self.ids.device) < total[..., None]
        dense = torch.zeros(*self.counts.shape[:-1], nb + 1, dtype=torch.bool, device=self.ids.device)
        ids = torch.where(listed, self.ids.long(), nb)
        dense.scatter_(-1, ids, True)
        return dense[..., :nb]


def work_order(visits: torch.Tensor, layout: BlockLayout, block_m: int, order: str = "head") -> torch.Tensor:
    """Launch order of query tiles, int32: entries (head · NB + query block) · tiles + tile,
    tiles = ceil(block slots / block_m), as the kernels decode them (``BlockMask.tiles_per_block``).

    ``visits`` (H, NB) key blocks per (head, query block) of ``layout``'s blocks.
    "head" keeps each head's query blocks together in block order (neighbouring query blocks
    read overlapping keys), heads heaviest first so the lightest runs last; "heaviest" runs
    (head, block) pairs heaviest first. Tiles past a block's real rows get no program; the
    tiles of one block stay adjacent (they read the same key list). Host work, for static
    masks; Sol's routed masks are ordered per call on the device (``sol_router.work_by_count``).
    """
    H, nb = visits.shape
    # From the slots, not the longest block: where a tile sticks out of the grid on some axis
    # every block is short, and fewer tiles here would give the kernels another head's rows.
    tiles = -(-layout.block_tokens // block_m)
    if order == "heaviest":
        pairs = torch.argsort(visits.reshape(-1), descending=True, stable=True)
    elif order == "head":
        heads = torch.argsort(visits.sum(-1), descending=True, stable=True)
        pairs = (heads[:, None] * nb + torch.arange(nb)).reshape(-1)
    else:
        raise ValueError(f"order must be 'heaviest' or 'head', got {shown(order)}")
    entries = pairs[:, None] * tiles + torch.arange(tiles)
    live = torch.arange(tiles)[None, :] * block_m < layout.lengths.long().cpu()[pairs % nb][:, None]
    return entries[live].to(torch.int32)


def id_dtype(n_blocks: int) -> torch.dtype:
    """The dtype of a mask's block ids: 16 bits while they fit."""
    return torch.int16 if n_blocks < 2**15 else torch.int32


def mask_from_dense(keep: torch.Tensor, layout: BlockLayout, block_m: int, order: str = "head") -> BlockMask:
    """The :class:`BlockMask` of a bool (Bm, H, NB, NB) matrix of visited pairs (host work)."""
    if keep.dtype != torch.bool or keep.dim() != 4 or keep.shape[-2:] != (layout.n_blocks, layout.n_blocks):
        raise ValueError(f"keep must be a bool tensor (Bm, H, NB, NB) with NB = {layout.n_blocks}, "
                         f"got {keep.dtype} {tuple(keep.shape)}")
    keep = keep.cpu()
    nb, ng = layout.n_blocks, layout.n_grid_blocks
    counts = torch.stack([keep[..., :ng].sum(-1), keep[..., ng:].sum(-1)], dim=-1).to(torch.int32)
    width = max(1, int(counts.sum(-1).max()))
    ids = torch.empty(*keep.shape[:2], nb, width, dtype=id_dtype(nb))
    index = torch.arange(nb, dtype=torch.int32)
    for b in range(keep.shape[0]):
        for h in range(keep.shape[1]):  # one head at a time: the sort key is 4 bytes a pair
            # Visited blocks first, each group ascending: sort on (not visited, index).
            key = (~keep[b, h]).to(torch.int32) * nb + index
            ids[b, h] = (torch.sort(key, dim=-1).values[:, :width] % nb).to(ids.dtype)
    work = work_order(counts.sum(-1).sum(0), layout, block_m, order)
    dev = layout.device
    return BlockMask(layout, counts.to(dev).contiguous(), ids.to(dev).contiguous(), work.to(dev), block_m)

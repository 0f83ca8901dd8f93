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
  (batch, head, query block) the number of visited grid blocks and extra blocks, and the
  visited pairs as a bitmap. PSA builds one per preset layer from its static stripe mask
  (``psa_mask.psa_kernel_mask``, cached), Sol-Attn's router one per call on the device
  (``sol_gpu_routing``), tests any from a dense bool matrix (:func:`mask_from_dense`). The
  engine (``engine``) lowers it to the work form of the backend that runs; ``to_dense`` and
  ``density`` inspect it.
- :class:`PooledBlocks` is Sol-Attn's pooled term, the engine's other input.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ._checks import check_int
from ._device import cache_device
from .layout import MAX_GRID_TOKENS, check_grid, check_tile, tile_layout

__all__ = ["BlockLayout", "BlockMask", "PooledBlocks", "block_layout", "row_major_layout", "mask_from_dense",
           "bits_from_dense", "ROW_MAJOR_BLOCK"]

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
    """Which key blocks every query block visits: the one form every method hands the engine.

    ``counts`` int32 (Bm, H, NB, 2): visited grid blocks and extra blocks per query block;
    ``bits`` int64 (Bm, H, NB, ceil(NB / 64)): the visited pairs, bit j % 64 of word j // 64
    for key block j (Sol's pooled term leaves them out). ``Bm`` is 1 for a mask shared by the
    whole batch (PSA) or the batch size (Sol). Each backend lowers the mask to its own work
    form (``engine``: id lists and a launch order, or pair streams). ``reused``: the mask
    serves many calls (PSA's cached masks, built on the host): a backend lowers it once, on
    the host, and keeps the result with the mask (:meth:`lowering`); a mask of one call (Sol's
    router) is lowered on the device at every call, with no host sync.
    """

    layout: BlockLayout
    counts: torch.Tensor
    bits: torch.Tensor
    reused: bool = False
    _lowered: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def num_heads(self) -> int:
        return int(self.counts.shape[1])

    def lowering(self, key, build: Callable[["BlockMask"], object]):
        """``build(self)``, the backend's work form named ``key``; kept with a reused mask."""
        if not self.reused:
            return build(self)
        if key not in self._lowered:
            self._lowered[key] = build(self)
        return self._lowered[key]

    def heads(self, start: int, end: int) -> "BlockMask":
        """The mask of heads start .. end (a group run apart); a reused mask keeps the ones it
        made, and their work forms with them."""
        if (start, end) == (0, self.num_heads):
            return self
        return self.lowering(("heads", start, end), lambda m: BlockMask(
            m.layout, m.counts[:, start:end].contiguous(), m.bits[:, start:end].contiguous(), reused=m.reused))

    def density(self) -> torch.Tensor:
        """Share of visited (query block, key block) pairs, float32 (Bm, H) (no host sync)."""
        return self.counts.sum(dim=(-1, -2), dtype=torch.float32) / self.layout.n_blocks ** 2

    def to_dense(self) -> torch.Tensor:
        """bool (Bm, H, NB, NB): the visited pairs (for tests and pictures)."""
        bit = torch.arange(64, device=self.bits.device)
        dense = ((self.bits[..., None] >> bit) & 1).bool()
        return dense.flatten(-2)[..., :self.layout.n_blocks]


@dataclass(frozen=True)
class PooledBlocks:
    """Sol-Attn's pooled term for a group of heads, which the engine folds in before the
    visited blocks: ``k_mean``, ``v_mean`` (B, Hg, NB, D) in the input dtype and ``log2_len``
    float32 (NB,); the mask's ``bits`` say which blocks are left out (they are visited)."""

    k_mean: torch.Tensor
    v_mean: torch.Tensor
    log2_len: torch.Tensor


def bits_from_dense(keep: torch.Tensor) -> torch.Tensor:
    """The int64 bitmap (..., ceil(NB / 64)) of a bool (..., NB) matrix of visited pairs."""
    nb = keep.shape[-1]
    words = -(-nb // 64)
    padded = torch.zeros(*keep.shape[:-1], words * 64, dtype=torch.int64, device=keep.device)
    padded[..., :nb] = keep
    # Distinct bits: their sum is their OR (bit 63 wraps to the sign, as the router writes it).
    return (padded.view(*keep.shape[:-1], words, 64) << torch.arange(64, device=keep.device)).sum(-1)


def mask_from_dense(keep: torch.Tensor, layout: BlockLayout) -> BlockMask:
    """The reused :class:`BlockMask` of a bool (Bm, H, NB, NB) matrix of visited pairs (host
    work)."""
    if keep.dtype != torch.bool or keep.dim() != 4 or keep.shape[-2:] != (layout.n_blocks, layout.n_blocks):
        raise ValueError(f"keep must be a bool tensor (Bm, H, NB, NB) with NB = {layout.n_blocks}, "
                         f"got {keep.dtype} {tuple(keep.shape)}")
    keep = keep.cpu()
    ng = layout.n_grid_blocks
    counts = torch.stack([keep[..., :ng].sum(-1), keep[..., ng:].sum(-1)], dim=-1).to(torch.int32)
    dev = layout.device
    return BlockMask(layout, counts.to(dev).contiguous(), bits_from_dense(keep).to(dev).contiguous(), reused=True)

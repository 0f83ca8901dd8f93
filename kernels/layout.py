"""Tile-major token layouts of a video latent grid (the blocks of ``block_mask.BlockLayout``).

The video tokens of a DiT come in row-major grid order: token ``(t, h, w)`` of a grid
``(T, H, W)`` has index ``(t * H + h) * W + w``. Block-sparse kernels want every tile of
``bt × bh × bw`` tokens (a PSABlock) to be contiguous, so the sequence is permuted into
*tile-major* order:

* blocks in row-major order over the block grid ``(nT, nH, nW) = ceil((T, H, W) / tile)``,
  block ``b = (bt_idx * nH + bh_idx) * nW + bw_idx``;
* inside a block, its real tokens in local row-major (t, h, w) order.

Every block owns ``block_tokens = bt*bh*bw`` slots (3D padding), the blocked sequence has
``n_blocks * block_tokens`` slots. A block on the far edge of an axis that does
not divide by the tile is short; its real tokens come first and its padding slots last, so
every block is "a valid prefix of length ``block_lengths[b]``" and a kernel masks it exactly
like a ragged tail. Example, grid (1, 3, 3), tile (1, 2, 2) -> block grid (1, 2, 2)::

    grid tokens        blocks            blocked sequence (perm), 4 slots per block
    0 1 2              A A | B           A: 0 1 3 4    B: 2 5 . .
    3 4 5              A A | B           C: 6 7 . .    D: 8 . . .
    6 7 8              C C | D           ('.' = padding slot, perm = -1)

Tokens after the grid (HunyuanVideo's text tokens) are not part of any layout; the
``extra_tokens`` argument of :meth:`TileLayout.to_blocks` / :meth:`TileLayout.from_blocks`
leaves them at the end of the sequence, untouched.

Layouts are small integer tensors and are cached per (grid, tile, device) by
:func:`tile_layout`. The kernels never permute q/k/v: they read them in place through
``perm`` (``block_mask.BlockLayout.row_map``); :meth:`TileLayout.to_blocks` and
:meth:`TileLayout.from_blocks` make permuted copies for references, tests and benchmarks.

Limits, checked before anything is allocated (a layout holds int64 tensors of the padded
grid, so an absurd tile on a small video would otherwise ask for gigabytes). They come from
real video latents: Wan 2.1 720p is 21 × 45 × 80 tokens, HunyuanVideo 720p 33 × 45 × 80; even
4K frames (8× VAE, 2 × 2 patches) are 135 × 240.

* grid: every axis in [1, ``MAX_GRID_AXIS``], at most ``MAX_GRID_TOKENS`` tokens;
* tile: every axis in [1, ``MAX_TILE_AXIS``], at most ``MAX_TILE_TOKENS`` tokens (the
  shipped PSA tiles hold 64-384, Sol's 64-token blocks 64);
* grid and tile together (:func:`check_padding`): the padded grid holds at most
  ``MAX_PADDING_FACTOR`` slots per real token, or one tile's worth (``MAX_TILE_TOKENS``) for
  tiny grids. A tile no larger than the grid on every axis always passes (each axis pads by
  less than 2×).
"""
from __future__ import annotations

import functools

import torch

from ._checks import check_int, shown
from ._device import cache_device

__all__ = [
    "TileLayout", "tile_layout", "check_grid", "check_tile", "check_padding", "tokens_to_front", "tokens_back",
    "MAX_GRID_AXIS", "MAX_GRID_TOKENS", "MAX_TILE_AXIS", "MAX_TILE_TOKENS", "MAX_PADDING_FACTOR",
]

MAX_GRID_AXIS = 1024
MAX_GRID_TOKENS = 1 << 22
MAX_TILE_AXIS = 256
MAX_TILE_TOKENS = 4096
MAX_PADDING_FACTOR = 8


def _check_triple(value, name: str, max_axis: int, max_tokens: int, kind: str) -> tuple[int, int, int]:
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be three positive integers (t, h, w), got {shown(value)}") from None
    if len(items) != 3:
        raise ValueError(f"{name} must be three positive integers (t, h, w), got {shown(value)}")
    t, h, w = (check_int(x, f"{name}.{axis}", 1, max_axis) for axis, x in zip("thw", items))
    if t * h * w > max_tokens:
        raise ValueError(f"{name} {(t, h, w)} has {t * h * w} tokens, more than the {max_tokens} a {kind} may have")
    return t, h, w


def check_grid(grid, name: str = "grid") -> tuple[int, int, int]:
    """Validate a video grid ``(T, H, W)`` of tokens (module limits); return it as ints."""
    return _check_triple(grid, name, MAX_GRID_AXIS, MAX_GRID_TOKENS, "video grid")


def check_tile(tile, name: str = "tile") -> tuple[int, int, int]:
    """Validate a tile ``(bt, bh, bw)`` of tokens (module limits); return it as ints."""
    return _check_triple(tile, name, MAX_TILE_AXIS, MAX_TILE_TOKENS, "tile")


def check_padding(grid, tile, name: str = "tile") -> None:
    """Refuse a tile that pads ``grid`` beyond the module limit (``name`` is the tile's)."""
    tokens = grid[0] * grid[1] * grid[2]
    slots = 1
    for g, b in zip(grid, tile):
        slots *= -(-g // b) * b
    if slots > max(MAX_PADDING_FACTOR * tokens, MAX_TILE_TOKENS):
        raise ValueError(
            f"{name} {tuple(tile)} pads the grid {tuple(grid)} ({tokens} tokens) to {slots} slots, more than "
            f"{MAX_PADDING_FACTOR}x; use a tile no larger than the grid on each axis")


class TileLayout:
    """Permutation between row-major grid order and tile-major (blocked) order.

    Attributes (all tensors on ``device``):

    ``grid``, ``tile``          the token grid (T, H, W) and the tile (bt, bh, bw)
    ``block_grid``              (nT, nH, nW) = ceil(grid / tile)
    ``n_blocks``, ``block_tokens``
    ``n_tokens``                T*H*W, the real tokens
    ``perm``  (int64, n_slots)  for every slot of the blocked sequence, its grid token, or -1
                                for a padding slot
    ``inverse`` (int64, n_tokens) for every grid token, its slot
    ``block_lengths`` (int32, n_blocks) real tokens per block
    ``n_slots``                 length of the blocked sequence
    """

    def __init__(self, grid, tile, device="cpu"):
        self.grid = check_grid(grid)
        self.tile = check_tile(tile)
        check_padding(self.grid, self.tile)
        self.device = torch.device(device)
        T, H, W = self.grid
        bt, bh, bw = self.tile
        nT, nH, nW = -(-T // bt), -(-H // bh), -(-W // bw)
        self.block_grid = (nT, nH, nW)
        self.n_blocks = nT * nH * nW
        self.block_tokens = bt * bh * bw
        self.n_tokens = T * H * W

        # Token index of every position of the padded grid, -1 in the padding.
        idx = torch.full((nT * bt, nH * bh, nW * bw), -1, dtype=torch.int64)
        idx[:T, :H, :W] = torch.arange(self.n_tokens, dtype=torch.int64).reshape(T, H, W)
        blocks = (
            idx.reshape(nT, bt, nH, bh, nW, bw)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(self.n_blocks, self.block_tokens)
        )
        # Real tokens first (their local row-major order kept), padding last: a stable sort
        # on the "is padding" flag.
        order = torch.sort((blocks < 0).to(torch.int8), dim=1, stable=True).indices
        blocks = torch.gather(blocks, 1, order)
        lengths = (blocks >= 0).sum(dim=1)
        perm = blocks.reshape(-1)
        inverse = torch.empty(self.n_tokens, dtype=torch.int64)
        slots = torch.nonzero(perm >= 0).squeeze(1)
        inverse[perm[slots]] = slots

        self.n_slots = int(perm.numel())
        self.perm = perm.to(self.device)
        self.inverse = inverse.to(self.device)
        self.block_lengths = lengths.to(torch.int32).to(self.device)

    # ------------------------------------------------------------------ helpers
    @property
    def padded_grid(self) -> tuple[int, int, int]:
        """The grid rounded up to whole tiles (the 3D padding of the paper)."""
        return tuple(n * b for n, b in zip(self.block_grid, self.tile))

    @property
    def padding_fraction(self) -> float:
        """Padding slots / real tokens."""
        return (self.n_slots - self.n_tokens) / self.n_tokens

    def block_of_token(self) -> torch.Tensor:
        """Block index (int64, n_tokens) of every grid token, in grid order."""
        T, H, W = self.grid
        bt, bh, bw = self.tile
        _, nH, nW = self.block_grid
        t = torch.arange(T, device=self.device) // bt
        h = torch.arange(H, device=self.device) // bh
        w = torch.arange(W, device=self.device) // bw
        return ((t[:, None, None] * nH + h[None, :, None]) * nW + w[None, None, :]).reshape(-1)

    def _split(self, x: torch.Tensor, dim: int, extra_tokens: int, expected: int, what: str):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        dim = dim % x.dim()
        extra_tokens = int(extra_tokens)
        if extra_tokens < 0:
            raise ValueError(f"extra_tokens must be >= 0, got {extra_tokens}")
        if x.shape[dim] != expected + extra_tokens:
            raise ValueError(
                f"x has {x.shape[dim]} tokens along dim {dim}, expected {what} {expected} "
                f"+ extra_tokens {extra_tokens} = {expected + extra_tokens}"
            )
        return dim, x.narrow(dim, 0, expected), x.narrow(dim, expected, extra_tokens)

    def to_blocks(self, x: torch.Tensor, dim: int = 1, extra_tokens: int = 0) -> torch.Tensor:
        """Grid order -> blocked order along ``dim``; padding slots are zero.

        The first ``n_tokens`` entries along ``dim`` are the grid tokens; ``extra_tokens``
        further entries are appended after the blocked sequence unchanged.
        """
        dim, grid_part, extra = self._split(x, dim, extra_tokens, self.n_tokens, "grid tokens")
        perm = self.perm.to(x.device)
        src = perm.clamp_min(0)
        out = grid_part.index_select(dim, src)
        if self.n_slots != self.n_tokens:
            # Padding slots were gathered from token 0; zero them (torch.where, not a
            # multiply, so a non-finite token 0 cannot leak into the padding).
            shape = [1] * x.dim()
            shape[dim] = self.n_slots
            out = torch.where((perm >= 0).reshape(shape), out, out.new_zeros(()))
        return torch.cat([out, extra], dim=dim) if extra_tokens else out

    def from_blocks(self, y: torch.Tensor, dim: int = 1, extra_tokens: int = 0) -> torch.Tensor:
        """Blocked order -> grid order along ``dim``; padding slots are dropped."""
        dim, blocked, extra = self._split(y, dim, extra_tokens, self.n_slots, "blocked slots")
        out = blocked.index_select(dim, self.inverse.to(y.device))
        return torch.cat([out, extra], dim=dim) if extra_tokens else out

    def __repr__(self) -> str:
        return (
            f"TileLayout(grid={self.grid}, tile={self.tile}, "
            f"block_grid={self.block_grid}, n_blocks={self.n_blocks}, "
            f"slots={self.n_slots}, padding={100 * self.padding_fraction:.1f}%, device={self.device})"
        )


@functools.lru_cache(maxsize=64)
def _cached_layout(grid, tile, device_str):
    return TileLayout(grid, tile, device_str)


def tile_layout(grid, tile, device="cpu") -> TileLayout:
    """The :class:`TileLayout` for (grid, tile, device), built once and cached.

    The cached object is shared: treat its tensors as read-only.
    """
    return _cached_layout(check_grid(grid), check_tile(tile), str(cache_device(device)))


def tokens_to_front(x: torch.Tensor, start: int, count: int, dim: int = 1) -> torch.Tensor:
    """``x`` with its ``count`` tokens from ``start`` along ``dim`` moved to the front and the
    others after them, in their order: the kernels take the grid's tokens first, and ComfyUI
    0.33 hands HunyuanVideo's text over before its video. ``x`` itself when ``start`` is 0,
    else a copy (contiguous: reorder a (B, H, L, D) tensor along dim 2 to keep heads first)."""
    if start == 0:
        return x
    end = start + count
    return _pieces_joined(x, ((start, count), (0, start), (end, x.shape[dim] - end)), dim)


def tokens_back(x: torch.Tensor, start: int, count: int, dim: int = 1) -> torch.Tensor:
    """The inverse of :func:`tokens_to_front`."""
    if start == 0:
        return x
    after = count + start
    return _pieces_joined(x, ((count, start), (0, count), (after, x.shape[dim] - after)), dim)


def _pieces_joined(x: torch.Tensor, pieces, dim: int) -> torch.Tensor:
    """A contiguous copy of ``x`` whose axis ``dim`` holds its (start, length) ``pieces`` in
    turn, one strided copy per piece. ``torch.cat`` of pieces that are not contiguous
    themselves (a token range of a heads-first tensor) took 2.7 times as long: 6.61 against
    2.45 ms for HunyuanVideo 720p's q, k and v on the H200."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    at = 0
    for start, length in pieces:
        out.narrow(dim, at, length).copy_(x.narrow(dim, start, length))
        at += length
    return out

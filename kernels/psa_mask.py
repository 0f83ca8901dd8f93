"""PSA stripe masks: THE definition of M(Tw, To, Ts, Sw, So, Ss).

Where the mask lives
--------------------
The mask is a boolean matrix over PSABlocks. A video grid (T, H, W) of tokens cut into tiles
(bt, bh, bw) has the padded block grid (nT, nH, nW) = ceil((T, H, W) / tile); block
(t, h, w) has the number ``(t * nH + h) * nW + w`` (row-major over block coordinates, the
order of :mod:`kernels.layout`). For a query block (tq, hq, wq) and a key block
(tk, hk, wk) write

    dt = tk - tq                       inter-frame distance, in block-frames
    dh = hk - hq,  dw = wk - wq        intra-frame displacement, in block rows / columns
    ds = dh * nW + dw                  the same, flattened row-major (the paper's heatmaps)

Parameters
----------
One integer row per head, in the order (Tw, To, Ts, Sw, So, Ss); all counts are in blocks.

* widths ``Tw, Sw >= 1``. A width w keeps distances up to w - 1 from a diagonal (it is
  *not* a half-width: w = 1 is the diagonal alone, w = 2 adds the two neighbours).
* offsets ``To, So``: any integer; they shift the main diagonal (positive: keys later in
  time / further along the flattened frame than the query).
* strides ``Ts, Ss >= 0``: the period of repeated diagonals. ``0`` encodes ∞ (one
  diagonal). Repeats are taken for the n with ``|n * stride| <= L - 1``, L the axis length in
  blocks (nT for Ts, nH * nW for Ss), so every stride ``>= L`` is exactly ∞ — the paper's
  "Ts = ∞ ⇔ Ts ≥ T, Ss = ∞ ⇔ Ss ≥ H×W".

Inter-frame condition. The diagonals are ``D = To + n * Ts``; dt is kept iff
``|dt - D| <= Tw - 1`` for one of them.

Intra-frame condition. The diagonals ``D = So + n * Ss`` count flattened blocks, as in the
paper's heatmap. Each D is read as the 2D block displacement nearest to it,
``Dh = round(D / nW)`` (ties toward the query's own row) and ``Dw = D - Dh * nW``
(|Dw| <= nW / 2). A key is kept iff for one of them

    |ds - D| <= Sw - 1        (flattened distance to the diagonal: the heatmap's band)
    |dw - Dw| <= Sw - 1       (column distance: a band never wraps around the frame edge)

Both conditions depend on the displacement (dh, dw) only, so a mask is translation
invariant, like the relative positions of 3D RoPE that cause the stripes: the mask of a pair
depends on (dt, dh, dw) alone, near an edge the band is cut, never wrapped to the other side
of the frame. For Sw <= ceil(nW / 2) the two conditions say: same row as the diagonal
(dh = Dh) and |dw - Dw| <= Sw - 1; wider bands also reach into neighbouring rows the way a
flattened band does (``|ds - D| <= Sw - 1``), without its wrap-around.

A pair is kept iff the inter-frame AND the intra-frame conditions hold, **or it is the
query's own block**. Why the own block: every query row then has at least one key block
(with an offset, e.g. To = 2, the last frames would otherwise have none and softmax would
divide by zero), the own block holds the query token itself and is by locality the
strongest one, and it costs at most one block per row. Every block of the padded grid holds
at least one real token, so no row is all padding.

Drawn examples (``#`` kept, ``.`` dropped, ``Q`` the query block)
------------------------------------------------------------------
Inter-frame band on 6 block-frames (grid (6, 1, 1), tile 1): width 2 around the diagonal,
and width 1 with offset 1 and stride 3 (diagonals at dt = -2, 1, 4; the query's own block
is added on the main diagonal):

>>> print(psa_mask((6, 1, 1), [[2, 0, 0, 1, 0, 0], [1, 1, 3, 1, 0, 0]], (1, 1, 1)).picture())
head 0: M(2,0,∞,1,0,∞) on block grid (6, 1, 1), density 0.444
##....
###...
.###..
..###.
...###
....##
head 1: M(1,1,3,1,0,∞) on block grid (6, 1, 1), density 0.472
##..#.
.##..#
#.##..
.#.##.
..#.##
...#.#

Intra-frame, one frame of 4 × 5 blocks, for a query block (``query=(t, h, w)``). Width 2,
one diagonal: the row neighbours; at the right edge the band is cut, it does not continue at
the start of the next row (as the raw flattened band |ds| <= 1 would):

>>> m = psa_mask((1, 4, 5), [[1, 0, 0, 2, 0, 0]], (1, 1, 1))
>>> print(m.picture(query=(0, 1, 2)))
head 0: M(1,0,∞,2,0,∞), query block (0, 1, 2)
dt=+0
.....
.#Q#.
.....
.....
>>> print(m.picture(query=(0, 1, 4)))
head 0: M(1,0,∞,2,0,∞), query block (0, 1, 4)
dt=+0
.....
...#Q
.....
.....

Stride = nW repeats the diagonal once per block row: a column band over the full height,
not cyclic in w (this is the STA window, below). Offset 1 shifts it one column right:

>>> print(psa_mask((1, 4, 5), [[1, 0, 0, 2, 0, 5], [1, 0, 0, 1, 1, 5]], (1, 1, 1)).picture(query=(0, 1, 4)))
head 0: M(1,0,∞,2,0,5), query block (0, 1, 4)
dt=+0
...##
...#Q
...##
...##
head 1: M(1,0,∞,1,1,5), query block (0, 1, 4)
dt=+0
.....
....Q
.....
.....

Stride 3 on a 5-wide frame: flattened diagonals at 0, ±3, ±6, ... land at the 2D
displacements (0, 0), (1, -2), (1, 1), (2, -1), (2, 2), (3, 0), ... and their mirrors:

>>> print(psa_mask((1, 4, 5), [[1, 0, 0, 1, 0, 3]], (1, 1, 1)).picture(query=(0, 1, 2)))
head 0: M(1,0,∞,1,0,3), query block (0, 1, 2)
dt=+0
.#..#
..Q..
#..#.
.#..#

A width above nW / 2 reaches into the neighbouring rows like the flattened band
|ds| <= Sw - 1 (here |ds| <= 3), minus the part that would wrap around the edge: the
flattened band of query block (1, 4) also holds block (2, 0), 4 columns away:

>>> print(psa_mask((1, 4, 5), [[1, 0, 0, 4, 0, 0]], (1, 1, 1)).picture(query=(0, 1, 4)))
head 0: M(1,0,∞,4,0,∞), query block (0, 1, 4)
dt=+0
.....
.###Q
.##..
.....

Both conditions together (3 frames, 3 × 3 blocks each): frames within 1, and the 2 × 3
neighbourhood-in-row of the query in each of them:

>>> print(psa_mask((3, 3, 3), [[2, 0, 0, 2, 0, 0]], (1, 1, 1)).picture(query=(1, 1, 0)))
head 0: M(2,0,∞,2,0,∞), query block (1, 1, 0)
dt=-1 dt=+0 dt=+1
...   ...   ...
##.   Q#.   ##.
...   ...   ...

The special cases of the paper
------------------------------
* SVG, spatial head ``M(Tw, 0, ∞, nH*nW, 0, ∞)``: every block of the frames within
  Tw - 1 of the query's frame (any Sw >= nH * nW).
* SVG, temporal head ``M(nT, 0, ∞, Sw, 0, ∞)``: all frames, the query's own spatial block
  (Sw = 1) or its row neighbourhood |dw| <= Sw - 1 (Sw <= ceil(nW / 2)).
* STA's sliding tile window ``M(Tw, 0, ∞, Sw, 0, nW)``: exactly the 3D box |dt| <= Tw - 1,
  |dw| <= Sw - 1, any dh (full frame height), cut at the grid's edges, not cyclic. With
  Ss = ∞ instead (and Sw <= ceil(nW / 2)) the box is one block row high. STA windows of an
  intermediate height are not of the form M(...): a stride repeats a diagonal over the whole
  frame and no parameter counts repetitions; a search then picks the nearest M.
* Dense: ``Tw >= nT`` and ``Sw >= nH * nW`` with zero offsets (strides do not matter).
These are tested in ``tests/kernels/test_psa_mask.py``.

What this reading gives up, on purpose: a flattened diagonal D is kept only at its nearest
2D displacement, never at the far one that wraps from one edge of the frame to the other
(D = 1 is "the next block in the row", not also "first block of the next row" for a query
in the last column). So Ss = 1 is not "every pair": it keeps the displacements with
|dw| <= nW / 2 in every row; an intra-frame uniform head is ``Sw >= nH * nW``. A purely
flattened reading (pairs with |ds - D| <= Sw - 1 for any D, the raw heatmap) would make
STA's window cyclic in w and spend blocks on pairs nW - 1 columns apart.

API
---
``psa_block_mask(grid, params, tile)``  -> bool (H, n_blocks, n_blocks), the mask itself.
``psa_mask(grid, params, tile)``        -> :class:`PSAMask`, the inspectable object
                                           (density per head, pictures).
``psa_kernel_mask(grid, params, tile, extra_tokens, device)`` -> ``block_mask.BlockMask``: the
    compact form the engine consumes (every query block's key blocks, the extra-token blocks
    attended both ways), cached per (grid, tile, params, extra tokens, device).
``check_params(params, num_heads=None)`` -> int64 (H, 6) CPU tensor, or ValueError naming
    the head and the field.
``check_mask_size(block_grid, count)`` -> ValueError when ``count`` masks (heads, or
    candidates of a search) on ``block_grid`` would exceed the size limits below.

Size limits
-----------
A mask is a dense bool matrix over block pairs, so its size grows with the square of the
block count. Every function here that builds one refuses, before allocating, a block grid of
more than ``MAX_MASK_BLOCKS`` blocks or more than ``MAX_MASK_ENTRIES`` (heads × blocks²)
entries. Real block grids are far below: Wan 2.1 720p with tile 3 × 8 × 16 has 210 blocks,
HunyuanVideo 720p 330; 40 heads of 330 blocks are 4.4 M entries, and a full PSA-Search on
that grid (4096 candidates) 446 M. Large intermediates are built one head at a time, so the
peak memory stays near the bool mask itself (one byte per entry).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ._checks import check_int
from ._device import cache_device
from .block_mask import block_layout, mask_from_dense
from .layout import check_grid, check_tile

__all__ = [
    "FIELDS",
    "MAX_PARAM",
    "INF",
    "check_params",
    "check_mask_size",
    "MAX_MASK_BLOCKS",
    "MAX_MASK_ENTRIES",
    "format_params",
    "block_grid_of",
    "inter_frame_table",
    "intra_frame_table",
    "psa_block_mask",
    "psa_mask",
    "psa_kernel_mask",
    "PSAMask",
]

FIELDS = ("Tw", "To", "Ts", "Sw", "So", "Ss")
INF = 0  # the stride value that encodes ∞
MAX_PARAM = 1 << 20  # |value| bound for every field; far beyond any real block grid
MAX_MASK_BLOCKS = 2048
MAX_MASK_ENTRIES = 1 << 29


def check_mask_size(block_grid, count: int, what: str = "mask") -> None:
    """Refuse ``count`` masks (heads or candidates) on ``block_grid`` beyond the size limits
    of the module docstring; ``what`` names the caller's object in the message."""
    n = math.prod(block_grid)
    if n > MAX_MASK_BLOCKS:
        raise ValueError(f"{what}: block grid {tuple(block_grid)} has {n} blocks, more than the "
                         f"{MAX_MASK_BLOCKS} a PSA mask may have; use a larger tile")
    if count * n * n > MAX_MASK_ENTRIES:
        raise ValueError(f"{what}: {count} masks on block grid {tuple(block_grid)} ({n} blocks) hold "
                         f"{count * n * n} block pairs, more than {MAX_MASK_ENTRIES}; use a larger tile "
                         "or fewer heads/candidates")


# --------------------------------------------------------------------------- validation
def check_params(params, num_heads: int | None = None) -> torch.Tensor:
    """Validate per-head parameters; return them as an int64 (H, 6) CPU tensor.

    Accepts an integer torch tensor, an integer numpy array or nested lists of ints of
    shape (H, 6) in the order (Tw, To, Ts, Sw, So, Ss). Raises ValueError naming the head
    and the field, e.g. ``params[3].Sw = 0: widths must be >= 1``.
    """
    if isinstance(params, np.ndarray):
        if params.dtype == np.bool_ or not np.issubdtype(params.dtype, np.integer):
            raise ValueError(f"params must hold integers, got numpy dtype {params.dtype}")
        params = torch.from_numpy(params.astype(np.int64))
    elif not isinstance(params, torch.Tensor):
        try:
            params = torch.tensor(params)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"params must be an integer tensor of shape (H, 6), got {type(params).__name__}: {e}") from None
    if params.dtype == torch.bool or params.is_floating_point() or params.is_complex():
        raise ValueError(
            f"params must be an integer tensor (Tw, To, Ts, Sw, So, Ss per head), got dtype {params.dtype}"
        )
    if params.dim() != 2 or params.shape[1] != 6 or params.shape[0] < 1:
        raise ValueError(
            f"params must have shape (H, 6) with columns (Tw, To, Ts, Sw, So, Ss), got {tuple(params.shape)}"
        )
    if num_heads is not None and params.shape[0] != num_heads:
        raise ValueError(f"params has {params.shape[0]} rows but the input has {num_heads} heads")
    p = params.detach().to("cpu", torch.int64)
    for h, row in enumerate(p.tolist()):
        for field, value in zip(FIELDS, row):
            if abs(value) > MAX_PARAM:
                raise ValueError(f"params[{h}].{field} = {value}: |value| must be <= {MAX_PARAM}")
            if field in ("Tw", "Sw") and value < 1:
                raise ValueError(f"params[{h}].{field} = {value}: widths must be >= 1")
            if field in ("Ts", "Ss") and value < 0:
                raise ValueError(f"params[{h}].{field} = {value}: strides must be >= 0 (0 means ∞)")
    return p.contiguous()


def format_params(row) -> str:
    """``M(Tw,To,Ts,Sw,So,Ss)`` with ∞ for a zero stride."""
    vals = [int(x) for x in row]
    shown = [("∞" if (f in ("Ts", "Ss") and v == 0) else str(v)) for f, v in zip(FIELDS, vals)]
    return "M(" + ",".join(shown) + ")"


def block_grid_of(grid, tile) -> tuple[int, int, int]:
    """(nT, nH, nW) = ceil(grid / tile)."""
    grid, tile = check_grid(grid), check_tile(tile)
    return tuple(-(-a // b) for a, b in zip(grid, tile))


# --------------------------------------------------------------------------- semantics
def _repeats(stride: int, length: int) -> np.ndarray:
    """The n of the repeated diagonals: |n * stride| <= length - 1 (n = 0 only for ∞)."""
    if stride == 0 or stride >= length:
        return np.zeros(1, dtype=np.int64)
    n = (length - 1) // stride
    return np.arange(-n, n + 1, dtype=np.int64)


@functools.lru_cache(maxsize=4096)
def inter_frame_table(nT: int, Tw: int, To: int, Ts: int) -> np.ndarray:
    """Kept inter-frame distances: bool (2*nT - 1,), entry i is dt = i - (nT - 1)."""
    dt = np.arange(-(nT - 1), nT, dtype=np.int64)
    diag = To + _repeats(Ts, nT) * Ts
    keep = (np.abs(dt[:, None] - diag[None, :]) <= Tw - 1).any(axis=1)
    keep.flags.writeable = False
    return keep


def _split_flat(D: np.ndarray, nW: int) -> tuple[np.ndarray, np.ndarray]:
    """Nearest 2D displacement (Dh, Dw) of a flattened one, ties toward row 0."""
    half = (nW + 1) // 2 - 1
    Dh = np.sign(D) * ((np.abs(D) + half) // nW)
    return Dh, D - Dh * nW


@functools.lru_cache(maxsize=4096)
def intra_frame_table(nH: int, nW: int, Sw: int, So: int, Ss: int) -> np.ndarray:
    """Kept intra-frame displacements: bool (2*nH - 1, 2*nW - 1), entry [i, j] is
    (dh, dw) = (i - (nH - 1), j - (nW - 1))."""
    L = nH * nW
    dh = np.arange(-(nH - 1), nH, dtype=np.int64)[:, None]
    dw = np.arange(-(nW - 1), nW, dtype=np.int64)[None, :]
    ds = dh * nW + dw
    diag = So + _repeats(Ss, L) * Ss
    # Diagonals further than the width from every reachable ds cannot keep anything.
    diag = diag[np.abs(diag) <= (L - 1) + (Sw - 1)]
    Dh, Dw = _split_flat(diag, nW)
    keep = np.zeros(ds.shape, dtype=bool)
    chunk = max(1, (1 << 22) // ds.size)
    for i in range(0, diag.size, chunk):
        d = diag[i:i + chunk, None, None]
        c = Dw[i:i + chunk, None, None]
        keep |= ((np.abs(ds[None] - d) <= Sw - 1) & (np.abs(dw[None] - c) <= Sw - 1)).any(axis=0)
    keep.flags.writeable = False
    return keep


def _tables(block_grid, params: torch.Tensor):
    nT, nH, nW = block_grid
    rows = params.tolist()
    t_tab = np.stack([inter_frame_table(nT, r[0], r[1], r[2]) for r in rows])
    s_tab = np.stack([intra_frame_table(nH, nW, r[3], r[4], r[5]) for r in rows])
    return torch.from_numpy(t_tab), torch.from_numpy(s_tab)


def _build_mask(block_grid, params: torch.Tensor) -> torch.Tensor:
    nT, nH, nW = block_grid
    check_mask_size(block_grid, params.shape[0])
    t_tab, s_tab = _tables(block_grid, params)
    # Blocks are numbered (t, s) with s = h * nW + w, so the mask is the outer AND of a
    # frame term (H, nT, nT) and an in-frame term (H, S, S): no index tensor of n² entries.
    t = torch.arange(nT)
    h = torch.arange(nH).repeat_interleave(nW)
    w = torch.arange(nW).repeat(nH)
    frames = t_tab[:, t[None, :] - t[:, None] + (nT - 1)]
    spatial = s_tab[:, h[None, :] - h[:, None] + (nH - 1), w[None, :] - w[:, None] + (nW - 1)]
    n = nT * nH * nW
    mask = (frames[:, :, None, :, None] & spatial[:, None, :, None, :]).reshape(-1, n, n)
    mask.diagonal(dim1=1, dim2=2).fill_(True)
    return mask


# --------------------------------------------------------------------------- public API
def psa_block_mask(grid, params, tile) -> torch.Tensor:
    """The PSA mask: bool (H, n_blocks, n_blocks) on the padded block grid (CPU).

    ``mask[h, q, k]`` says whether query block q visits key block k; blocks are numbered
    row-major over (t, h, w) block coordinates. See the module docstring for the semantics.
    """
    grid, tile = check_grid(grid), check_tile(tile)
    return _build_mask(block_grid_of(grid, tile), check_params(params))


def psa_mask(grid, params, tile) -> "PSAMask":
    """The inspectable :class:`PSAMask` of (grid, params, tile)."""
    return PSAMask(grid, params, tile)


# One entry per distinct (grid, per-layer params): a preset gives every layer its own masks,
# so the cache must hold all layers of the deepest model (HunyuanVideo: 60 blocks). With 32
# entries the 40 Wan / 60 HunyuanVideo layers evicted each other and every call rebuilt its
# mask on the CPU (8 / 38 ms per call on the H200).
KERNEL_MASK_CACHE_LAYERS = 128


@functools.lru_cache(maxsize=KERNEL_MASK_CACHE_LAYERS)
def _cached_kernel_mask(grid, tile, params_bytes, num_heads, extra_tokens, device_str):
    params = torch.frombuffer(bytearray(params_bytes), dtype=torch.int64).reshape(num_heads, 6)
    layout = block_layout(grid, tile, extra_tokens, device_str)
    nb, ng = layout.n_blocks, layout.n_grid_blocks
    keep = torch.ones(1, num_heads, nb, nb, dtype=torch.bool)
    keep[0, :, :ng, :ng] = _build_mask(layout.block_grid, params)
    return mask_from_dense(keep, layout)


def psa_kernel_mask(grid, params, tile, extra_tokens: int = 0, device="cpu"):
    """The engine's ``BlockMask`` of a PSA call, cached: grid blocks by the stripe mask, the
    blocks of the ``extra_tokens`` after the grid attended by and attending to every block.
    The mask is reused: the engine keeps its work forms with it. The cached tensors are shared:
    do not modify them."""
    grid, tile = check_grid(grid), check_tile(tile)
    p = check_params(params)
    extra_tokens = check_int(extra_tokens, "extra_tokens", 0)
    return _cached_kernel_mask(grid, tile, p.numpy().tobytes(), p.shape[0], extra_tokens,
                               str(cache_device(device)))


class PSAMask:
    """A PSA stripe mask you can build, print, test and draw without running attention.

    ``mask`` is the bool (H, n_blocks, n_blocks) matrix of :func:`psa_block_mask`;
    :meth:`density` the share of kept pairs per head; :meth:`picture` an ASCII view;
    ``psa_kernel_mask`` gives the kernel's compact form.
    """

    def __init__(self, grid, params, tile):
        self.grid = check_grid(grid)
        self.tile = check_tile(tile)
        self.params = check_params(params)
        self.block_grid = block_grid_of(self.grid, self.tile)
        self.num_heads = self.params.shape[0]
        self.n_blocks = math.prod(self.block_grid)
        self._mask = None

    @property
    def mask(self) -> torch.Tensor:
        if self._mask is None:
            self._mask = _build_mask(self.block_grid, self.params)
        return self._mask

    def block_lengths(self) -> torch.Tensor:
        """Real tokens per block (int64, n_blocks), padding excluded."""
        lengths = []
        for n_ax, g, b in zip(self.block_grid, self.grid, self.tile):
            ln = torch.full((n_ax,), b, dtype=torch.int64)
            ln[-1] = g - (n_ax - 1) * b
            lengths.append(ln)
        lt, lh, lw = lengths
        return (lt[:, None, None] * lh[None, :, None] * lw[None, None, :]).reshape(-1)

    def density(self, tokens: bool = False) -> torch.Tensor:
        """Share of kept (query, key) pairs per head, float64 (H,).

        ``tokens=False``: over block pairs of the padded grid (the kernel's work);
        ``tokens=True``: over pairs of real tokens (padding excluded).
        """
        m = self.mask
        if not tokens:
            return m.sum(dim=(1, 2)).double() / (self.n_blocks * self.n_blocks)
        ln = self.block_lengths().double()
        # Head by head: a float64 copy of every mask would be 8 bytes per block pair.
        kept = torch.stack([(mh.double() @ ln) @ ln for mh in m])
        return kept / (ln.sum() ** 2)

    def sparsity(self, tokens: bool = False) -> torch.Tensor:
        return 1.0 - self.density(tokens)

    def stencil(self, head: int) -> torch.Tensor:
        """bool (2nT-1, 2nH-1, 2nW-1): kept (dt, dh, dw), indexed from -(n-1) (own block
        excluded, it is always kept)."""
        nT, nH, nW = self.block_grid
        r = self.params[head].tolist()
        t = torch.from_numpy(inter_frame_table(nT, r[0], r[1], r[2]).copy())
        s = torch.from_numpy(intra_frame_table(nH, nW, r[3], r[4], r[5]).copy())
        return t[:, None, None] & s[None]

    def picture(self, head: int | None = None, query=None, max_blocks: int = 128) -> str:
        """ASCII view. Without ``query``: the block matrix (rows: query blocks, columns: key
        blocks; frames separated by a space / blank line when the frame has several blocks).
        With ``query=(t, h, w)`` (block coordinates): the key blocks of that query block,
        one nH × nW picture per key frame, ``Q`` on the query block. ``head=None``: all."""
        heads = range(self.num_heads) if head is None else [int(head)]
        nT, nH, nW = self.block_grid
        dens = self.density()
        out = []
        for h in heads:
            if not 0 <= h < self.num_heads:
                raise ValueError(f"head must be in [0, {self.num_heads}), got {h}")
            name = format_params(self.params[h])
            m = self.mask[h]
            if query is None:
                if self.n_blocks > max_blocks:
                    raise ValueError(
                        f"{self.n_blocks} blocks is too many for a matrix picture (max_blocks={max_blocks}); "
                        "pass query=(t, h, w) for one query block's picture"
                    )
                out.append(f"head {h}: {name} on block grid {self.block_grid}, density {float(dens[h]):.3f}")
                frame = nH * nW
                for q in range(self.n_blocks):
                    if frame > 1 and q and q % frame == 0:
                        out.append("")
                    cells = []
                    for k in range(self.n_blocks):
                        if frame > 1 and k and k % frame == 0:
                            cells.append(" ")
                        cells.append("#" if m[q, k] else ".")
                    out.append("".join(cells))
            else:
                tq, hq, wq = (int(x) for x in query)
                if not (0 <= tq < nT and 0 <= hq < nH and 0 <= wq < nW):
                    raise ValueError(f"query block {tuple(query)} is outside the block grid {self.block_grid}")
                qb = (tq * nH + hq) * nW + wq
                out.append(f"head {h}: {name}, query block {(tq, hq, wq)}")
                width = max(nW, 5)
                out.append(" ".join(f"dt={tk - tq:+d}".ljust(width) for tk in range(nT)).rstrip())
                for hk in range(nH):
                    row = []
                    for tk in range(nT):
                        cells = ""
                        for wk in range(nW):
                            kb = (tk * nH + hk) * nW + wk
                            cells += "Q" if kb == qb else ("#" if m[qb, kb] else ".")
                        row.append(cells.ljust(width))
                    out.append(" ".join(row).rstrip())
        return "\n".join(out)

    def __repr__(self) -> str:
        d = self.density()
        return (
            f"PSAMask(grid={self.grid}, tile={self.tile}, block_grid={self.block_grid}, "
            f"heads={self.num_heads}, density mean {float(d.mean()):.3f} "
            f"min {float(d.min()):.3f} max {float(d.max()):.3f})"
        )

    def describe(self) -> str:
        """One line per head: parameters, block density and token density."""
        d, dt = self.density(), self.density(tokens=True)
        lines = [repr(self)]
        for h in range(self.num_heads):
            lines.append(
                f"  head {h:3d}: {format_params(self.params[h]):<24} density {float(d[h]):.3f} "
                f"(tokens {float(dt[h]):.3f})"
            )
        return "\n".join(lines)

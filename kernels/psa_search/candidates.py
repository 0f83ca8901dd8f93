"""The candidate masks of a search: stripe parameters per block grid, sampled and deduplicated."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

from .._checks import check_int
from ..layout import check_grid, check_tile
from ..psa_mask import block_grid_of, check_mask_size, check_params, inter_frame_table, intra_frame_table


def _axis_values(values, default):
    vals = default if values is None else values
    out = []
    for v in vals:
        v = int(v)
        if v not in out:
            out.append(v)
    return out


def candidate_space(
    grid,
    tile,
    *,
    Tw=None,
    To=(0, 1, -1, 2, -2),
    Ts=(1, 2, 3, 0),
    Sw=None,
    So=(0, 1, -1),
    Ss=None,
    extra=(),
    max_candidates: int | None = 128,
    seed: int = 0,
) -> torch.Tensor:
    """Candidate parameters (C, 6) int64 for a grid and tile; see the module docstring.

    ``Tw``/``Sw``/``Ss`` default to the grid-adapted C.2 ranges; any range may be replaced.
    ``extra`` rows are always included. ``max_candidates=None`` keeps every distinct mask.
    """
    grid, tile = check_grid(grid), check_tile(tile)
    if max_candidates is not None:
        max_candidates = check_int(max_candidates, "max_candidates", 1)
    seed = check_int(seed, "seed", 0)
    nT, nH, nW = block_grid_of(grid, tile)
    check_mask_size((nT, nH, nW), 1, "candidate space")
    L = nH * nW
    Tw = _axis_values(Tw, list(range(1, max(2, nT))) + [nT])
    Sw = _axis_values(Sw, list(range(1, max(2, nW))) + [L])
    To = _axis_values(To, None)
    So = _axis_values(So, None)
    Ts = _axis_values([t if t < nT else 0 for t in _axis_values(Ts, None)], None)
    ss_default = [1, 3, 5, 6, nW, nW + 1, 0]
    Ss = _axis_values([s if s < L else 0 for s in _axis_values(Ss, ss_default)], None)

    rows = [list(r) for r in _product(Tw, To, Ts, Sw, So, Ss)]
    dense = [nT, 0, 0, L, 0, 0]
    anchors = [[tw, 0, 0, sw, 0, ss] for tw in Tw for sw in Sw for ss in (0, nW) if ss == 0 or ss < L]
    ordered = [dense] + anchors + rows
    check_params(ordered)  # every range value must be valid
    seen, distinct = set(), []
    for i, row in enumerate(ordered):
        key = _mask_signature((nT, nH, nW), row)
        if key not in seen:
            seen.add(key)
            distinct.append(i)
    n_fixed = sum(1 for i in distinct if i < 1 + len(anchors))
    keep = distinct
    if max_candidates is not None and len(distinct) > max_candidates:
        fixed, rest = distinct[:n_fixed], distinct[n_fixed:]
        room = max(0, int(max_candidates) - len(fixed))
        picked = sorted(random.Random(seed).sample(rest, min(room, len(rest))))
        keep = fixed + picked
    out = [ordered[i] for i in keep]
    for r in check_params(list(extra)).tolist() if len(extra) else []:
        if r not in out:
            out.append(r)
    return torch.tensor(out, dtype=torch.int64)


def _mask_signature(block_grid, row):
    """Equal for two parameter rows iff their block masks are equal: the mask is
    T[dt] & S[dh, dw] on every displacement but (0, 0, 0), which is always kept."""
    nT, nH, nW = block_grid
    t = inter_frame_table(nT, row[0], row[1], row[2])
    sp = intra_frame_table(nH, nW, row[3], row[4], row[5])
    outer = t[:, None, None] & sp[None]
    outer = outer.copy()
    outer[nT - 1, nH - 1, nW - 1] = False
    return hashlib.sha1(np.packbits(outer).tobytes()).digest()


def _product(*axes):
    if not axes:
        yield ()
        return
    for head in axes[0]:
        for tail in _product(*axes[1:]):
            yield (head,) + tail

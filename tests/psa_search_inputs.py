"""Small inputs for tests of kernels.psa_search: a (3, 4, 6) token grid in (1, 2, 3) tiles,
seeded q/k/v for it, an accumulator over a few candidates, and a saved loss table rewritten
with some fields replaced (to make tables the loader must refuse)."""
from __future__ import annotations

import json

import torch

from kernels.psa_search import PSASearchAccumulator, candidate_space

GRID, TILE = (3, 4, 6), (1, 2, 3)
N = GRID[0] * GRID[1] * GRID[2]


def qkv(seed, L=N, H=2, D=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, L, H, D, generator=g) for _ in range(3)]


def accumulator(**options):
    return PSASearchAccumulator(GRID, TILE, 2, candidates=candidate_space(GRID, TILE, max_candidates=6), **options)


def rewrite(path, header=None, meta=None, tensors=None):
    """Rewrite a saved table with some header fields, metadata or tensors replaced."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(path, framework="pt") as f:
        m = dict(f.metadata())
        t = {n: f.get_tensor(n) for n in f.keys()}
    h = json.loads(m["header"])
    h.update(header or {})
    m["header"] = json.dumps(h)
    m.update(meta or {})
    t.update(tensors or {})
    save_file({n: x for n, x in t.items() if x is not None}, path, metadata={k: v for k, v in m.items() if v is not None})
    return path

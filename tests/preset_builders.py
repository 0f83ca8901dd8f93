"""Stripe-mask presets built in code for the tests.

* ``make_preset`` is a searched-looking preset for Wan2.1 14B at 720p (random but seeded
  parameters, every optional field set): the library's tests of files, JSON and fuzzing.
* ``tiny_preset`` is a preset for a tiny model of tests/comfyui_harness.py, tiles of
  ``TINY_TILE``; ``fingerprint``, ``token_grid`` and ``full_row`` give what it needs from that
  model (the node tests).
"""
from __future__ import annotations

import torch

from kernels.preset_file import Preset

TINY_TILE = (1, 2, 2)


def make_preset(layers=2, heads=3, buckets=2):
    g = torch.Generator().manual_seed(0)
    params = torch.stack([
        torch.randint(1, 5, (buckets, layers, heads), generator=g),
        torch.randint(-2, 3, (buckets, layers, heads), generator=g),
        torch.randint(0, 4, (buckets, layers, heads), generator=g),
        torch.randint(1, 5, (buckets, layers, heads), generator=g),
        torch.randint(-1, 2, (buckets, layers, heads), generator=g),
        torch.tensor([0, 1, 3, 5, 6])[torch.randint(0, 5, (buckets, layers, heads), generator=g)],
    ], dim=-1)
    return Preset(
        name="wan14b_720p_test", family="wan2.1", model_name="Wan2.1-T2V-14B",
        fingerprint={"layers": layers, "heads": heads, "head_dim": 128, "hidden_size": 5120},
        grid=(21, 48, 80), tile=(3, 8, 16), params=params, bucket_edges=[0.5][: buckets - 1],
        source="searched",
        search={"rule": "alpha", "value": 0.007, "metric": "mse", "candidates": 100, "prompts": 2,
                "query_tiles": 32, "rows_per_tile": 32},
        stats={"sparsity": 0.55, "mean_loss": 0.004, "layer_sparsity": [0.5] * layers},
        author="tester", notes="free text ✓", created="2026-11-29",
    )


def fingerprint(tiny, layers=2):
    return {"layers": layers, "heads": tiny.heads, "head_dim": tiny.head_dim,
            "hidden_size": tiny.heads * tiny.head_dim}


def token_grid(tiny):
    _, _, t, h, w = tiny.latent_shape
    return (t, h // 2, w // 2)


def tiny_preset(name, family, fp, grid, rows, edges=()):
    """rows: [bucket][layer][head] -> 6 ints (the documented Preset constructor)."""
    return Preset(name=name, family=family, model_name="tiny test model", fingerprint=fp,
                  grid=tuple(grid), tile=TINY_TILE, params=torch.tensor(rows, dtype=torch.int64),
                  bucket_edges=list(edges), source="geometry",
                  search={"rule": "geometry", "value": None, "metric": None, "candidates": 0,
                          "prompts": 0, "query_tiles": None, "rows_per_tile": None},
                  stats={"sparsity": 0.0, "mean_loss": None})


def full_row(grid):
    """The parameters of a head that attends to every key block of ``grid``."""
    nT, nH, nW = (-(-g // t) for g, t in zip(grid, TINY_TILE))
    return [nT, 0, 0, nH * nW, 0, 0]

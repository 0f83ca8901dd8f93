"""Saved q/k/v samples of attention calls (safetensors), the search's input files."""
from __future__ import annotations

import json
import math
import os

import torch

from .._checks import check_int, check_qkv, shown
from .._files import write_file
from ..layout import MAX_GRID_AXIS, check_grid
from ..preset_file import FieldChecks
from ..psa_reference import check_extra_tokens
from .loss_table import MAX_LAYERS, SAMPLE_FORMAT, read_safetensors


def estimate_sample_bytes(shape, dtype=torch.bfloat16) -> int:
    """Bytes of one saved (q, k, v) sample of ``shape`` (B, L, H, D), header included."""
    numel = math.prod(check_int(x, "shape entries", 0) for x in shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 3 * numel * itemsize + 4096


def save_qkv_sample(path, q, k, v, *, layer: int, step: float, grid, extra_tokens: int = 0) -> int:
    """Write one attention call's q, k, v (B, L, H, D) as safetensors (never through a
    symbolic link, see ``kernels._files``); returns bytes written."""
    from safetensors.torch import save_file

    B, L, H, D = check_qkv(q, k, v, for_kernel=False)
    _check_finite(q, k, v)
    grid = check_grid(grid)
    extra_tokens = check_extra_tokens(extra_tokens, L, grid)
    # the bounds read_sample_header checks, so that the sample always reads back
    layer = check_int(layer, "layer", 0, MAX_LAYERS - 1)
    step = FieldChecks.num(step, "step")
    meta = {
        "format": SAMPLE_FORMAT,
        "version": "1",
        "header": json.dumps({"grid": list(grid), "layer": layer, "step": step, "extra_tokens": extra_tokens}),
    }
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in (("q", q), ("k", k), ("v", v))}
    write_file(path, lambda tmp: save_file(tensors, tmp, metadata=meta))
    return os.path.getsize(path)


def _check_finite(q, k, v) -> None:
    """ValueError naming the first of q, k, v that holds NaN or inf: the search's losses
    (and a table holding them) would not be finite."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"tensor {name}: expected finite values (it holds NaN or inf)")


def _sample_header(f, h) -> dict:
    V = FieldChecks
    V.keys(h, "header", ("grid", "layer", "step", "extra_tokens"))
    if set(f.keys()) != {"q", "k", "v"}:
        raise ValueError(f"tensors: expected q, k, v, got {shown(sorted(f.keys()))}")
    shape = list(f.get_slice("q").get_shape())
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"tensor q: expected shape (B, L, H, D) of non-empty dimensions, got {shape}")
    return {
        "grid": check_grid([V.int_(x, f"header.grid[{i}]", 1, MAX_GRID_AXIS)
                            for i, x in enumerate(V.list_(h["grid"], "header.grid", 3))], "header.grid"),
        "layer": V.int_(h["layer"], "header.layer", 0, MAX_LAYERS - 1),
        "step": V.num(h["step"], "header.step"),
        "extra_tokens": V.int_(h["extra_tokens"], "header.extra_tokens", 0, 1 << 24),
        "shape": shape,
    }


def read_sample_header(path) -> dict:
    """The header of a sample (grid, layer, step, extra_tokens, shape of q), validated."""
    try:
        with read_safetensors(path, SAMPLE_FORMAT, 1, "PSA q/k/v sample") as (f, h):
            return _sample_header(f, h)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def load_qkv_sample(path):
    """(q, k, v, header) of a sample written by :func:`save_qkv_sample`."""
    try:
        with read_safetensors(path, SAMPLE_FORMAT, 1, "PSA q/k/v sample") as (f, h):
            h = _sample_header(f, h)
            q, k, v = (f.get_tensor(n) for n in ("q", "k", "v"))
        check_qkv(q, k, v, for_kernel=False)
        _check_finite(q, k, v)
        check_extra_tokens(h["extra_tokens"], q.shape[1], h["grid"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    return q, k, v, h

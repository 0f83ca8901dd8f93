"""Settings of one "Sparse Attention Patch": parsing and validation, no ComfyUI import.

Every error names the widget so the user can fix the node. Numbers in text widgets are
read with ASCII digits only (``widgets.parse_int``; Python's ``int`` would also read
"１" as 1), and patterns are matched in full (``re.fullmatch``: ``$`` would let a trailing
newline through). A ``sol_tile`` tile holds 64 tokens and has the limits of
``kernels.check_tile``, checked here, before any layout is built.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from ._kernels import kernels
from .widgets import parse_int

METHODS = ("sol_attn", "psa", "dense")   # methods.METHODS holds their strategies
ESTIMATORS = ("exact", "diag")
BACKENDS = ("auto", "triton", "reference")
PRESET_GRID_POLICIES = ("refuse", "rescale")  # kernels.Preset.params_for_grid
# Beside ComfyUI's own Model Sparse Attention node on the same model (dispatch.core_sparse_node):
# "defer" stands aside for the run, "share" runs the calls that node declines.
BESIDE_CORE = ("defer", "share")
# The precision of the kernels' exact blocks (kernels.PRECISIONS: auto, bf16, int8, fp8; fp8 last,
# so the options saved workflows hold keep their meaning).
PRECISIONS = tuple(kernels.PRECISIONS)
shown = kernels.shown  # an echoed value, cut short


_BLOCK_RANGE = re.compile(r"\s*(-?[0-9]{1,9})\s*(?:(?<=[0-9])\s*-\s*(-?[0-9]{1,9}))?\s*", re.ASCII)
MAX_LIST_TEXT = 1000  # characters of an index list widget (dense_blocks, the search's steps)


def parse_block_list(text: str, widget: str = "dense_blocks",
                     unit: str = "block") -> tuple[tuple[int, int], ...]:
    """Parse ``dense_blocks`` such as ``"0"``, ``"0-1,-1"`` or ``""`` into inclusive ranges
    (also the search's ``steps``: ``widget`` and ``unit`` name them in errors).

    Negative numbers count from the end (``-1`` is the last block), as in Python. A range
    ``a-b`` needs ``a`` and ``b`` of the same sign after resolving; ``"-2--1"`` is the last two.
    Ranges are resolved against the model's block count later (:func:`resolve_blocks`).
    """
    if text is None:
        return ()
    text = str(text).strip()
    if text == "" or text.lower() == "none":
        return ()
    if len(text) > MAX_LIST_TEXT:
        raise ValueError(f"{widget}: {len(text)} characters; at most {MAX_LIST_TEXT}")
    out = []
    for part in text.split(","):
        if part.strip() == "":
            continue
        # "a-b" where a and b may be negative: split on a '-' that follows a digit
        m = _BLOCK_RANGE.fullmatch(part)
        if m is None:
            raise ValueError(
                f"{widget}: cannot read {shown(part.strip())}; write {unit} indices or ranges "
                f"separated by commas, e.g. \"0\" or \"0-1,-1\" (-1 = last {unit})")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) is not None else a
        out.append((a, b))
    return tuple(out)


def resolve_blocks(ranges, total_blocks: int) -> frozenset:
    """Turn parsed ranges into a set of block indices for a model with ``total_blocks``."""
    blocks = set()
    for a, b in ranges:
        ra = a + total_blocks if a < 0 else a
        rb = b + total_blocks if b < 0 else b
        for name, v, raw in (("start", ra, a), ("end", rb, b)):
            if not 0 <= v < total_blocks:
                raise ValueError(
                    f"dense_blocks: block {raw} is out of range for a model with "
                    f"{total_blocks} blocks (valid: 0..{total_blocks - 1} or -{total_blocks}..-1)")
        if rb < ra:
            raise ValueError(f"dense_blocks: range {a}-{b} is empty (end before start)")
        blocks.update(range(ra, rb + 1))
    return frozenset(blocks)


def parse_tile(text: str, widget: str = "sol_tile") -> Optional[tuple[int, int, int]]:
    """Parse a tile widget (``sol_tile``, the search's ``tile``): ``"off"``/``""`` → None,
    ``"bt,bh,bw"`` → a 3D tile within the library's limits; errors name ``widget``."""
    if text is None:
        return None
    t = str(text).strip().lower()
    if t in ("", "off", "none", "no"):
        return None
    parts = [p for p in re.split(r"[,x×\s]+", t) if p]
    try:
        tile = tuple(parse_int(p, widget) for p in parts)
    except ValueError:
        tile = ()
    if len(tile) != 3 or any(v < 1 for v in tile):
        raise ValueError(
            f"{widget}: expected \"off\" or three positive integers bt,bh,bw (e.g. \"2,4,8\"), "
            f"got {shown(text)}")
    return kernels.check_tile(tile, widget)


SOL_TILE_AUTO = "auto"


def parse_sol_tile(text: str):
    """Parse ``sol_tile``: ``"auto"`` (the 64-token tile that pads the video's grid least),
    ``"off"`` (row-major 64-token blocks) → None, or ``"bt,bh,bw"`` with bt·bh·bw = 64."""
    if str(text).strip().lower() == SOL_TILE_AUTO:
        return SOL_TILE_AUTO
    tile = parse_tile(text, "sol_tile")
    if tile is not None and tile[0] * tile[1] * tile[2] != 64:
        raise ValueError(f"sol_tile: {shown(text)} holds {tile[0] * tile[1] * tile[2]} "
                         "tokens; a Sol block is 64 tokens (bt·bh·bw = 64, e.g. \"2,4,8\" or \"1,8,8\")")
    return tile


@dataclass(frozen=True)
class PatchConfig:
    method: str = "sol_attn"
    beta: float = 1.5
    target_sparsity: float = 0.0
    estimator: str = "exact"
    warmup: float = 0.2
    final_dense: float = 0.0
    dense_blocks: tuple = ((0, 0),)
    min_tokens: int = 4096
    sol_tile: object = SOL_TILE_AUTO   # "auto", None (row-major) or a 64-token tile
    backend: str = "auto"
    preset_grid: str = "refuse"
    beside_core_node: str = "defer"
    precision: str = "auto"
    dense_blocks_text: str = field(default="0", compare=False)

    @property
    def effective_beta(self) -> float:
        """β used by Sol-Attn: from ``target_sparsity`` when it is set, else ``beta``."""
        if self.target_sparsity > 0.0:
            return float(kernels.beta_for_density(1.0 - self.target_sparsity))
        return float(self.beta)

    def warmup_steps(self, total_steps: int) -> int:
        """Number of leading dense steps: ``round(warmup × total)``, halves rounded up."""
        return int(math.floor(self.warmup * total_steps + 0.5 + 1e-9))

    def final_dense_steps(self, total_steps: int) -> int:
        return int(math.floor(self.final_dense * total_steps + 0.5 + 1e-9))


def _num(name, value, lo=None, hi=None, integer=False, allow_neg_inf=False):
    v = kernels.check_number(value, name)
    if math.isinf(v) and not (allow_neg_inf and v < 0):
        raise ValueError(f"{name}: must be finite, got {shown(value)}")
    if integer and v != int(v):
        raise ValueError(f"{name}: expected a whole number, got {shown(value)}")
    if lo is not None and v < lo:
        raise ValueError(f"{name}: must be ≥ {lo}, got {shown(value)}")
    if hi is not None and v > hi:
        raise ValueError(f"{name}: must be ≤ {hi}, got {shown(value)}")
    return int(v) if integer else v


def make_config(method="sol_attn", beta=1.5, target_sparsity=0.0, estimator="exact",
                warmup=0.2, final_dense=0.0, dense_blocks="0", min_tokens=4096,
                sol_tile=SOL_TILE_AUTO, backend="auto", preset_grid="refuse",
                beside_core_node="defer", precision="auto") -> PatchConfig:
    """Validate widget values; raise ValueError/TypeError naming the widget."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {shown(method)}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator: expected one of {', '.join(ESTIMATORS)}, got {shown(estimator)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {shown(backend)}")
    if preset_grid not in PRESET_GRID_POLICIES:
        raise ValueError(f"preset_grid: expected one of {', '.join(PRESET_GRID_POLICIES)}, "
                         f"got {shown(preset_grid)}")
    if beside_core_node not in BESIDE_CORE:
        raise ValueError(f"beside_core_node: expected one of {', '.join(BESIDE_CORE)}, "
                         f"got {shown(beside_core_node)}")
    precision = kernels.check_precision(precision, "precision", PRECISIONS)
    beta = kernels.check_beta(_num("beta", beta, allow_neg_inf=True))
    target_sparsity = _num("target_sparsity", target_sparsity, 0.0, 0.999)
    if target_sparsity > 0.0 and 1.0 - target_sparsity == 1.0:  # no β reaches that density
        raise ValueError(f"target_sparsity: {shown(target_sparsity)} is too small to aim at (1 - target_sparsity "
                         "rounds to 1); use 0 to run with beta")
    warmup = _num("warmup", warmup, 0.0, 1.0)
    final_dense = _num("final_dense", final_dense, 0.0, 1.0)
    if warmup + final_dense > 1.0:
        raise ValueError(f"warmup + final_dense must be ≤ 1 (got {warmup} + {final_dense})")
    min_tokens = _num("min_tokens", min_tokens, 0, None, integer=True)
    return PatchConfig(
        method=method, beta=beta, target_sparsity=target_sparsity, estimator=estimator,
        warmup=warmup, final_dense=final_dense, dense_blocks=parse_block_list(dense_blocks),
        min_tokens=min_tokens, sol_tile=parse_sol_tile(sol_tile), backend=backend,
        preset_grid=preset_grid, beside_core_node=beside_core_node, precision=precision,
        dense_blocks_text=str(dense_blocks))

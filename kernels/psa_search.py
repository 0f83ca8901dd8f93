"""PSA-Search: per-head stripe masks under an error budget, from loss tables.

How a call is evaluated
-----------------------
For one attention call (q, k, v of shape (B, L, H, D), L = T*H*W + extra_tokens) and one
head, the output of *any* block mask is assembled from per-(query row, key block) partial
softmax results, computed once:

    m[r, b] = max_j s[r, j]            over the real keys j of key block b
    l[r, b] = sum_j exp(s[r, j] - m[r, b])
    P[r, b] = sum_j exp(s[r, j] - m[r, b]) v[j]          (a D-vector)

With w[r, b] = exp(m[r, b] - max_b' m[r, b']), the output of a mask A is

    o_A[r] = sum_b A[q(r), b] w[r, b] P[r, b]  /  sum_b A[q(r), b] w[r, b] l[r, b]

and the dense output is the same with A = 1. For the rows of one query block all candidates
come from a single (C × n_blocks) @ (n_blocks × rows·D) product. The extra (non-grid) tokens
form one more column that every candidate keeps.

Subsampling (documented cost knob): per call, ``query_tiles`` query blocks are drawn
uniformly without replacement, and ``rows_per_tile`` real query rows from each (all rows
when the block has fewer). The draw depends only on (seed, layer, step bucket, call number),
never on the process, so a distributed search draws the same rows as a single process.

Loss tables
-----------
Per (layer, step bucket, head, candidate) the table keeps float64 sums: the squared error
``sq_err`` between candidate and dense outputs, ``ref_sq`` the squared dense output, and
``count`` the number of output elements (rows × D). Two losses are read from them:

* ``"mse"``: sq_err / count, the mean squared error of the output ("the L2 loss between the
  outputs of the sparse attention and the full attention"; the default);
* ``"rel"``: sq_err / ref_sq, the same relative to the output's energy (scale-free).

Sparsity of a candidate is ``1 - density`` over block pairs of the padded block grid (the
kernel's work). Selection (the dual interface) only re-reads the table:

* ``select(alpha=α)``: per head, the sparsest candidate with loss <= α (ties: lower loss,
  then lower index); if none qualifies, the lowest-loss candidate.
* ``select(target_sparsity=ρ)``: per head, the lowest-loss candidate with sparsity >= ρ
  (ties: sparser, then lower index); if none reaches ρ, the sparsest candidate.

Candidate space
---------------
:func:`candidate_space` adapts the paper's appendix C.2 to a grid: ``0 < Tw < nT`` and
``0 < Sw < nW`` plus the full widths (Tw = nT, Sw = nH*nW: the SVG and uniform heads),
To ∈ {0, ±1, ±2}, Ts ∈ {1, 2, 3, ∞}, So ∈ {0, ±1}, Ss ∈ {1, 3, 5, 6, nW, nW + 1, ∞}
(strides >= the axis length are ∞). Combinations giving the same block mask are merged
(first in enumeration order wins); anchors (SVG/STA shapes: zero offsets, Ts = ∞,
Ss ∈ {∞, nW}) and the dense mask are always kept, the rest is sampled uniformly with a fixed
seed down to ``max_candidates``; ``extra`` candidates are always added. Every range is an
argument.

Several processes
-----------------
``owned=(layer, head) -> bool`` restricts the heads an accumulator evaluates;
:func:`search_calls` takes attention calls as ``(layer, step, load)`` (:func:`search_samples`
over saved sample files, ``benchmarks/search_bench.py`` over generated q/k/v), assigns
(layer, head) pairs round-robin over the ranks of an initialised ``torch.distributed`` group,
loads a call only on ranks that own one of its heads and sums the tables with ``all_reduce``
(entries of other ranks are exact zeros, so the result equals the single-process one bit for
bit under the same math-library thread settings; note that torchrun sets OMP_NUM_THREADS=1,
which changes CPU float rounding, not the selections in practice).

Searching under torchrun (gloo on CPU, NCCL on GPUs, one GPU per process)::

    torchrun --nproc_per_node 2 -m kernels.psa_search search SAMPLES_DIR --tile 3 8 16 \
        --out wan14b_720p.table.safetensors
    python -m kernels.psa_search select wan14b_720p.table.safetensors --alpha 0.007 \
        --out wan14b_720p.json --name wan14b_720p --family wan2.1 \
        --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120 --prompts 2
    python -m kernels.psa_search show wan14b_720p.table.safetensors --sparsity 0.6

Command line: ``python -m kernels.psa_search --help``. Bad input (a missing or unreadable
file, an empty folder, a table or sample that is not one) ends the command with a one-line
``error:`` message and exit status 2.

Files
-----
Loss tables and samples are safetensors files with a JSON header in their metadata. Reading
one checks everything before it is used: the format and version first, then every header
field (grid and tile within the limits of ``kernels.presets``/``kernels.layout``, layers,
bucket edges, heads, the known settings) and every tensor (name, dtype, shape, values).
Any problem is a ``ValueError`` that starts with the file's path and names the field, e.g.
``t.safetensors: header.tile[1]: expected an integer in [1, 256], got 0``. Writing runs the
same checks first (``LossTable.save``; ``save_qkv_sample`` refuses NaN/inf values, which a
search could not turn into a readable table), so what is written always reads back; it goes
through ``kernels._files.write_file`` (never through a symbolic link; atomic replace). A call
whose dense output is not finite is refused by ``PSASearchAccumulator.add`` and not counted.
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import json
import math
import os
import random
import stat
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from ._checks import check_int, check_number, check_qkv, clip, parse_float, parse_int, resolve_scale, shown
from ._files import check_output_path, write_file
from .layout import MAX_GRID_AXIS, MAX_TILE_AXIS, check_grid, check_tile, tile_layout
from .presets import (
    KNOWN_FAMILIES, FieldChecks, check_bucket_edges, check_family, check_fingerprint,
    check_grid_and_tile, json_loads,
)
from .psa_mask import (
    FIELDS, block_grid_of, check_mask_size, check_params, format_params, inter_frame_table, intra_frame_table,
    psa_block_mask,
)
from .psa_reference import check_extra_tokens

__all__ = [
    "candidate_space",
    "PSASearchAccumulator",
    "LossTable",
    "Selection",
    "search_calls",
    "search_samples",
    "write_preset",
    "save_qkv_sample",
    "load_qkv_sample",
    "estimate_sample_bytes",
]

TABLE_FORMAT = "psa-loss-table"
TABLE_VERSION = 1
SAMPLE_FORMAT = "psa-qkv-sample"
_TABLE_TENSORS = {  # name -> dtype
    "candidates": torch.int64, "density": torch.float64, "token_density": torch.float64,
    "sq_err": torch.float64, "ref_sq": torch.float64, "count": torch.float64, "calls": torch.int64,
}
_TABLE_HEADER = ("grid", "tile", "layers", "bucket_edges", "num_heads", "fields", "settings")
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_SAMPLED = 1 << 20  # query_tiles, rows_per_tile


# --------------------------------------------------------------------------- candidates
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


# --------------------------------------------------------------------------- tables
@dataclass
class Selection:
    """Per (bucket, layer, head): the chosen candidate, its parameters, loss and sparsity."""

    layers: list
    bucket_edges: list
    index: torch.Tensor      # int64 (n_buckets, n_layers, H)
    params: torch.Tensor     # int64 (n_buckets, n_layers, H, 6)
    loss: torch.Tensor       # float64 (n_buckets, n_layers, H)
    sparsity: torch.Tensor   # float64 (n_buckets, n_layers, H)
    missing: torch.Tensor    # bool (n_buckets, n_layers, H): never evaluated -> dense chosen
    rule: dict = field(default_factory=dict)

    @property
    def mean_sparsity(self) -> float:
        return float(self.sparsity.mean())

    def params_for(self, layer: int, bucket: int = 0) -> torch.Tensor:
        return self.params[bucket, self.layers.index(layer)]


@dataclass
class LossTable:
    """Loss sums per (layer, step bucket, head, candidate); see the module docstring."""

    grid: tuple
    tile: tuple
    candidates: torch.Tensor   # int64 (C, 6)
    density: torch.Tensor      # float64 (C,) block pairs of the padded grid
    token_density: torch.Tensor  # float64 (C,) real-token pairs
    layers: list               # layer ids, rows of the arrays below
    bucket_edges: list         # ascending step edges; len + 1 buckets
    num_heads: int
    sq_err: torch.Tensor       # float64 (n_layers, n_buckets, H, C)
    ref_sq: torch.Tensor       # float64 (n_layers, n_buckets, H)
    count: torch.Tensor        # float64 (n_layers, n_buckets, H)
    calls: torch.Tensor        # int64 (n_layers, n_buckets)
    settings: dict = field(default_factory=dict)

    @property
    def sparsity(self) -> torch.Tensor:
        return 1.0 - self.density

    def loss(self, metric: str = "mse") -> torch.Tensor:
        """float64 (n_layers, n_buckets, H, C); NaN where nothing was evaluated."""
        if metric == "mse":
            den = self.count
        elif metric == "rel":
            den = self.ref_sq
        else:
            raise ValueError(f"metric must be 'mse' or 'rel', got {shown(metric)}")
        den = den[..., None]
        out = self.sq_err / den.clamp_min(1e-300)
        return torch.where(den > 0, out, torch.full_like(out, float("nan")))

    def select(self, *, alpha=None, target_sparsity=None, metric: str = "mse") -> Selection:
        """The dual interface: exactly one of ``alpha`` / ``target_sparsity``."""
        if (alpha is None) == (target_sparsity is None):
            raise ValueError("give exactly one of alpha (loss budget) or target_sparsity")
        loss = self.loss(metric)  # (nL, nB, H, C)
        sp = self.sparsity.to(loss.dtype)
        missing = torch.isnan(loss).all(dim=-1)
        finite = torch.nan_to_num(loss, nan=math.inf, posinf=math.inf)
        C = sp.numel()
        idx_order = torch.arange(C, dtype=torch.float64)
        if alpha is not None:
            alpha = float(alpha)
            if not alpha >= 0:
                raise ValueError(f"alpha must be >= 0, got {alpha}")
            ok = finite <= alpha
            # sparsest qualified; ties lower loss, then lower index (lexicographic keys)
            inf = torch.full_like(finite, math.inf)
            choice = _lexargmin(torch.where(ok, -sp.expand_as(finite), inf), torch.where(ok, finite, inf), idx_order)
            fallback = _lexargmin(finite, -sp.expand_as(finite), idx_order)
            choice = torch.where(ok.any(-1), choice, fallback)
            rule = {"alpha": alpha, "metric": metric}
        else:
            rho = float(target_sparsity)
            if not 0.0 <= rho <= 1.0:
                raise ValueError(f"target_sparsity must be in [0, 1], got {rho}")
            ok = (sp >= rho - 1e-12).expand_as(finite)
            key = torch.where(ok, finite, torch.full_like(finite, math.inf))
            choice = _lexargmin(key, torch.where(ok, -sp.expand_as(finite), math.inf), idx_order)
            ok_any = ok.any(-1)
            sparsest = _lexargmin((-sp).expand_as(finite), finite, idx_order)
            choice = torch.where(ok_any, choice, sparsest)
            rule = {"target_sparsity": rho, "metric": metric}
        # never-evaluated heads: the densest candidate
        densest = int(torch.argmax(self.density))
        choice = torch.where(missing, torch.full_like(choice, densest), choice)
        chosen_loss = torch.gather(loss, -1, choice[..., None])[..., 0]
        # arrays to (n_buckets, n_layers, H)
        choice_b = choice.permute(1, 0, 2).contiguous()
        return Selection(
            layers=list(self.layers),
            bucket_edges=list(self.bucket_edges),
            index=choice_b,
            params=self.candidates[choice_b],
            loss=chosen_loss.permute(1, 0, 2).contiguous(),
            sparsity=sp[choice_b],
            missing=missing.permute(1, 0, 2).contiguous(),
            rule=rule,
        )

    # ---------------------------------------------------------------- merge / save / load
    def merge(self, other: "LossTable") -> "LossTable":
        """Sum of two tables over the same candidates, grid and heads (more prompts)."""
        for name in ("grid", "tile", "num_heads", "bucket_edges"):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(f"cannot merge tables with different {name}: {getattr(self, name)} vs {getattr(other, name)}")
        if not torch.equal(self.candidates, other.candidates):
            raise ValueError("cannot merge tables with different candidates")
        layers = sorted(set(self.layers) | set(other.layers))
        out = _empty_arrays(len(layers), len(self.bucket_edges) + 1, self.num_heads, self.candidates.shape[0])
        for t in (self, other):
            rows = [layers.index(x) for x in t.layers]
            out["sq_err"][rows] += t.sq_err
            out["ref_sq"][rows] += t.ref_sq
            out["count"][rows] += t.count
            out["calls"][rows] += t.calls
        return LossTable(self.grid, self.tile, self.candidates, self.density, self.token_density, layers,
                         list(self.bucket_edges), self.num_heads, settings=dict(self.settings), **out)

    def save(self, path) -> None:
        """safetensors: the arrays as tensors, grid/tile/layers/settings as JSON metadata
        (never written through a symbolic link, see ``kernels._files``)."""
        from safetensors.torch import save_file

        tensors = {
            "candidates": self.candidates.contiguous(),
            "density": self.density.contiguous(),
            "token_density": self.token_density.contiguous(),
            "sq_err": self.sq_err.contiguous(),
            "ref_sq": self.ref_sq.contiguous(),
            "count": self.count.contiguous(),
            "calls": self.calls.contiguous(),
        }
        header = json.dumps({
            "grid": list(self.grid), "tile": list(self.tile), "layers": list(self.layers),
            "bucket_edges": list(self.bucket_edges), "num_heads": self.num_heads,
            "fields": list(FIELDS), "settings": self.settings,
        })
        # the loader's checks, before anything is written: what is saved always loads
        _table_header(json_loads(header, "header"))
        self.validate()
        meta = {"format": TABLE_FORMAT, "version": str(TABLE_VERSION), "header": header}
        write_file(path, lambda tmp: save_file(tensors, tmp, metadata=meta))

    @classmethod
    def load(cls, path) -> "LossTable":
        """Read and validate a table (module docstring, "Files"); ValueError naming the file
        and the field otherwise."""
        try:
            with _read_safetensors(path, TABLE_FORMAT, TABLE_VERSION, "PSA loss table") as (f, h):
                names = set(f.keys())
                if names != set(_TABLE_TENSORS):
                    extra, missing = sorted(names - set(_TABLE_TENSORS)), sorted(set(_TABLE_TENSORS) - names)
                    raise ValueError(f"tensors: expected {sorted(_TABLE_TENSORS)}"
                                     + (f", missing {missing}" if missing else "")
                                     + (f", unexpected {shown(extra)}" if extra else ""))
                header = _table_header(h)
                t = {name: f.get_tensor(name) for name in _TABLE_TENSORS}
            table = cls(candidates=t["candidates"], density=t["density"], token_density=t["token_density"],
                        sq_err=t["sq_err"], ref_sq=t["ref_sq"], count=t["count"], calls=t["calls"], **header)
            table.validate()
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
        return table

    def validate(self) -> None:
        """Check the arrays against each other and their ranges (ValueError naming the tensor)."""
        for name, dtype in _TABLE_TENSORS.items():
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != dtype:
                raise ValueError(f"tensor {name}: expected {dtype}, got {getattr(t, 'dtype', type(t).__name__)}")
        if self.candidates.dim() != 2 or self.candidates.shape[0] < 1:
            raise ValueError(f"tensor candidates: expected shape (C >= 1, 6), got {tuple(self.candidates.shape)}")
        try:
            check_params(self.candidates)
        except ValueError as e:
            raise ValueError(f"tensor candidates: {e}") from None
        C = self.candidates.shape[0]
        check_mask_size(block_grid_of(self.grid, self.tile), C, f"{C} candidates")
        shape = (len(self.layers), len(self.bucket_edges) + 1, self.num_heads)
        expected = {"density": (C,), "token_density": (C,), "sq_err": shape + (C,), "ref_sq": shape,
                    "count": shape, "calls": shape[:2]}
        for name, want in expected.items():
            t = getattr(self, name)
            if tuple(t.shape) != want:
                raise ValueError(f"tensor {name}: expected shape {want}, got {tuple(t.shape)}")
        for name in ("density", "token_density"):
            t = getattr(self, name)
            if not bool(((t >= 0) & (t <= 1)).all()):
                raise ValueError(f"tensor {name}: expected values in [0, 1]")
        if bool(torch.isnan(self.sq_err).any()) or bool((self.sq_err < 0).any()):
            raise ValueError("tensor sq_err: expected values >= 0 (inf allowed)")
        for name in ("ref_sq", "count", "calls"):
            t = getattr(self, name)
            if not bool((torch.isfinite(t.double()) & (t >= 0)).all()):
                raise ValueError(f"tensor {name}: expected finite values >= 0")

    def summary(self, metric: str = "mse") -> str:
        loss = self.loss(metric)
        return (
            f"LossTable(grid={self.grid}, tile={self.tile}, layers={len(self.layers)}, "
            f"buckets={len(self.bucket_edges) + 1}, heads={self.num_heads}, "
            f"candidates={self.candidates.shape[0]}, calls={int(self.calls.sum())}, "
            f"evaluated heads={int((~torch.isnan(loss).all(-1)).sum())})"
        )


@contextlib.contextmanager
def _read_safetensors(path, fmt: str, version: int, what: str):
    """``(safe_open handle, header dict)`` of a safetensors file of format ``fmt``; every
    failure to read it becomes a one-line ValueError (format and version checked first),
    except a file that cannot be reached or opened (no permission, a loop of links): its
    OSError, which names the file, is raised as it is, as the file itself may be fine."""
    from safetensors import safe_open

    path = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ValueError("no such file") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"not a file (a {what} is one .safetensors file)")
    with open(path, "rb"):
        pass
    try:
        f = safe_open(path, framework="pt")
    except Exception as e:  # SafetensorError, OSError: not a safetensors file
        raise ValueError(f"not a {what} (cannot read it as safetensors: {clip(_one_line(e), 160)})") from None
    with f:
        meta = f.metadata() or {}
        if meta.get("format") != fmt:
            raise ValueError(f"not a {what} (metadata format {shown(meta.get('format'))}, expected {fmt!r})")
        if meta.get("version") != str(version):
            raise ValueError(f"{what} version {shown(meta.get('version'))}; this code reads version {version}")
        try:
            header = json_loads(meta.get("header", ""), "header")
        except ValueError as e:
            raise ValueError(str(e)) from None
        FieldChecks.obj(header, "header")
        try:
            yield f, header
        except ValueError:
            raise
        except Exception as e:  # a tensor that cannot be read
            raise ValueError(f"cannot read its tensors ({type(e).__name__}: {clip(_one_line(e), 160)})") from None


def _one_line(e) -> str:
    return " ".join(str(e).split())


def _table_header(h) -> dict:
    """The LossTable fields stored in a table's JSON header, validated."""
    V = FieldChecks
    V.keys(h, "header", _TABLE_HEADER)
    num_heads = V.int_(h["num_heads"], "header.num_heads", 1, MAX_HEADS)
    grid = tuple(V.int_(x, f"header.grid[{i}]", 1, MAX_GRID_AXIS)
                 for i, x in enumerate(V.list_(h["grid"], "header.grid", 3)))
    tile = tuple(V.int_(x, f"header.tile[{i}]", 1, MAX_TILE_AXIS)
                 for i, x in enumerate(V.list_(h["tile"], "header.tile", 3)))
    check_grid_and_tile(grid, tile, num_heads, "header.grid", "header.tile")
    layers = [V.int_(x, f"header.layers[{i}]", 0, MAX_LAYERS - 1)
              for i, x in enumerate(V.list_(h["layers"], "header.layers", max_len=MAX_LAYERS))]
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise ValueError("header.layers: expected distinct layer ids in ascending order")
    edges = check_bucket_edges(V.list_(h["bucket_edges"], "header.bucket_edges"), "header.bucket_edges")
    if h["fields"] != list(FIELDS):
        raise ValueError(f"header.fields: expected {list(FIELDS)}, got {shown(h['fields'])}")
    return {"grid": grid, "tile": tile, "layers": layers, "bucket_edges": edges, "num_heads": num_heads,
            "settings": _table_settings(h["settings"])}


def _table_settings(st) -> dict:
    """A table's free-form settings; the entries that end up in a preset are validated."""
    V = FieldChecks
    V.obj(st, "header.settings")
    if "family" in st:
        check_family(st["family"], "header.settings.family")
    if "fingerprint" in st:
        check_fingerprint(st["fingerprint"], "header.settings.fingerprint")
    if "model_name" in st:
        V.str_(st["model_name"], "header.settings.model_name", 200)
    if "prompts" in st:
        V.int_(st["prompts"], "header.settings.prompts", 0, 1 << 16)
    for key in ("query_tiles", "rows_per_tile"):
        if key in st:
            V.int_(st[key], f"header.settings.{key}", 1, MAX_SAMPLED, null=True)
    return dict(st)


def _lexargmin(k1, k2, k3):
    """argmin over the last dim by (k1, then k2, then k3); k3 broadcast (C,)."""
    best1 = k1.amin(-1, keepdim=True)
    c1 = k1 == best1
    k2m = torch.where(c1, k2, torch.full_like(k2, math.inf))
    best2 = k2m.amin(-1, keepdim=True)
    c2 = c1 & (k2m == best2)
    k3m = torch.where(c2, k3.expand_as(k2), torch.full_like(k2, math.inf))
    return k3m.argmin(-1)


def _empty_arrays(n_layers, n_buckets, H, C):
    return {
        "sq_err": torch.zeros(n_layers, n_buckets, H, C, dtype=torch.float64),
        "ref_sq": torch.zeros(n_layers, n_buckets, H, dtype=torch.float64),
        "count": torch.zeros(n_layers, n_buckets, H, dtype=torch.float64),
        "calls": torch.zeros(n_layers, n_buckets, dtype=torch.int64),
    }


# --------------------------------------------------------------------------- accumulator
class PSASearchAccumulator:
    """Feeds attention calls one at a time; ``table()`` gives the :class:`LossTable`.

    >>> acc = PSASearchAccumulator(grid, tile, num_heads)          # doctest: +SKIP
    >>> acc.add(q, k, v, layer=i, step=progress)  # every self-attention call to evaluate
    >>> acc.table().select(alpha=0.01)

    ``step`` is compared with ``bucket_edges`` (ascending; bucket = number of edges <= step),
    in whatever unit the caller uses consistently (presets use denoising progress in [0, 1]).
    """

    def __init__(
        self,
        grid,
        tile,
        num_heads: int,
        *,
        candidates=None,
        extra_tokens: int = 0,
        bucket_edges=(),
        query_tiles: int | None = 32,
        rows_per_tile: int | None = 32,
        seed: int = 0,
        scale=None,
        owned=None,
        device=None,
    ):
        # the bounds of a loss table's header, so that table() always saves and loads
        self.grid, self.tile = check_grid(grid), check_tile(tile)
        self.num_heads = check_int(num_heads, "num_heads", 1, MAX_HEADS)
        self.extra_tokens = check_int(extra_tokens, "extra_tokens", 0)
        self.bucket_edges = check_bucket_edges(bucket_edges, "bucket_edges")
        cands = candidate_space(self.grid, self.tile) if candidates is None else check_params(candidates)
        self.candidates = cands
        self.query_tiles = None if query_tiles is None else check_int(query_tiles, "query_tiles", 1, MAX_SAMPLED)
        self.rows_per_tile = None if rows_per_tile is None else check_int(rows_per_tile, "rows_per_tile", 1,
                                                                          MAX_SAMPLED)
        self.seed = check_int(seed, "seed", 0)
        self.scale = None if scale is None else resolve_scale(scale, 1)
        self.owned = owned
        self.device = None if device is None else torch.device(device)
        self.layout = tile_layout(self.grid, self.tile)
        masks = psa_block_mask(self.grid, cands, self.tile)
        self._masks = masks  # bool (C, nB, nB), CPU
        from .psa_mask import PSAMask

        pm = PSAMask(self.grid, cands, self.tile)
        pm._mask = masks
        self.density = pm.density()
        self.token_density = pm.density(tokens=True)
        self._entries = {}  # (layer, bucket) -> dict of sums
        self._dev_masks = {}

    def bucket_of(self, step) -> int:
        return bisect.bisect_right(self.bucket_edges, check_number(step, "step"))

    def _entry(self, layer, bucket):
        key = (check_int(layer, "layer", 0, MAX_LAYERS - 1), bucket)  # the table loader's bound
        if key not in self._entries:
            C = self.candidates.shape[0]
            self._entries[key] = {
                "sq_err": torch.zeros(self.num_heads, C, dtype=torch.float64),
                "ref_sq": torch.zeros(self.num_heads, dtype=torch.float64),
                "count": torch.zeros(self.num_heads, dtype=torch.float64),
                "calls": 0,
            }
        return self._entries[key]

    def register(self, layer, step=0.0) -> None:
        """Make (layer, bucket) a row of the table even if no call adds to it here."""
        self._entry(layer, self.bucket_of(step))

    def skip(self, layer, step=0.0) -> None:
        """Count a call without evaluating it (a rank that owns none of its heads), so the
        row draws of later calls stay the same in every process."""
        self._entry(layer, self.bucket_of(step))["calls"] += 1

    def _masks_on(self, device):
        """float32 (nB, C, nB) on ``device``: per query block, every candidate's key-block row
        (made once per device)."""
        key = str(device)
        if key not in self._dev_masks:
            self._dev_masks[key] = self._masks.to(device=device, dtype=torch.float32).permute(1, 0, 2).contiguous()
        return self._dev_masks[key]

    def _sample_rows(self, layer, bucket, call):
        """Grid-order query rows and their query blocks, by (seed, layer, bucket, call)."""
        lay = self.layout
        mix = ((self.seed * 1_000_003 + int(layer)) * 10_007 + int(bucket)) * 101 + int(call)
        g = torch.Generator().manual_seed(mix & 0x7FFF_FFFF_FFFF)
        nb = lay.n_blocks
        n_tiles = nb if self.query_tiles is None else min(nb, int(self.query_tiles))
        tiles = torch.sort(torch.randperm(nb, generator=g)[:n_tiles]).values
        rows, qblk = [], []
        for b in tiles.tolist():
            n = int(lay.block_lengths[b])
            take = n if self.rows_per_tile is None else min(n, int(self.rows_per_tile))
            pick = torch.sort(torch.randperm(n, generator=g)[:take]).values
            rows.append(lay.perm[b * lay.block_tokens + pick])
            qblk.append(torch.full((take,), b, dtype=torch.int64))
        return torch.cat(rows), torch.cat(qblk)

    @torch.no_grad()
    def add(self, q, k, v, *, layer: int, step=0.0) -> None:
        """Evaluate every candidate on one attention call (q, k, v: (B, L, H, D))."""
        B, L, H, D = check_qkv(q, k, v, for_kernel=False)
        if H != self.num_heads:
            raise ValueError(f"q has {H} heads, the accumulator was made for {self.num_heads}")
        check_extra_tokens(self.extra_tokens, L, self.grid)
        scale = resolve_scale(self.scale, D)
        bucket = self.bucket_of(step)
        entry = self._entry(layer, bucket)
        call = entry["calls"]
        heads = [h for h in range(H) if self.owned is None or self.owned(int(layer), h)]
        if not heads:
            entry["calls"] += 1
            return
        dev = self.device or q.device
        rows, qblk = self._sample_rows(layer, bucket, call)
        lay = self.layout
        n, E = lay.n_tokens, self.extra_tokens
        masks = self._masks_on(dev)
        valid = torch.arange(lay.block_tokens)[None, :] < lay.block_lengths.long()[:, None]
        pad_bias = None
        if not bool(valid.all()):  # -inf on the padding slots of the key blocks
            pad_bias = torch.zeros(valid.shape).masked_fill_(~valid, float("-inf")).to(dev)
        perm = lay.perm.to(dev).clamp_min(0)
        rows_q, qblk_d = rows.to(q.device), qblk.to(dev)
        # results stay on the device until the call is done: no host sync per head
        sq = torch.zeros(B, len(heads), self.candidates.shape[0], dtype=torch.float64, device=dev)
        ref = torch.zeros(B, len(heads), dtype=torch.float64, device=dev)
        for b in range(B):
            for i, h in enumerate(heads):
                qr = q[b, rows_q, h].to(dev, torch.float32)
                kh, vh = k[b, :, h].to(dev), v[b, :, h].to(dev)
                kb = kh[perm].to(torch.float32).reshape(lay.n_blocks, lay.block_tokens, D)
                vb = vh[perm].to(torch.float32).reshape(lay.n_blocks, lay.block_tokens, D)
                ke, ve = kh[n:n + E].to(torch.float32), vh[n:n + E].to(torch.float32)
                sq[b, i], ref[b, i] = _head_losses(qr, qblk_d, kb, vb, pad_bias, ke, ve, masks, scale)
        sq, ref = sq.cpu(), ref.cpu()
        if not bool(torch.isfinite(ref).all()):  # a table holding it could not be read back
            raise ValueError(f"layer {layer}: the dense attention output of this call is not finite (NaN or inf "
                             "in q, k or v, or scores beyond float32); the call is not evaluated")
        entry["calls"] += 1
        idx = torch.tensor(heads, dtype=torch.int64)
        for b in range(B):
            entry["sq_err"][idx] += sq[b]
            entry["ref_sq"][idx] += ref[b]
            entry["count"][idx] += float(rows.numel() * D)

    def table(self) -> LossTable:
        layers = sorted({l for l, _ in self._entries})
        nb = len(self.bucket_edges) + 1
        arr = _empty_arrays(len(layers), nb, self.num_heads, self.candidates.shape[0])
        for (layer, bucket), e in self._entries.items():
            i = layers.index(layer)
            arr["sq_err"][i, bucket] = e["sq_err"]
            arr["ref_sq"][i, bucket] = e["ref_sq"]
            arr["count"][i, bucket] = e["count"]
            arr["calls"][i, bucket] = e["calls"]
        settings = {
            "query_tiles": self.query_tiles, "rows_per_tile": self.rows_per_tile, "seed": self.seed,
            "extra_tokens": self.extra_tokens, "scale": self.scale,
        }
        return LossTable(self.grid, self.tile, self.candidates.clone(), self.density.clone(),
                         self.token_density.clone(), layers, list(self.bucket_edges), self.num_heads,
                         settings=settings, **arr)


def _head_losses(qr, qblk, kb, vb, pad_bias, ke, ve, masks, scale, max_elems=1 << 24):
    """Squared errors of all candidates for the sampled rows of one head.

    qr (R, D) rows, qblk (R,) their query blocks; kb, vb (nB, bt, D) key/value blocks,
    pad_bias (nB, bt) -inf on padding slots, 0 elsewhere (None: no padding); ke, ve (E, D)
    extra tokens; masks (nB, C, nB) float, the candidates' key-block rows per query block.
    Rows are taken in chunks of at most ``max_elems`` floats per intermediate, whatever their
    query blocks: no host synchronisation. Returns (sq_err (C,), ref_sq ()) float64 on the
    device of ``qr``.
    """
    R, D = qr.shape
    nB, bt, _ = kb.shape
    C = masks.shape[1]
    sq_err = torch.zeros(C, dtype=torch.float64, device=qr.device)
    ref_sq = torch.zeros((), dtype=torch.float64, device=qr.device)
    kb_flat_t = kb.reshape(nB * bt, D).T
    per_row = max(nB * bt + ke.shape[0], C * nB, C * D, nB * D)
    step = max(1, max_elems // per_row)
    for r0 in range(0, R, step):
        x = qr[r0:r0 + step]
        s = (x @ kb_flat_t).mul_(scale).reshape(-1, nB, bt)
        if pad_bias is not None:
            s.add_(pad_bias)                                 # -inf on padding slots
        m = s.amax(-1)                                       # (r, nB), finite: no empty block
        p = s.sub_(m[..., None]).exp_()                      # in place: s becomes p
        l = p.sum(-1)                                        # (r, nB)
        pv = torch.bmm(p.transpose(0, 1), vb).transpose(0, 1)  # (r, nB, D)
        if ke.shape[0]:
            se = (x @ ke.T) * scale
            me = se.amax(-1)
            pe = torch.exp(se - me[:, None])
            m_all = torch.maximum(m.amax(-1), me)
            we = torch.exp(me - m_all)
            num_e = we[:, None] * (pe @ ve)                 # (r, D)
            den_e = we * pe.sum(-1)                          # (r,)
        else:
            m_all = m.amax(-1)
            num_e = torch.zeros_like(x)
            den_e = torch.zeros(x.shape[0], device=x.device)
        w = torch.exp(m - m_all[:, None])                    # (r, nB)
        wl = w * l
        wpv = w[..., None] * pv                              # (r, nB, D)
        o_dense = (wpv.sum(1) + num_e) / (wl.sum(1) + den_e)[:, None]
        A = masks[qblk[r0:r0 + step]]                        # (r, C, nB): each row's candidate rows
        num = torch.bmm(A, wpv) + num_e[:, None]             # (r, C, D)
        den = torch.bmm(A, wl[..., None])[..., 0] + den_e[:, None]  # (r, C)
        o = num / den[..., None]
        err = ((o - o_dense[:, None]) ** 2).sum(dim=(0, 2)).double()
        err = torch.where(torch.isfinite(err), err, torch.full_like(err, math.inf))
        sq_err += err
        ref_sq += (o_dense.double() ** 2).sum()
    return sq_err, ref_sq


# --------------------------------------------------------------------------- samples
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
        with _read_safetensors(path, SAMPLE_FORMAT, 1, "PSA q/k/v sample") as (f, h):
            return _sample_header(f, h)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def load_qkv_sample(path):
    """(q, k, v, header) of a sample written by :func:`save_qkv_sample`."""
    try:
        with _read_safetensors(path, SAMPLE_FORMAT, 1, "PSA q/k/v sample") as (f, h):
            h = _sample_header(f, h)
            q, k, v = (f.get_tensor(n) for n in ("q", "k", "v"))
        check_qkv(q, k, v, for_kernel=False)
        _check_finite(q, k, v)
        check_extra_tokens(h["extra_tokens"], q.shape[1], h["grid"])
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
    return q, k, v, h


def search_calls(
    calls,
    *,
    grid,
    num_heads: int,
    tile,
    extra_tokens: int = 0,
    candidates=None,
    bucket_edges=(),
    query_tiles: int | None = 32,
    rows_per_tile: int | None = 32,
    seed: int = 0,
    device=None,
    group=None,
    progress=None,
) -> LossTable:
    """Loss table of a sequence of attention calls ``(layer, step, load)``; ``load()``
    returns the call's (q, k, v, ...) (B, L, H, D) and is called only where it is needed.

    With ``torch.distributed`` initialised, (layer, head) pairs are spread round-robin over
    the ranks of ``group``: a rank evaluates only its heads, calls ``load`` only for calls
    of layers where it owns a head (the others are counted with ``skip``), and the tables
    are summed with ``all_reduce`` on every rank (NCCL: on this rank's current GPU).
    ``progress(done, total)`` is called after every call.
    """
    import torch.distributed as dist

    calls = [(int(layer), float(step), load) for layer, step, load in calls]
    if not calls:
        raise ValueError("no calls given")
    H = int(num_heads)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    world = dist.get_world_size(group) if distributed else 1
    layers = sorted({layer for layer, _, _ in calls})
    pairs = [(layer, h) for layer in layers for h in range(H)]
    mine = {pair for i, pair in enumerate(pairs) if i % world == rank}
    acc = PSASearchAccumulator(
        grid, tile, H, candidates=candidates, extra_tokens=extra_tokens, bucket_edges=bucket_edges,
        query_tiles=query_tiles, rows_per_tile=rows_per_tile, seed=seed,
        owned=lambda layer, head: (layer, head) in mine, device=device,
    )
    for layer, step, _ in calls:
        acc.register(layer, step)
    for i, (layer, step, load) in enumerate(calls):
        if any((layer, h) in mine for h in range(H)):
            q, k, v = load()[:3]
            acc.add(q, k, v, layer=layer, step=step)
            del q, k, v
        else:
            acc.skip(layer, step)
        if progress is not None:
            progress(i + 1, len(calls))
    table = acc.table()
    if world > 1:
        backend = dist.get_backend(group)
        dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        for name in ("sq_err", "ref_sq", "count"):
            t = getattr(table, name).to(dev)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            setattr(table, name, t.cpu())
    table.settings["world_size"] = world
    return table


def search_samples(paths, *, tile, **options) -> LossTable:
    """Loss table of saved samples: :func:`search_calls` over the files, which must share one
    grid, extra-token count and head count; ``options`` are :func:`search_calls`' (candidates,
    bucket_edges, query_tiles, rows_per_tile, seed, device, group, progress). With
    ``torch.distributed`` initialised, heads are spread over the ranks."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("no samples given")
    headers = [read_sample_header(p) for p in paths]
    grid, extra, H = headers[0]["grid"], headers[0]["extra_tokens"], headers[0]["shape"][2]
    for p, h in zip(paths, headers):
        if h["grid"] != grid or h["extra_tokens"] != extra or h["shape"][2] != H:
            raise ValueError(f"{p}: grid/extra_tokens/heads {h['grid']}/{h['extra_tokens']}/{h['shape'][2]} "
                             f"differ from the first sample's {grid}/{extra}/{H}")
    calls = [(h["layer"], h["step"], lambda p=p: load_qkv_sample(p)) for p, h in zip(paths, headers)]
    table = search_calls(calls, grid=grid, num_heads=H, tile=tile, extra_tokens=extra, **options)
    table.settings["samples"] = len(paths)
    return table


def write_preset(
    table: LossTable,
    out,
    *,
    alpha=None,
    target_sparsity=None,
    metric: str = "mse",
    name: str,
    family: str,
    model_name: str,
    fingerprint: dict,
    prompts: int = 1,
    author: str = "",
    notes: str = "",
    source: str = "searched",
):
    """Select masks from ``table`` (exactly one of ``alpha`` / ``target_sparsity``) and write
    the preset JSON to ``out`` (the CLI's ``select``); returns the :class:`kernels.presets.Preset`.
    ``fingerprint``: {"layers", "heads", "head_dim", "hidden_size"}."""
    from .presets import preset_from_selection, save_preset

    s = table.select(alpha=alpha, target_sparsity=target_sparsity, metric=metric)
    preset = preset_from_selection(
        s, name=name, family=family, model_name=model_name, fingerprint=dict(fingerprint),
        grid=table.grid, tile=table.tile, candidates=table.candidates.shape[0], prompts=prompts,
        settings=table.settings, author=author, notes=notes, source=source,
    )
    save_preset(preset, out)
    return preset


# --------------------------------------------------------------------------- CLI
def _maybe_init_distributed():
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":  # one GPU per process, bound to the group (barriers know it)
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
        return True
    return False


PROG = "python -m kernels.psa_search"
_EXAMPLES = {
    None: """examples:
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  torchrun --nproc_per_node 2 -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  python -m kernels.psa_search show wan14b_720p.safetensors --sparsity 0.6
  python -m kernels.psa_search select wan14b_720p.safetensors --alpha 0.007 --out wan14b_720p.json \\
      --name wan14b_720p --family wan --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120

Step by step: docs/PRESETS.md.""",
    "search": """examples:
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out t.safetensors --bucket-edges 0.5 --query-tiles 0
  torchrun --nproc_per_node 2 -m kernels.psa_search search samples/ --tile 3 8 16 --out t.safetensors""",
    "select": """examples:
  python -m kernels.psa_search select t.safetensors --alpha 0.007 --out wan14b_720p.json --name wan14b_720p \\
      --family wan --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120 --prompts 2
  python -m kernels.psa_search select t.safetensors --sparsity 0.6 --metric rel --out hy.json --name hy_720p \\
      --family hunyuan_video --model-name HunyuanVideo --fingerprint 60 24 128 3072""",
    "show": """examples:
  python -m kernels.psa_search show t.safetensors
  python -m kernels.psa_search show t.safetensors --alpha 0.007 --metric mse""",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (required ones have none; a help that states
    its default itself is left alone), the examples epilog as written."""

    def _get_help_string(self, action):
        if action.required or action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _arg_type(parse, what):
    def convert(text):
        try:
            return parse(text, what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).split(": ", 1)[1]) from None

    convert.__name__ = what
    return convert


_INT, _FLOAT = _arg_type(parse_int, "integer"), _arg_type(parse_float, "number")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=_HelpFormatter, epilog=_EXAMPLES[None],
        description="PSA-Search from saved q/k/v samples (run under torchrun to spread heads over processes).",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{search,select,show}")

    def command(name, help):
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              formatter_class=_HelpFormatter, epilog=_EXAMPLES[name])

    s = command("search", "evaluate every candidate on the samples, write a loss table")
    s.add_argument("samples", nargs="+", help="sample files (.safetensors) or folders holding them")
    s.add_argument("--tile", type=_INT, nargs=3, required=True, metavar=("BT", "BH", "BW"),
                   help="PSA tile in tokens (frames, rows, columns); required")
    s.add_argument("--out", required=True, help="loss table to write (.safetensors); required")
    s.add_argument("--max-candidates", type=_INT, default=128, help="candidate masks per head")
    s.add_argument("--candidates-json", default=None,
                   help="JSON list of extra [Tw,To,Ts,Sw,So,Ss] rows to add (default: none)")
    s.add_argument("--query-tiles", type=_INT, default=32, help="query blocks sampled per call (0: all)")
    s.add_argument("--rows-per-tile", type=_INT, default=32, help="query rows sampled per block (0: all)")
    s.add_argument("--bucket-edges", type=_FLOAT, nargs="*", default=[],
                   help="step bucket edges, ascending progress values in (0, 1) (default: none, one bucket)")
    s.add_argument("--seed", type=_INT, default=0, help="seed of the candidate and row sampling")
    s.add_argument("--device", default=None,
                   help="torch device of the evaluation, e.g. cpu or cuda:1 (default: the current CUDA "
                        "device when there is one, else the CPU)")
    sel = command("select", "pick masks from a loss table and write a preset")
    sel.add_argument("table", help="loss table written by the search (.safetensors)")
    g = sel.add_mutually_exclusive_group(required=True)
    g.add_argument("--alpha", type=_FLOAT, help="loss budget: per head the sparsest mask with loss <= alpha "
                                                "(this or --sparsity is required)")
    g.add_argument("--sparsity", type=_FLOAT, help="target sparsity in [0, 1]: per head the lowest-loss mask "
                                                   "at least this sparse (this or --alpha is required)")
    sel.add_argument("--metric", default="mse", choices=["mse", "rel"],
                     help="loss: mse (mean squared error) or rel (relative to the dense output's energy)")
    sel.add_argument("--out", required=True, help="preset to write (.json); required")
    sel.add_argument("--name", required=True, help="preset name, [A-Za-z0-9._-], 1-64 characters; required")
    sel.add_argument("--family", required=True, choices=KNOWN_FAMILIES,
                     help="model family the nodes know (%(choices)s); required")
    sel.add_argument("--model-name", required=True, help="model name stored in the preset; required")
    sel.add_argument("--fingerprint", type=_INT, nargs=4, required=True,
                     metavar=("LAYERS", "HEADS", "HEAD_DIM", "HIDDEN"),
                     help="the model's layers, heads, head dim and hidden size; required")
    sel.add_argument("--prompts", type=_INT, default=1, help="prompts the table was searched on")
    sel.add_argument("--author", default="", help="author stored in the preset (default: empty)")
    sel.add_argument("--notes", default="", help="free text stored in the preset (default: empty)")
    show = command("show", "summarise a loss table, optionally with a selection")
    show.add_argument("table", help="loss table written by the search (.safetensors)")
    show.add_argument("--alpha", type=_FLOAT, default=None, help="also show the selection for this loss budget "
                                                                 "(default: none)")
    show.add_argument("--sparsity", type=_FLOAT, default=None, help="also show the selection for this target "
                                                                    "sparsity (default: none)")
    show.add_argument("--metric", default="mse", choices=["mse", "rel"], help="loss of the selection")
    return ap


def _sample_paths(items) -> list:
    paths = []
    for p in items:
        if os.path.isdir(p):
            found = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".safetensors"))
            if not found:
                raise ValueError(f"{p}: the folder holds no .safetensors sample files")
            paths += found
        elif not os.path.exists(p):
            raise ValueError(f"{p}: no such file or folder")
        else:
            paths.append(p)
    return paths


def _device(text):
    if text is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else None
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device: {shown(text)} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):  # e.g. meta holds no values to evaluate
        raise ValueError(f"--device: {shown(text)}: the search computes on cpu or cuda devices only")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {shown(text)}: CUDA is not available here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device: {shown(text)}: this machine has {torch.cuda.device_count()} CUDA devices")
    return str(dev)


def _search(args) -> int:
    import time

    import torch.distributed as dist

    out = check_output_path(args.out, "--out")  # before the search, not after it
    paths = _sample_paths(args.samples)
    tile = check_tile(args.tile, "--tile")
    for name, value, lo, hi in (("--max-candidates", args.max_candidates, 1, None),
                                ("--query-tiles", args.query_tiles, 0, MAX_SAMPLED),
                                ("--rows-per-tile", args.rows_per_tile, 0, MAX_SAMPLED),
                                ("--seed", args.seed, 0, None)):
        check_int(value, name, lo, hi)
    edges = check_bucket_edges(args.bucket_edges, "--bucket-edges")
    device = _device(args.device)
    h0 = read_sample_header(paths[0])
    extra = json_loads(args.candidates_json, "--candidates-json") if args.candidates_json else ()
    try:
        cands = candidate_space(h0["grid"], tile, max_candidates=args.max_candidates, seed=args.seed, extra=extra)
    except ValueError as e:
        raise ValueError(f"--tile / --candidates-json: {e}") from None
    started = _maybe_init_distributed()
    try:
        rank = dist.get_rank() if dist.is_initialized() else 0
        t0 = time.time()
        table = search_samples(
            paths, tile=tile, candidates=cands, bucket_edges=edges,
            query_tiles=args.query_tiles or None, rows_per_tile=args.rows_per_tile or None,
            seed=args.seed, device=device,
        )
        table.settings["seconds"] = time.time() - t0
        if rank == 0:
            table.save(out)
            print(table.summary())
            print(f"wrote {out} in {table.settings['seconds']:.1f} s")
    finally:
        if started:
            dist.destroy_process_group()
    return 0


def _show(args) -> int:
    table = LossTable.load(args.table)
    print(table.summary())
    if args.alpha is not None or args.sparsity is not None:
        s = table.select(alpha=args.alpha, target_sparsity=args.sparsity, metric=args.metric)
        print(f"selection {s.rule}: mean sparsity {s.mean_sparsity:.3f}")
        for bi in range(s.params.shape[0]):
            for li, layer in enumerate(s.layers):
                picks = ", ".join(format_params(r) for r in s.params[bi, li])
                print(f"  bucket {bi} layer {layer}: {picks}")
    return 0


def _select(args) -> int:
    check_output_path(args.out, "--out")
    table = LossTable.load(args.table)
    L, Hn, Dh, hidden = args.fingerprint
    preset = write_preset(
        table, args.out, alpha=args.alpha, target_sparsity=args.sparsity, metric=args.metric, name=args.name,
        family=args.family, model_name=args.model_name,
        fingerprint={"layers": L, "heads": Hn, "head_dim": Dh, "hidden_size": hidden},
        prompts=args.prompts, author=args.author, notes=args.notes,
    )
    print(f"wrote {args.out}: sparsity {preset.stats['sparsity']:.3f}")
    return 0


def main(argv=None) -> int:
    """The command line; returns the exit status (2 with a one-line error on bad input)."""
    args = _parser().parse_args(argv)
    try:
        return {"search": _search, "show": _show, "select": _select}[args.cmd](args)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}"[:2000], file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Loss tables (the safetensors file a search writes) and the selection of masks from them."""
from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from dataclasses import dataclass, field

import torch

from .._checks import clip, shown
from .._files import write_file
from ..layout import MAX_GRID_AXIS, MAX_TILE_AXIS
from ..preset_file import FieldChecks, check_bucket_edges, check_family, check_fingerprint, check_grid_and_tile, json_loads
from ..psa_mask import FIELDS, block_grid_of, check_mask_size, check_params


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
        out = empty_table_arrays(len(layers), len(self.bucket_edges) + 1, self.num_heads, self.candidates.shape[0])
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
            with read_safetensors(path, TABLE_FORMAT, TABLE_VERSION, "PSA loss table") as (f, h):
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
def read_safetensors(path, fmt: str, version: int, what: str):
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


def empty_table_arrays(n_layers, n_buckets, H, C):
    return {
        "sq_err": torch.zeros(n_layers, n_buckets, H, C, dtype=torch.float64),
        "ref_sq": torch.zeros(n_layers, n_buckets, H, dtype=torch.float64),
        "count": torch.zeros(n_layers, n_buckets, H, dtype=torch.float64),
        "calls": torch.zeros(n_layers, n_buckets, dtype=torch.int64),
    }

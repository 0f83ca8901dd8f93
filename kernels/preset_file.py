"""PSA mask presets: a small, versioned JSON file of per-(bucket, layer, head) stripe masks.

Format (``"format": "psa-mask-preset"``, ``"version": 1``), one JSON object, UTF-8, at most
``MAX_PRESET_BYTES``; no pickle, no code, nothing executed. Fields (all required unless
marked optional; unknown fields are rejected):

    format        "psa-mask-preset"
    version       1
    name          short name, [A-Za-z0-9._-], 1-64 chars, not starting with "."
    model         {"family": [A-Za-z0-9._-] name, "name": str,
                   "fingerprint": {"layers": int, "heads": int, "head_dim": int,
                                   "hidden_size": int}}
    grid          [T, H, W]  video tokens after patchify, the grid the masks were made for;
                  each in [1, 1024], at most 4,194,304 tokens (``kernels.layout`` limits)
    tile          [bt, bh, bw]  PSABlock in tokens; each in [1, 256], at most 4096 tokens,
                  padding the grid by at most 8x; the block grid ceil(grid / tile) has at
                  most 2048 blocks and heads × blocks² <= 2^29 (``kernels.psa_mask`` limits)
    step_buckets  {"unit": "progress", "edges": [e1, ...]}  ascending in (0, 1); denoising
                  progress = step / number of steps; bucket i covers [e_i, e_(i+1))
    params        [bucket][layer][head] -> [Tw, To, Ts, Sw, So, Ss]  (kernels.psa_mask)
    source        "searched" | "geometry"  (geometry: built from grid/RoPE periods, not
                  searched on the real model)
    search        {"rule": "alpha" | "target_sparsity" | "geometry", "value": number | null,
                   "metric": "mse" | "rel" | null, "candidates": int, "prompts": int,
                   "query_tiles": int | null, "rows_per_tile": int | null}
    stats         {"sparsity": number in [0, 1], "mean_loss": number | null,
                   "layer_sparsity": [number, ...] (optional)}
    author        str (optional, <= 200 chars)
    notes         str (optional, <= 4000 chars) free text
    created       str (optional, ISO date)

Validation names the field (``preset.model.fingerprint.heads: expected an integer >= 1,
got 'x'``) and the head (``preset.params[0][3][7].Sw = 0: widths must be >= 1``); ``format``
and ``version`` are checked first, so a preset of another version is reported as such.
Every rejection is a ``ValueError`` of bounded length (values and unknown field names are
cut short; an integer of more than 40 digits is refused while the JSON is parsed).

Families: the file format takes any family name of :data:`NAME_RE`'s form; a reader that knows
its models (the nodes, ``tools/build_presets.py``) passes ``known_families`` and gets any other
refused.

Names and folders: :func:`resolve_preset_path` accepts a bare file name
(``[A-Za-z0-9._-]+.json``) and finds it in the given preset folders; separators, ``..``,
absolute paths and links leading outside a folder are refused.

Resolution policy (:meth:`Preset.params_for_grid`): the masks are defined on the block grid
ceil(grid / tile). A different token grid with the **same block grid** (e.g. 45 vs 48 rows
with bh = 8) uses the parameters unchanged. A different block grid is **refused** by default
(ValueError naming both grids); with ``on_mismatch="rescale"`` the parameters are mapped
with a ``UserWarning``: temporal widths/offsets/strides scale by nT'/nT, column widths and
column offsets by nW'/nW, spatial strides that are whole rows (k·nW) become k·nW', other
spatial strides scale by (nH'·nW')/(nH·nW); widths stay >= 1, a stride that reaches the
axis length becomes ∞, ∞ stays ∞, and every value is clamped to ±MAX_PARAM (a width or an
offset that large already reaches past any allowed block grid, so the mask is the same). It
is an approximation: a re-search is better. The new grid must itself fit the size limits
(tile padding, mask size), else ``params_for_grid`` refuses it with a ValueError.

Files are written by :func:`save_preset` through ``kernels._files.write_file``: never through
a symbolic link, and replaced atomically.
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field

import torch

from ._checks import clip, shown
from ._files import write_file
from .layout import MAX_GRID_AXIS, MAX_TILE_AXIS, check_grid, check_padding, check_tile
from .psa_mask import FIELDS, MAX_PARAM, block_grid_of, check_mask_size, check_params

__all__ = [
    "PRESET_FORMAT",
    "PRESET_VERSION",
    "NAME_RE",
    "check_name",
    "check_bucket_edges",
    "MAX_PRESET_BYTES",
    "Preset",
    "load_preset",
    "save_preset",
    "preset_from_json",
    "resolve_preset_path",
    "preset_from_selection",
    "load",
]

PRESET_FORMAT = "psa-mask-preset"
PRESET_VERSION = 1
MAX_PRESET_BYTES = 4 * 1024 * 1024
# Names that become file names; always used with fullmatch ("$" would let a trailing
# newline through).
NAME_RE = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,64}", re.ASCII)
_FILE_RE = re.compile(r"(?!\.)[A-Za-z0-9._-]{1,64}\.json", re.ASCII)
_MAX_INT_DIGITS = 40
MAX_BUCKET_EDGES = 64
MAX_AUTHOR = 200
_TOP_FIELDS = {
    "format", "version", "name", "model", "grid", "tile", "step_buckets", "params", "source",
    "search", "stats", "author", "notes", "created",
}
_OPTIONAL = {"author", "notes", "created"}


def check_name(name, what: str) -> str:
    """``name`` if it is a valid preset or table name (:data:`NAME_RE`), else a ValueError
    naming ``what`` (the widget or field)."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise ValueError(f"{what}: {shown(name)} must be 1-64 characters of A-Z a-z 0-9 . _ - "
                         "not starting with '.' (it becomes a file name)")
    return name


def check_bucket_edges(edges, what: str) -> list:
    """Step bucket edges as a list of floats: at most :data:`MAX_BUCKET_EDGES` finite numbers,
    strictly ascending inside (0, 1) (denoising progress); else a ValueError naming ``what``."""
    items = list(edges)
    if len(items) > MAX_BUCKET_EDGES:
        raise ValueError(f"{what}: more than {MAX_BUCKET_EDGES} edges")
    out = [FieldChecks.num(e, f"{what}[{i}]") for i, e in enumerate(items)]
    for i, e in enumerate(out):
        if not 0.0 < e < 1.0:
            raise ValueError(f"{what}[{i}]: expected a denoising progress inside (0, 1), got {e!r}")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"{what}: must be strictly ascending, got {shown(out, 200)}")
    return out


def check_family(family, what: str, known_families=None) -> str:
    """A model family: a name of :data:`NAME_RE`'s form; with ``known_families``, one of them.
    Else a ValueError naming ``what``."""
    if known_families is not None:
        if not isinstance(family, str) or family not in known_families:
            raise ValueError(f"{what}: expected one of {', '.join(known_families)}, got {shown(family)}")
    elif not isinstance(family, str) or NAME_RE.fullmatch(family) is None:
        raise ValueError(f"{what}: expected a family name of 1-64 characters of A-Z a-z 0-9 . _ -, "
                         f"got {shown(family)}")
    return family


@dataclass
class Preset:
    name: str
    family: str
    model_name: str
    fingerprint: dict          # layers, heads, head_dim, hidden_size
    grid: tuple
    tile: tuple
    params: torch.Tensor       # int64 (n_buckets, layers, heads, 6)
    bucket_edges: list = field(default_factory=list)
    source: str = "searched"
    search: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    author: str = ""
    notes: str = ""
    created: str = ""

    # ---------------------------------------------------------------- use
    @property
    def block_grid(self):
        return block_grid_of(self.grid, self.tile)

    @property
    def num_layers(self) -> int:
        return int(self.params.shape[1])

    @property
    def num_heads(self) -> int:
        return int(self.params.shape[2])

    def params_for_layer(self, layer: int, progress: float = 0.0):
        """(heads, 6) of a layer, or None when the preset has no such layer (nodes API)."""
        if not 0 <= int(layer) < self.num_layers:
            return None
        return self.params_for(layer, progress)

    def bucket_of(self, progress: float) -> int:
        return sum(1 for e in self.bucket_edges if float(progress) >= e)

    def params_for(self, layer: int, progress: float = 0.0) -> torch.Tensor:
        """int64 (heads, 6) of one layer at a denoising progress in [0, 1]."""
        n_layers = self.params.shape[1]
        if not 0 <= int(layer) < n_layers:
            raise ValueError(f"layer {layer} is outside the preset's {n_layers} layers")
        return self.params[self.bucket_of(progress), int(layer)]

    def check_model(self, fingerprint: dict, family: str | None = None) -> None:
        """Raise ValueError listing every difference from the running model's fingerprint."""
        problems = []
        if family is not None and family != self.family:
            problems.append(f"model family: preset {self.family!r}, model {family!r}")
        for key in ("layers", "heads", "head_dim", "hidden_size"):
            if key in fingerprint and int(fingerprint[key]) != int(self.fingerprint[key]):
                problems.append(f"{key}: preset {self.fingerprint[key]}, model {fingerprint[key]}")
        if problems:
            raise ValueError(f"preset {self.name!r} does not fit this model: " + "; ".join(problems))

    def params_for_grid(self, grid, on_mismatch: str = "refuse") -> "Preset":
        """This preset for another token grid; see the module docstring for the policy."""
        grid = check_grid(grid)
        if on_mismatch not in ("refuse", "rescale"):
            raise ValueError(f"on_mismatch must be 'refuse' or 'rescale', got {shown(on_mismatch)}")
        check_padding(grid, self.tile, f"preset {self.name!r}: tile")
        new_bg = block_grid_of(grid, self.tile)
        check_mask_size(new_bg, self.num_heads, f"preset {self.name!r} on grid {grid}")
        if new_bg == self.block_grid:
            return _replace(self, grid=grid)
        if on_mismatch == "refuse":
            raise ValueError(
                f"preset {self.name!r} was made for grid {tuple(self.grid)} (block grid {self.block_grid} with tile "
                f"{tuple(self.tile)}); this video has grid {grid} (block grid {new_bg}). Search a preset for this "
                "resolution, or allow rescaling (approximate)."
            )
        warnings.warn(
            f"rescaling preset {self.name!r} from block grid {self.block_grid} to {new_bg}; masks are approximate",
            UserWarning,
            stacklevel=2,
        )
        return _replace(self, grid=grid, params=rescale_params(self.params, self.block_grid, new_bg))


def _replace(p: Preset, **kw) -> Preset:
    d = dict(p.__dict__)
    d.update(kw)
    return Preset(**d)


def rescale_params(params: torch.Tensor, old_bg, new_bg) -> torch.Tensor:
    """Map (..., 6) parameters from block grid ``old_bg`` to ``new_bg`` (see module doc)."""
    nT, nH, nW = old_bg
    mT, mH, mW = new_bg
    out = params.clone().reshape(-1, 6)
    for row in out:
        Tw, To, Ts, Sw, So, Ss = (int(x) for x in row)
        ft, fw, fs = mT / nT, mW / nW, (mH * mW) / (nH * nW)
        Tw2 = max(1, round(Tw * ft)) if Tw < nT else max(Tw, mT)
        To2 = round(To * ft)
        Ts2 = 0 if Ts == 0 else max(1, round(Ts * ft))
        Ts2 = 0 if Ts2 >= mT else Ts2
        Sw2 = max(1, round(Sw * fw)) if Sw < nH * nW else max(Sw, mH * mW)
        So2 = round(So * fw) if abs(So) < nW else round(So * fs)
        if Ss == 0:
            Ss2 = 0
        elif Ss % nW == 0:
            Ss2 = (Ss // nW) * mW
        else:
            Ss2 = max(1, round(Ss * fs))
        Ss2 = 0 if Ss2 >= mH * mW else Ss2
        row[:] = torch.tensor([max(-MAX_PARAM, min(MAX_PARAM, x)) for x in (Tw2, To2, Ts2, Sw2, So2, Ss2)])
    return out.reshape(params.shape)


# --------------------------------------------------------------------------- JSON
class FieldChecks:
    """Validation helpers whose errors name the field path."""

    @staticmethod
    def obj(x, path):
        if not isinstance(x, dict):
            raise ValueError(f"{path}: expected an object, got {type(x).__name__}")
        return x

    @staticmethod
    def keys(x, path, required, optional=()):
        for k in x:
            if k not in required and k not in optional:
                raise ValueError(f"{path}.{clip(str(k), 60)}: unknown field")
        for k in required:
            if k not in x:
                raise ValueError(f"{path}.{k}: missing field")

    @staticmethod
    def int_(x, path, lo=None, hi=None, null=False):
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, int):
            raise ValueError(f"{path}: expected an integer, got {shown(x)}")
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"{path}: expected an integer {rng}, got {shown(x)}")
        return x

    @staticmethod
    def num(x, path, lo=None, hi=None, null=False):
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise ValueError(f"{path}: expected a finite number, got {shown(x)}")
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise ValueError(f"{path}: expected a number in [{lo}, {hi}], got {shown(x)}")
        return float(x)

    @staticmethod
    def str_(x, path, max_len, pattern=None, choices=None):
        if not isinstance(x, str):
            raise ValueError(f"{path}: expected a string, got {type(x).__name__}")
        if len(x) > max_len:
            raise ValueError(f"{path}: longer than {max_len} characters")
        if pattern is not None and not pattern.fullmatch(x):
            raise ValueError(f"{path}: {shown(x)} must match {pattern.pattern}")
        if choices is not None and x not in choices:
            raise ValueError(f"{path}: expected one of {sorted(choices)}, got {shown(x)}")
        return x

    @staticmethod
    def list_(x, path, length=None, max_len=None):
        if not isinstance(x, list):
            raise ValueError(f"{path}: expected a list, got {type(x).__name__}")
        if length is not None and len(x) != length:
            raise ValueError(f"{path}: expected {length} entries, got {len(x)}")
        if max_len is not None and len(x) > max_len:
            raise ValueError(f"{path}: more than {max_len} entries")
        return x


def preset_from_json(text, known_families=None) -> Preset:
    """Parse and validate a preset document (str or bytes); ``known_families``: the model
    families the reader accepts (:func:`check_family`)."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_PRESET_BYTES:
            raise ValueError(f"preset: {len(text)} bytes exceeds the {MAX_PRESET_BYTES}-byte limit")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"preset: not UTF-8 ({e})") from None
    if not isinstance(text, str):
        raise ValueError(f"preset: expected JSON text, got {type(text).__name__}")
    if len(text.encode("utf-8")) > MAX_PRESET_BYTES:
        raise ValueError(f"preset: exceeds the {MAX_PRESET_BYTES}-byte limit")

    doc = json_loads(text, "preset")
    V = FieldChecks
    V.obj(doc, "preset")
    # What the document is comes before which fields it has: another version may have others.
    for key in ("format", "version"):
        if key not in doc:
            raise ValueError(f"preset.{key}: missing field")
    if doc["format"] != PRESET_FORMAT:
        raise ValueError(f"preset.format: expected {PRESET_FORMAT!r}, got {shown(doc['format'])}")
    version = V.int_(doc["version"], "preset.version", 1)
    if version != PRESET_VERSION:
        raise ValueError(f"preset.version: this code reads version {PRESET_VERSION}, got {version}")
    V.keys(doc, "preset", _TOP_FIELDS - _OPTIONAL, _OPTIONAL)
    name = V.str_(doc["name"], "preset.name", 64, NAME_RE)

    model = V.obj(doc["model"], "preset.model")
    V.keys(model, "preset.model", ("family", "name", "fingerprint"))
    family = check_family(model["family"], "preset.model.family", known_families)
    model_name = V.str_(model["name"], "preset.model.name", 200)
    fingerprint = check_fingerprint(model["fingerprint"], "preset.model.fingerprint")

    grid = tuple(V.int_(x, f"preset.grid[{i}]", 1, MAX_GRID_AXIS)
                 for i, x in enumerate(V.list_(doc["grid"], "preset.grid", 3)))
    tile = tuple(V.int_(x, f"preset.tile[{i}]", 1, MAX_TILE_AXIS)
                 for i, x in enumerate(V.list_(doc["tile"], "preset.tile", 3)))
    check_grid_and_tile(grid, tile, fingerprint["heads"], "preset.grid", "preset.tile")

    sb = V.obj(doc["step_buckets"], "preset.step_buckets")
    V.keys(sb, "preset.step_buckets", ("unit", "edges"))
    V.str_(sb["unit"], "preset.step_buckets.unit", 16, choices={"progress"})
    edges = check_bucket_edges(V.list_(sb["edges"], "preset.step_buckets.edges"), "preset.step_buckets.edges")

    L, Hh = fingerprint["layers"], fingerprint["heads"]
    params = V.list_(doc["params"], "preset.params", len(edges) + 1)
    rows = []
    for b, layers in enumerate(params):
        V.list_(layers, f"preset.params[{b}]", L)
        for li, heads in enumerate(layers):
            V.list_(heads, f"preset.params[{b}][{li}]", Hh)
            for hi, row in enumerate(heads):
                path = f"preset.params[{b}][{li}][{hi}]"
                V.list_(row, path, 6)
                for f, x in zip(FIELDS, row):
                    V.int_(x, f"{path}.{f}")
                    if abs(x) > MAX_PARAM:
                        raise ValueError(f"{path}.{f} = {x}: |value| must be <= {MAX_PARAM}"[:300])
                rows.append(row)
    flat = torch.tensor(rows, dtype=torch.int64)
    try:
        check_params(flat)
    except ValueError as e:
        # re-address "params[i].F" to the preset's [bucket][layer][head]
        m = re.match(r"params\[(\d+)\]\.(\w+)(.*)", str(e))
        if not m:
            raise
        i = int(m.group(1))
        b, rem = divmod(i, L * Hh)
        li, hi = divmod(rem, Hh)
        raise ValueError(f"preset.params[{b}][{li}][{hi}].{m.group(2)}{m.group(3)}") from None
    params_t = flat.reshape(len(edges) + 1, L, Hh, 6)

    source = V.str_(doc["source"], "preset.source", 16, choices={"searched", "geometry"})
    s = V.obj(doc["search"], "preset.search")
    V.keys(s, "preset.search", ("rule", "value", "metric", "candidates", "prompts", "query_tiles", "rows_per_tile"))
    search = {
        "rule": V.str_(s["rule"], "preset.search.rule", 32, choices={"alpha", "target_sparsity", "geometry"}),
        "value": V.num(s["value"], "preset.search.value", 0.0, 1e6, null=True),
        "metric": None if s["metric"] is None else V.str_(s["metric"], "preset.search.metric", 8, choices={"mse", "rel"}),
        "candidates": V.int_(s["candidates"], "preset.search.candidates", 0, 1 << 20),
        "prompts": V.int_(s["prompts"], "preset.search.prompts", 0, 1 << 16),
        "query_tiles": V.int_(s["query_tiles"], "preset.search.query_tiles", 1, 1 << 20, null=True),
        "rows_per_tile": V.int_(s["rows_per_tile"], "preset.search.rows_per_tile", 1, 1 << 20, null=True),
    }
    st = V.obj(doc["stats"], "preset.stats")
    V.keys(st, "preset.stats", ("sparsity", "mean_loss"), ("layer_sparsity",))
    stats = {
        "sparsity": V.num(st["sparsity"], "preset.stats.sparsity", 0.0, 1.0),
        "mean_loss": V.num(st["mean_loss"], "preset.stats.mean_loss", 0.0, 1e12, null=True),
    }
    if "layer_sparsity" in st:
        stats["layer_sparsity"] = [V.num(x, f"preset.stats.layer_sparsity[{i}]", 0.0, 1.0)
                                   for i, x in enumerate(V.list_(st["layer_sparsity"], "preset.stats.layer_sparsity", L))]
    author = V.str_(doc.get("author", ""), "preset.author", MAX_AUTHOR)
    notes = V.str_(doc.get("notes", ""), "preset.notes", 4000)
    created = V.str_(doc.get("created", ""), "preset.created", 40)
    return Preset(name, family, model_name, fingerprint, grid, tile, params_t, edges, source, search, stats,
                  author, notes, created)


class _LongInteger:
    """A JSON integer too long to be a field value, kept only to name it in the error."""

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _json_int(text: str):
    # Python refuses to parse more than 4300 digits, with an error naming no field.
    return int(text) if len(text) <= _MAX_INT_DIGITS else _LongInteger(len(text.lstrip("-")))


def json_loads(text: str, what: str):
    """``json.loads`` for untrusted documents: only JSON (no NaN/Infinity), integers of at
    most 40 digits (longer ones are kept as a marker that the field check names), and every
    failure a ValueError naming ``what``."""

    def no_constants(name):
        raise ValueError(f"{what}: {name} is not valid JSON")

    if not isinstance(text, str):
        raise ValueError(f"{what}: expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=no_constants, parse_int=_json_int)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: invalid JSON ({shown(str(e), 200)})") from None
    except RecursionError:
        raise ValueError(f"{what}: JSON nested too deeply") from None


def check_fingerprint(fp, path: str) -> dict:
    """A model fingerprint {layers, heads, head_dim, hidden_size}, each a bounded integer."""
    V = FieldChecks
    V.obj(fp, path)
    V.keys(fp, path, ("layers", "heads", "head_dim", "hidden_size"))
    return {
        "layers": V.int_(fp["layers"], f"{path}.layers", 1, 1024),
        "heads": V.int_(fp["heads"], f"{path}.heads", 1, 1024),
        "head_dim": V.int_(fp["head_dim"], f"{path}.head_dim", 1, 4096),
        "hidden_size": V.int_(fp["hidden_size"], f"{path}.hidden_size", 1, 1 << 20),
    }


def check_grid_and_tile(grid, tile, count: int, grid_name: str, tile_name: str) -> None:
    """The size limits a stored grid and tile must meet (``kernels.layout`` and
    ``kernels.psa_mask``) for ``count`` masks (heads or candidates); errors name the fields."""
    check_grid(grid, grid_name)
    check_tile(tile, tile_name)
    check_padding(grid, tile, tile_name)
    check_mask_size(block_grid_of(grid, tile), count, tile_name)


def preset_to_json(p: Preset) -> str:
    doc = {
        "format": PRESET_FORMAT,
        "version": PRESET_VERSION,
        "name": p.name,
        "model": {"family": p.family, "name": p.model_name, "fingerprint": dict(p.fingerprint)},
        "grid": list(p.grid),
        "tile": list(p.tile),
        "step_buckets": {"unit": "progress", "edges": list(p.bucket_edges)},
        "params": p.params.tolist(),
        "source": p.source,
        "search": dict(p.search),
        "stats": dict(p.stats),
        "author": p.author,
        "notes": p.notes,
        "created": p.created,
    }
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    # validate what we write, so a saved preset always loads
    preset_from_json(text)
    return text


def save_preset(p: Preset, path, *, overwrite: bool = True) -> None:
    """Write ``p`` (validated) to ``path``; refuses a symbolic link at ``path`` and, without
    ``overwrite``, an existing file (ValueError)."""
    write_file(path, preset_to_json(p).encode("utf-8"), overwrite=overwrite)


def resolve_preset_path(name: str, folders) -> str:
    """The file of a preset *name* inside one of ``folders``; refuses anything else."""
    if not isinstance(name, str) or not _FILE_RE.fullmatch(name):
        raise ValueError(f"preset name {shown(name)}: expected a bare file name like 'wan_720p.json' ([A-Za-z0-9._-])")
    for folder in folders:
        root = os.path.realpath(folder)
        candidate = os.path.realpath(os.path.join(root, name))
        if os.path.dirname(candidate) != root:
            continue  # a link leading elsewhere
        if os.path.isfile(candidate):
            return candidate
    raise ValueError(f"preset {name!r} not found in the preset folders {list(folders)}")


def load_preset(path_or_name, folders=None, known_families=None) -> Preset:
    """Load a preset: a bare name looked up in ``folders``, or (folders=None) a file path;
    ``known_families``: the model families the reader accepts (:func:`check_family`)."""
    path = resolve_preset_path(path_or_name, folders) if folders is not None else os.fspath(path_or_name)
    try:
        size = os.path.getsize(path)
        if size > MAX_PRESET_BYTES:
            raise ValueError(f"preset {path}: {size} bytes exceeds the {MAX_PRESET_BYTES}-byte limit")
        with open(path, "rb") as f:
            data = f.read(MAX_PRESET_BYTES + 1)
    except OSError as e:
        raise ValueError(f"preset {path}: cannot read it ({e.strerror or type(e).__name__})") from None
    try:
        return preset_from_json(data, known_families)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def preset_from_selection(
    selection,
    *,
    name: str,
    family: str,
    model_name: str,
    fingerprint: dict,
    grid,
    tile,
    candidates: int,
    prompts: int,
    settings: dict | None = None,
    author: str = "",
    notes: str = "",
    created: str = "",
    source: str = "searched",
    known_families=None,
) -> Preset:
    """A searched preset from a :class:`kernels.psa_search.Selection` covering every layer
    ``0 .. fingerprint['layers'] - 1`` (layers missing from the selection, rows beyond them and
    another head count are refused).
    ``source="geometry"`` marks a preset that was not searched on the real model (e.g. one
    searched on the synthetic workload). The result is validated like a preset file
    (ValueError naming the field); ``known_families`` as in :func:`check_family`."""
    family = check_family(family, "family", known_families)
    fingerprint = check_fingerprint(fingerprint, "fingerprint")
    L = fingerprint["layers"]
    missing = [x for x in range(L) if x not in selection.layers]
    if missing:
        raise ValueError(f"the selection has no loss table rows for layers {missing[:10]}; search every layer")
    beyond = [x for x in selection.layers if x >= L]
    if beyond:
        raise ValueError(f"fingerprint.layers: {L}, but the loss table has rows for layer {beyond[-1]}; "
                         "give the model's layer count")
    heads = int(selection.params.shape[2])
    if fingerprint["heads"] != heads:
        raise ValueError(f"fingerprint.heads: {fingerprint['heads']}, but the loss table has {heads} heads "
                         "per layer; give the model's head count")
    rows = [selection.layers.index(x) for x in range(L)]
    params = selection.params[:, rows]
    rule = "alpha" if "alpha" in selection.rule else "target_sparsity"
    settings = settings or {}
    loss = selection.loss[:, rows]
    finite = loss[torch.isfinite(loss)]
    preset = Preset(
        name=name, family=family, model_name=model_name, fingerprint=dict(fingerprint), grid=tuple(grid),
        tile=tuple(tile), params=params, bucket_edges=list(selection.bucket_edges), source=source,
        search={
            "rule": rule, "value": selection.rule.get(rule), "metric": selection.rule.get("metric"),
            "candidates": int(candidates), "prompts": int(prompts),
            "query_tiles": settings.get("query_tiles"), "rows_per_tile": settings.get("rows_per_tile"),
        },
        stats={
            "sparsity": float(selection.sparsity[:, rows].mean()),
            "mean_loss": float(finite.mean()) if finite.numel() else None,
            "layer_sparsity": [float(x) for x in selection.sparsity[:, rows].mean(dim=(0, 2))],
        },
        author=author, notes=notes, created=created,
    )
    preset_to_json(preset)  # validated here, so a selection that cannot be a preset says so now
    return preset


def load(path, known_families=None) -> Preset:
    """``load_preset(path)``: the name the nodes' preset loader calls."""
    return load_preset(path, known_families=known_families)

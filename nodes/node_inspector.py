"""The "Sparse Attention Inspector" node: the last run's statistics as images and JSON.

Reads :func:`~.patching.run_summary` of a patched model (the statistics of its last sampling
run) and draws, with numpy only (:mod:`.draw`):

- ``density_map``: achieved density per transformer block (rows) × denoising step (columns);
  grey cells ran dense (warm-up, dense blocks, ...);
- ``head_density``: achieved density per block (rows) × head (columns), averaged over the
  run's sparse calls (Sol-Attn: the share of exactly computed key blocks; PSA: the share of
  kept token pairs of the mask);
- ``psa_masks``: the per-head block masks of a PSA preset for one block on its grid (the
  video's grid when the run had one the preset accepts), query blocks as rows. Masks that
  cannot be drawn (a layer the preset lacks, masks beyond ``kernels.psa_mask``'s size limits)
  give a message image and the reason in ``summary["psa_masks"]["error"]``, never a failed
  node;
- ``summary``: a short JSON of the run (ComfyUI version, calls sparse/dense by reason,
  densities per step and block, schedule, preset, search, and the warnings of a patch that did
  nothing or only part of its work: displaced, wholly or in part, by a later attention patch; no
  sparse call; ComfyUI's own Model Sparse Attention node on the same model).
"""
from __future__ import annotations

import json

import numpy as np
import torch

from comfy_api.latest import io, ui

from . import draw
from ._kernels import kernels
from .node_patch import Preset
from .patching import dispatcher_of


def _num(x):
    return None if x is None else round(float(x), 4)


def summary_json(s: dict) -> dict:
    """A JSON-safe digest of a run summary (tuple keys flattened, numbers rounded)."""
    by_block = {}
    for (step, block), d in s.get("density_by_step_block", {}).items():
        by_block.setdefault(block, []).append(d)
    steps = {}
    for step, c in s.get("steps", {}).items():
        steps[str(step)] = {k: (_num(v) if k == "mean_density" else v) for k, v in c.items()}
    out = {k: s[k] for k in ("method", "family", "comfyui_version", "kernel_config", "precision", "sol_blocks",
                             "num_blocks", "num_heads", "grid", "forwards", "calls", "sparse_calls", "dense_calls",
                             "schedule")
           if k in s}
    out["mean_density"] = _num(s.get("mean_density"))
    if "beta" in s:
        out["beta"] = _num(s["beta"])
    out["density_by_step"] = {k: v.get("mean_density") for k, v in steps.items()
                              if v.get("mean_density") is not None}
    out["density_by_block"] = {str(b): _num(sum(v) / len(v)) for b, v in sorted(by_block.items(),
                                                                            key=lambda kv: kv[0])}
    out["calls_by_step"] = {k: {"sparse": v["sparse"], "dense": v["dense"]} for k, v in steps.items()}
    for k in ("warnings", "override_displaced_by", "core_sparse_node", "checkpoint_attention", "preset", "search",
              "notes"):
        if s.get(k):
            out[k] = s[k]
    return out


def density_matrix(s: dict):
    """(blocks × steps array with NaN where dense, step labels)."""
    steps = sorted(k for k in s.get("steps", {}) if k is not None)
    cells = s.get("density_by_step_block", {})
    blocks = s.get("num_blocks") or (1 + max((b for (_, b) in cells if b is not None), default=-1))
    a = np.full((blocks, len(steps)), np.nan)
    col = {st: i for i, st in enumerate(steps)}
    for (st, b), d in cells.items():
        if st in col and b is not None and 0 <= b < blocks:
            a[b, col[st]] = d
    return a, steps


def head_matrix(s: dict):
    per = s.get("head_density_by_block", {})
    heads = s.get("num_heads") or max((len(v) for v in per.values()), default=0)
    blocks = s.get("num_blocks") or (1 + max(per, default=-1))
    a = np.full((blocks, heads), np.nan)
    for b, v in per.items():
        if 0 <= b < blocks:
            a[b, :len(v)] = v
    return a


def preset_masks(preset, layer: int, grid=None, policy="refuse"):
    """(bool masks (H, n, n), per-head token density (H,), grid, layer) of one preset layer."""
    if grid is not None and tuple(grid) != tuple(preset.grid):
        try:
            preset = preset.params_for_grid(tuple(grid), on_mismatch=policy)
        except ValueError:
            grid = None
    grid = tuple(preset.grid) if grid is None else tuple(grid)
    n_layers = int(preset.fingerprint["layers"])
    layer = layer + n_layers if layer < 0 else layer
    if not 0 <= layer < n_layers:
        raise ValueError(f"mask_layer: {layer} is outside the preset's {n_layers} layers")
    m = kernels.psa_mask(grid, preset.params_for(layer, 0.0), preset.tile)
    return m.mask.numpy(), m.density(tokens=True).numpy(), grid, layer


def to_image(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).unsqueeze(0)


class SparseAttentionInspector(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SparseAttentionInspector",
            display_name="Sparse Attention Inspector",
            category="model_patches/sparse_attention",
            description="Show where the sparsity went in the last sampling run of a model "
                        "patched by 'Sparse Attention Patch': density per block × step, per "
                        "head, the PSA masks, and a JSON summary.",
            is_output_node=True,
            inputs=[
                io.Model.Input("model", optional=True,
                               tooltip="The patched model whose last run is shown: the model "
                                       "the sampler used ('Sparse Attention Patch' or 'PSA Mask "
                                       "Search' output, or a model node after it)."),
                io.Latent.Input("samples", optional=True,
                                tooltip="Connect the sampler's output here so the inspector "
                                        "runs after sampling (its value is not used)."),
                Preset.Input("preset", optional=True,
                             tooltip="Draw this preset's masks (default: the patched model's "
                                     "PSA preset)."),
                io.Int.Input("mask_layer", default=0, min=-1024, max=1023, optional=True,
                             tooltip="Transformer block whose per-head PSA masks are drawn "
                                     "(negative counts from the end)."),
            ],
            outputs=[
                io.Image.Output("density_map", display_name="density_map",
                                tooltip="Achieved density per block (rows) × step (columns); "
                                        "grey = dense."),
                io.Image.Output("head_density", display_name="head_density",
                                tooltip="Achieved density per block (rows) × head (columns)."),
                io.Image.Output("psa_masks", display_name="psa_masks",
                                tooltip="Per-head block masks of the PSA preset for mask_layer "
                                        "(rows: query blocks, columns: key blocks; light = "
                                        "computed)."),
                io.String.Output("summary", display_name="summary",
                                 tooltip="JSON summary of the last run."),
            ],
        )

    @classmethod
    def execute(cls, model=None, samples=None, preset=None, mask_layer=0) -> io.NodeOutput:
        images, info = render(model, preset, mask_layer)
        previews = []
        for img in images:
            previews += ui.PreviewImage(img, cls=cls).values
        return io.NodeOutput(*images, json.dumps(info, indent=1),
                             ui=ui.SavedImages(previews))


def render(model=None, preset=None, mask_layer=0):
    """``([density_map, head_density, psa_masks] IMAGE tensors, summary dict)``."""
    d = dispatcher_of(model) if model is not None else None
    s = d.summary() if d is not None else None
    if s is None:
        why = "NOT A PATCHED MODEL" if model is not None else "NO MODEL CONNECTED"
        density = draw.message_image("ACHIEVED DENSITY", why)
        heads = draw.message_image("DENSITY PER HEAD", why)
        info = {"error": why.lower()}
    else:
        info = summary_json(s)
        a, steps = density_matrix(s)
        if not np.isfinite(a).any():
            density = draw.message_image("ACHIEVED DENSITY", "NO SPARSE CALL IN THE LAST RUN")
        else:
            density = draw.heatmap(a, f"ACHIEVED DENSITY  {s.get('method', '')}  MEAN "
                                      f"{100 * s['mean_density']:.1f}%", "LAYER",
                                   "STEP", col_names=steps)
        h = head_matrix(s)
        if h.size == 0 or not np.isfinite(h).any():
            heads = draw.message_image("DENSITY PER HEAD", "NO SPARSE CALL IN THE LAST RUN")
        else:
            heads = draw.heatmap(h, "DENSITY PER HEAD  (LAYER X HEAD)", "LAYER", "HEAD")
    if preset is None and d is not None:
        preset = d.method.preset
    if preset is None:
        masks = draw.message_image("PSA MASKS", "NO PSA PRESET")
    else:
        grid = s.get("grid") if s is not None else None
        policy = d.config.preset_grid if d is not None else "refuse"
        try:
            m, dens, g, layer = preset_masks(preset, int(mask_layer), grid, policy)
        except ValueError as e:
            masks = draw.message_image("PSA MASKS", "CANNOT DRAW THEM: SEE THE SUMMARY")
            info["psa_masks"] = {"preset": getattr(preset, "name", None), "error": str(e)}
        else:
            titles = [f"H{h} {100 * float(x):.0f}%" for h, x in enumerate(dens)]
            masks = draw.mask_tiles(m, titles, f"PSA {preset.name} LAYER {layer} GRID "
                                               f"{'X'.join(map(str, g))}")
            info["psa_masks"] = {"preset": preset.name, "layer": layer, "grid": list(g),
                                 "tile": list(preset.tile),
                                 "head_density": [round(float(x), 4) for x in dens]}
    return [to_image(density), to_image(heads), to_image(masks)], info


__all__ = ["SparseAttentionInspector", "render", "summary_json"]

"""The "PSA Mask Search" and "PSA Mask Select" nodes: the search runs inside an ordinary
ComfyUI sampling run, where the model's own q, k, v are at hand.

Workflow: model loader → PSA Mask Search → the usual sampler (its video is rendered dense, as
without the node). Each sampling run writes or extends ``models/psa_loss_tables/<name>
.safetensors``. Then PSA Mask Select reads a table, picks one mask per (layer, head) by a loss
budget α or a target sparsity, writes the preset to ``models/sparse_attention_presets/`` and
outputs it for Sparse Attention Patch. Changing α or the target re-reads the table only.
"""
from __future__ import annotations

import json
import os

from comfy_api.latest import io

from ._kernels import kernels
from .node_patch import Preset
from .presets import KNOWN_FAMILIES, MODELS_SUBFOLDER, presets_dir
from .search import (MAX_CANDIDATES, QKV_SUBFOLDER, SET_ASIDE, TABLES_SUBFOLDER, make_search_config,
                     patch_model_for_search)

CATEGORY = "model_patches/sparse_attention"


def list_tables() -> list[str]:
    """The loss tables Select offers: those in models/psa_loss_tables/ but the ones set aside."""
    try:
        import folder_paths
        names = folder_paths.get_filename_list(TABLES_SUBFOLDER)
    except Exception:
        return []
    return sorted(n for n in names if not SET_ASIDE.fullmatch(n))


class PSAMaskSearch(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="PSAMaskSearch",
            display_name="PSA Mask Search",
            category=CATEGORY,
            description="Search PSA stripe masks for this model and resolution during an "
                        "ordinary sampling run: every video self-attention call of the chosen "
                        "steps evaluates all candidate masks against its dense output. The "
                        "video itself is rendered dense. Writes a loss table to "
                        f"models/{TABLES_SUBFOLDER}/ for 'PSA Mask Select'.",
            inputs=[
                io.Model.Input("model", tooltip="The video model to search masks for (a copy is "
                               "returned; connect it to the sampler)."),
                io.String.Input("table_name", default="psa_search",
                                tooltip=f"File name (without .safetensors) of the loss table in "
                                        f"models/{TABLES_SUBFOLDER}/; A-Z a-z 0-9 . _ -"),
                io.String.Input("tile", default="3,8,16",
                                tooltip="PSA block (tile) bt,bh,bw in latent tokens after "
                                        "patchify: frames, rows, columns. Masks are searched on "
                                        "the block grid ceil(grid / tile). 3,8,16 suits Wan "
                                        "720p (grid 21×45×80). Each axis at most 256, at most "
                                        "4096 tokens in all; the block grid may have at most "
                                        "2048 blocks."),
                io.String.Input("steps", default="",
                                tooltip="Denoising steps (0-based, of the full schedule) whose "
                                        "attention calls are evaluated: indices or ranges, "
                                        "comma separated, negative from the end, e.g. "
                                        "\"2-8\". Empty = every step."),
                io.String.Input("bucket_edges", default="",
                                tooltip="Optional step buckets: ascending progress values in "
                                        "(0, 1) (progress = step / steps), e.g. \"0.5\" gives "
                                        "separate masks for the first and second half. Empty = "
                                        "one mask per head for all steps."),
                io.Int.Input("max_candidates", default=128, min=1, max=MAX_CANDIDATES,
                             tooltip="Candidate masks per head (the dense mask and the SVG/STA "
                                     "shaped anchors are always kept; the rest sampled with the "
                                     "seed). Cost grows linearly."),
                io.Int.Input("query_tiles", default=32, min=0, max=100000,
                             tooltip="Query blocks sampled per call to measure the loss "
                                     "(0 = all). Cost knob; see kernels/psa_search.py."),
                io.Int.Input("rows_per_tile", default=32, min=0, max=100000,
                             tooltip="Query rows sampled per sampled block (0 = all)."),
                io.Int.Input("seed", default=0, min=0, max=2**31 - 1,
                             tooltip="Seed of the candidate and row sampling."),
                io.Boolean.Input("accumulate", default=True,
                                 tooltip="Add this run to an existing table of the same name "
                                         "(one run per prompt: 1-3 prompts are typical). Off: "
                                         "overwrite."),
                io.Boolean.Input("save_qkv", default=False,
                                 tooltip="Also save each evaluated call's q, k, v to "
                                         f"models/{QKV_SUBFOLDER}/<table_name>/ for the offline "
                                         "search (python -m kernels.psa_search search ...). The "
                                         "size is estimated and logged before writing."),
                io.Float.Input("qkv_max_gb", default=20.0, min=0.0, max=100000.0, step=1.0,
                               tooltip="save_qkv writes nothing when the estimate for this run "
                                       "plus the samples already in the table's sample folder "
                                       "exceeds this many gigabytes (10^9 bytes)."),
            ],
            outputs=[io.Model.Output(tooltip="The model with the search attached; its sampled "
                                             "output equals the input model's.")],
        )

    @classmethod
    def execute(cls, model, table_name="psa_search", tile="3,8,16", steps="", bucket_edges="",
                max_candidates=128, query_tiles=32, rows_per_tile=32, seed=0, accumulate=True,
                save_qkv=False, qkv_max_gb=20.0) -> io.NodeOutput:
        cfg = make_search_config(table_name, tile, steps, bucket_edges, max_candidates,
                                 query_tiles, rows_per_tile, seed, accumulate, save_qkv,
                                 qkv_max_gb)
        return io.NodeOutput(patch_model_for_search(model, cfg))


class PSAMaskSelect(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="PSAMaskSelect",
            display_name="PSA Mask Select",
            category=CATEGORY,
            description="Pick one stripe mask per layer and head from a PSA loss table (by loss "
                        "budget α or target sparsity), save it as a preset and output it. "
                        "Re-reads the table only: changing α is instant.",
            inputs=[
                io.Combo.Input("table", options=list_tables(),
                               tooltip=f"Loss table from 'PSA Mask Search' in "
                                       f"models/{TABLES_SUBFOLDER}/ (refresh the page after a "
                                       "search run to see a new one; tables the search set "
                                       "aside as .corrupt-… or .replaced-… are not listed)."),
                io.Combo.Input("rule", options=["alpha", "target_sparsity"], default="alpha",
                               tooltip="alpha: per head the sparsest mask whose loss ≤ α. "
                                       "target_sparsity: per head the lowest-loss mask at least "
                                       "that sparse."),
                io.Float.Input("alpha", default=0.01, min=0.0, max=1e6, step=0.0001,
                               tooltip="Loss budget per head (metric below; mse is in squared "
                                       "units of the attention output, rel is relative to its "
                                       "energy). Larger = sparser."),
                io.Float.Input("target_sparsity", default=0.6, min=0.0, max=1.0, step=0.01,
                               tooltip="Fraction of block pairs to skip per head (0.6 = 40 % "
                                       "density)."),
                io.Combo.Input("metric", options=["mse", "rel"], default="rel",
                               tooltip="mse: mean squared error of the output; rel: squared "
                                       "error divided by the squared dense output (scale-free)."),
                io.String.Input("preset_name", default="my_preset",
                                tooltip=f"Name of the preset; written to models/{MODELS_SUBFOLDER}/"
                                        "<name>.json where 'Load Stripe Mask Preset' lists it."),
                io.String.Input("author", default="", optional=True,
                                tooltip="Optional author stored in the preset."),
                io.Boolean.Input("overwrite", default=False, optional=True,
                                 tooltip="Replace an existing preset file of that name."),
            ],
            outputs=[
                Preset.Output(tooltip="The selected preset, for 'Sparse Attention Patch'."),
                io.String.Output(tooltip="JSON: preset file, sparsity, mean loss, per-layer "
                                         "sparsity."),
            ],
        )

    @classmethod
    def execute(cls, table, rule="alpha", alpha=0.01, target_sparsity=0.6, metric="rel",
                preset_name="my_preset", author="", overwrite=False) -> io.NodeOutput:
        import folder_paths
        shown = kernels.shown
        # the widgets first: an error names the widget that causes it, never the table
        kernels.check_preset_name(preset_name, "preset_name")
        if rule not in ("alpha", "target_sparsity"):
            raise ValueError(f"rule: expected alpha or target_sparsity, got {shown(rule)}")
        author = kernels.check_preset_text(author or "", "author", kernels.MAX_AUTHOR)
        try:
            out = os.path.join(presets_dir(), f"{preset_name}.json")
        except OSError as e:
            raise ValueError(f"preset_name: cannot create the preset folder ({e.strerror or type(e).__name__}: "
                             f"{e.filename})") from None
        path = folder_paths.get_full_path(TABLES_SUBFOLDER, table) if table else None
        if not path:
            raise ValueError(f"table: {shown(table)} is not in models/{TABLES_SUBFOLDER}/")
        try:
            t = kernels.LossTable.load(path)  # validated: its grid, tile and settings are bounded
        except (ValueError, OSError) as e:
            raise ValueError(f"table: {e}") from None
        st = t.settings
        missing = [k for k in ("family", "fingerprint") if k not in st]
        if missing:
            raise ValueError(f"table: {shown(table)} has no {', '.join(missing)} (not written by 'PSA "
                             "Mask Search'); select with python -m kernels.psa_search select "
                             "--fingerprint ...")
        if rule == "alpha":
            sel = t.select(alpha=alpha, metric=metric)
        else:
            sel = t.select(target_sparsity=target_sparsity, metric=metric)
        try:
            preset = kernels.preset_from_selection(
                sel, name=preset_name, family=st["family"], model_name=st.get("model_name", ""),
                fingerprint=st["fingerprint"], grid=t.grid, tile=t.tile,
                candidates=int(t.candidates.shape[0]), prompts=st.get("prompts", 1),
                settings=st, author=author, known_families=KNOWN_FAMILIES,
                notes=f"Searched in ComfyUI with 'PSA Mask Search' (table {table}, steps "
                      f"{str(st.get('steps', 'all'))[:100]}, {int(t.calls.sum())} calls).")
        except ValueError as e:
            raise ValueError(f"table: {shown(table)}: {e}") from None
        try:
            kernels.save_preset(preset, out, overwrite=bool(overwrite))  # never through a link
        except ValueError as e:
            raise ValueError(f"preset_name: {e}") from None
        info = {"preset": out, "rule": sel.rule, "sparsity": preset.stats["sparsity"],
                "mean_loss": preset.stats["mean_loss"],
                "layer_sparsity": preset.stats["layer_sparsity"],
                "never_evaluated_heads": int(sel.missing.sum()),
                "grid": list(t.grid), "tile": list(t.tile)}
        return io.NodeOutput(preset, json.dumps(info, indent=1))

"""The "Sparse Attention Patch" node (MODEL → MODEL)."""
from __future__ import annotations

from comfy_api.latest import io

from ._kernels import kernels
from .config import BACKENDS, BESIDE_CORE, ESTIMATORS, METHODS, PRECISIONS, PRESET_GRID_POLICIES, make_config
from .patching import patch_model

PRESET_TYPE = "SPARSE_MASK_PRESET"
Preset = io.Custom(PRESET_TYPE)

_DENSITY_TABLE = "β 1.0 → ~16 % of key blocks exact, 1.5 → ~7 %, 2.0 → ~2.3 % (density = 1 − Φ(β))"
_BETA_RANGE = (f"Documented range {kernels.BETA_MIN:g} to {kernels.BETA_MAX:g} (density "
               f"~{100 * kernels.density_for_beta(kernels.BETA_MIN):.0f} % down to "
               f"~{100 * kernels.density_for_beta(kernels.BETA_MAX):.3f} %); a value outside it "
               "runs, with a warning in the console")


class SparseAttentionPatch(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="SparseAttentionPatch",
            display_name="Sparse Attention Patch",
            category="model_patches/sparse_attention",
            description="Swap the video self-attention of Wan, HunyuanVideo, LTX-Video or LTX-2 "
                        "for training-free sparse attention (Sol-Attn or PSA). Cross, text and "
                        "audio attention stay dense; every call the node cannot take runs the "
                        "normal attention.",
            inputs=[
                io.Model.Input("model", tooltip="The video diffusion model to patch (a patched "
                               "copy is returned; the input model is unchanged)."),
                io.Combo.Input("method", options=list(METHODS), default="sol_attn",
                               tooltip="sol_attn: dynamic block routing per query block "
                                       "(no preset needed). psa: static per-head stripe masks "
                                       "from a preset. dense: leave attention unchanged."),
                io.Float.Input("beta", default=1.5, min=-10.0, max=10.0, step=0.05,
                               tooltip="Sol-Attn threshold in standard deviations of the proxy "
                                       "scores (unitless). Higher = sparser. " + _DENSITY_TABLE
                                       + ". " + _BETA_RANGE + ". Ignored when target_sparsity > 0."),
                io.Float.Input("target_sparsity", default=0.0, min=0.0, max=0.99, step=0.01,
                               tooltip="Alternative to beta: the fraction of key blocks to skip "
                                       "(0 = use beta). β is derived as Φ⁻¹(target_sparsity); "
                                       "expected density = 1 − target_sparsity, e.g. 0.85 → "
                                       "β ≈ 1.04, 0.90 → β ≈ 1.28."),
                io.Combo.Input("estimator", options=list(ESTIMATORS), default="exact",
                               tooltip="How Sol-Attn estimates the spread of the proxy scores: "
                                       "exact (d×d covariance) or diag (diagonal, cheaper)."),
                io.Float.Input("warmup", default=0.2, min=0.0, max=1.0, step=0.01,
                               tooltip="Fraction of the denoising steps (of the full schedule, "
                                       "also across KSamplerAdvanced splits) that run dense at "
                                       "the start, rounded to whole steps (halves up). 0.2 = "
                                       "first 20 % (the papers' setting): 10 of 50 steps, 1 of "
                                       "4, 2 of 8."),
                io.Float.Input("final_dense", default=0.0, min=0.0, max=1.0, step=0.01,
                               tooltip="Fraction of the denoising steps that run dense at the "
                                       "end, rounded to whole steps (halves up; 0 = none)."),
                io.String.Input("dense_blocks", default="0",
                                tooltip="Transformer blocks that stay dense: indices or ranges, "
                                        "comma separated; negative counts from the end. "
                                        "\"0\" = first block (the papers' setting), "
                                        "\"0-1,-1\" = first two and the last, \"\" = none."),
                io.Int.Input("min_tokens", default=4096, min=0, max=10_000_000, step=256,
                             tooltip="Sequences shorter than this many tokens stay dense "
                                     "(sparse kernels pay off on long videos only)."),
                io.String.Input("sol_tile", default="auto",
                                tooltip="Sol-Attn only: the 64-token blocks. \"auto\" = 3D tiles "
                                        "of the video's latent grid (frames × rows × columns, the "
                                        "tile that pads the grid least, e.g. 1,8,8 at 720p): each "
                                        "block is a compact patch, which routes and pools far "
                                        "better than a sliver of one row. \"bt,bh,bw\" with "
                                        "bt·bh·bw = 64 picks one; \"off\" = row-major blocks."),
                io.Combo.Input("backend", options=list(BACKENDS), default="auto",
                               tooltip="auto: Triton kernels on CUDA, dense elsewhere. triton: "
                                       "always the Triton kernels. reference: the float32 "
                                       "reference (slow; for CPU tests and debugging)."),
                Preset.Input("preset", optional=True,
                             tooltip="Stripe-mask preset for method psa, from 'Load Stripe Mask "
                                     "Preset' or 'PSA Mask Select'. Checked against the "
                                     "model (family, layers, heads, head dim, hidden size) "
                                     "when the patch is applied."),
                io.Combo.Input("preset_grid", options=list(PRESET_GRID_POLICIES),
                               default="refuse", optional=True,
                               tooltip="PSA only: what happens when the video's token grid "
                                       "differs from the preset's. Same block grid (grid ÷ tile, "
                                       "rounded up): the masks apply unchanged. Otherwise refuse: "
                                       "those calls stay dense with a warning naming both grids; "
                                       "rescale: stripe widths, offsets and strides are scaled "
                                       "to the new block grid (approximate, warned once)."),
                # New widgets go last, so that saved workflows keep the order of those before.
                io.Combo.Input("beside_core_node", options=list(BESIDE_CORE), default="defer",
                               optional=True,
                               tooltip="When ComfyUI's own 'Model Sparse Attention' node is on "
                                       "the same model (in either order: it puts itself back on "
                                       "top at every step and hands the calls it declines to the "
                                       "attention before it). defer: this patch stands aside for "
                                       "the run, so two sparse methods never mix (warned, counted "
                                       "as core_sparse_node). share: this patch runs the video "
                                       "self-attention calls ComfyUI's node declines (e.g. "
                                       "LTX-Video's head dim 64). Without that node: no effect."),
                io.Combo.Input("precision", options=list(PRECISIONS), default="auto", optional=True,
                               tooltip="Precision of the sparse kernels' exact blocks (QKᵀ). auto: the "
                                       "measured faster one for this GPU's architecture and the method, logged"
                                       " once and shown in the Inspector's summary (int8 on A100 and RTX "
                                       "30/40/50, and for PSA on H100/H200; else bf16). bf16: the model's "
                                       "dtype (bf16 or fp16). int8: q and k in int8, per block, k minus its "
                                       "mean first (SageAttention-style); the values, Sol's routing and its "
                                       "pooled term stay in the model's dtype; it adds about 0.0004 to the "
                                       "attention's relative error; it ran faster than bf16 on A100 and RTX "
                                       "30/40/50 settings and for PSA on H100/H200 (README, Precision). fp8: "
                                       "the same in float8 e4m3 (scale per block = max / 448) on fp8 tensor "
                                       "cores; RTX 40/50, H100/H200, B200 only (refused with an error on A100 "
                                       "and RTX 30); as fast as int8, adds about 0.003. backend reference: the"
                                       " float32 reference of that precision."),
            ],
            outputs=[io.Model.Output(tooltip="The patched model.")],
        )

    @classmethod
    def execute(cls, model, method="sol_attn", beta=1.5, target_sparsity=0.0,
                estimator="exact", warmup=0.2, final_dense=0.0, dense_blocks="0",
                min_tokens=4096, sol_tile="auto", backend="auto", preset=None,
                preset_grid="refuse", beside_core_node="defer", precision="auto") -> io.NodeOutput:
        config = make_config(method=method, beta=beta, target_sparsity=target_sparsity,
                             estimator=estimator, warmup=warmup, final_dense=final_dense,
                             dense_blocks=dense_blocks, min_tokens=min_tokens, sol_tile=sol_tile,
                             backend=backend, preset_grid=preset_grid,
                             beside_core_node=beside_core_node, precision=precision)
        return io.NodeOutput(patch_model(model, config, preset=preset))

"""The "Load Stripe Mask Preset" node."""
from __future__ import annotations

from comfy_api.latest import io

from .node_patch import Preset
from .presets import MODELS_SUBFOLDER, list_presets, load_named_preset


class LoadStripeMaskPreset(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="LoadStripeMaskPreset",
            display_name="Load Stripe Mask Preset",
            category="model_patches/sparse_attention",
            description="Load a PSA stripe-mask preset (per layer and head mask parameters "
                        "searched offline for one model and resolution).",
            inputs=[
                io.Combo.Input("preset_name", options=list_presets(),
                               tooltip="Presets shipped in the pack's mask_presets/ folder and "
                                       f"files dropped into models/{MODELS_SUBFOLDER}/. It is "
                                       "checked against the model (family, layers, heads, head "
                                       "dim, hidden size) when the patch is applied."),
            ],
            outputs=[Preset.Output(tooltip="The preset, for 'Sparse Attention Patch'.")],
        )

    @classmethod
    def execute(cls, preset_name) -> io.NodeOutput:
        return io.NodeOutput(load_named_preset(preset_name))

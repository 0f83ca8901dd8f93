"""Wan 2.1 / 2.2 (t2v, i2v, and the variants built on ``WanModel``'s blocks).

- Video self-attention: the one attention call made inside ``blocks[i].self_attn``.
  Cross-attention (text, and CLIP image for i2v) runs in ``blocks[i].cross_attn`` and stays
  dense. VACE's extra ``vace_blocks`` are not hooked (they stay dense).
- Block index: the hooked block's position in ``diffusion_model.blocks``.
- Grid: latent (B, C, T, H, W) divided by ``patch_size`` (rounded up, as Wan pads); extra
  whole frames (reference latent, time-concat) are counted as frames.
"""
from __future__ import annotations

from .base import Adapter, ModelInfo


class WanAdapter(Adapter):
    family = "wan"

    @staticmethod
    def matches(dm) -> bool:
        try:
            from comfy.ldm.wan.model import WanModel
        except ImportError:  # pragma: no cover
            return False
        return isinstance(dm, WanModel) and hasattr(dm, "blocks")

    def info(self, dm) -> ModelInfo:
        return ModelInfo(self.family, len(dm.blocks), int(dm.num_heads),
                         int(dm.dim // dm.num_heads))

    def patch_size(self, dm):
        return tuple(dm.patch_size)

    def hook_targets(self, dm):
        for i, block in enumerate(dm.blocks):
            attn = getattr(block, "self_attn", None)
            if attn is not None:
                yield attn, i, "video"

"""LTX-Video 0.9.x (``comfy/ldm/lightricks/model.py``, head dim 64).

- Video self-attention: the call inside ``transformer_blocks[i].attn1``; ``attn2`` (text
  cross-attention) stays dense.
- Block index: position in ``transformer_blocks`` (ComfyUI publishes none for LTX).
- Grid: latent (B, C, T, H, W) with the patchifier's patch size (1, 1, 1); guide/keyframe
  latents appended along T count as frames.
"""
from __future__ import annotations

from .base import Adapter, ModelInfo


def _ltxv_class():
    try:
        from comfy.ldm.lightricks.model import LTXVModel
        return LTXVModel
    except ImportError:  # pragma: no cover
        return None


class LTXVAdapter(Adapter):
    family = "ltxv"

    @staticmethod
    def matches(dm) -> bool:
        cls = _ltxv_class()
        return cls is not None and isinstance(dm, cls) and hasattr(dm, "transformer_blocks")

    def info(self, dm) -> ModelInfo:
        attn = dm.transformer_blocks[0].attn1  # the video self-attention
        return ModelInfo(self.family, len(dm.transformer_blocks), int(attn.heads),
                         int(attn.dim_head))

    def patch_size(self, dm):
        p = getattr(getattr(dm, "patchifier", None), "patch_size", None)
        return tuple(p) if p is not None else (1, 1, 1)

    def hook_targets(self, dm):
        for i, block in enumerate(dm.transformer_blocks):
            yield block.attn1, i, "video"

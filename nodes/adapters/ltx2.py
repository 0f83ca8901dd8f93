"""LTX-2 audio+video (``comfy/ldm/lightricks/av_model.py``, newer ComfyUI only).

- Video self-attention: ``transformer_blocks[i].attn1``. Audio self-attention
  (``audio_attn1``), text cross-attention (``attn2``, ``audio_attn2``) and the audio↔video
  cross-attentions (``audio_to_video_attn``, ``video_to_audio_attn``) are not hooked and
  stay dense.
- Grid: the video latent, which newer ComfyUI passes packed with ``latent_shapes`` (the
  first shape is the video) or as a list [video, audio].
"""
from __future__ import annotations

from .ltxv import LTXVAdapter


def _ltxav_class():
    try:
        from comfy.ldm.lightricks.av_model import LTXAVModel
        return LTXAVModel
    except ImportError:  # ComfyUI before LTX-2 support
        return None


class LTX2Adapter(LTXVAdapter):
    family = "ltx2"

    @staticmethod
    def matches(dm) -> bool:
        cls = _ltxav_class()
        return cls is not None and isinstance(dm, cls)

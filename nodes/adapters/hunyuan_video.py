"""HunyuanVideo (``comfy/ldm/hunyuan_video/model.py``).

- Video self-attention: every attention call inside ``double_blocks[i]`` and
  ``single_blocks[j]`` is the joint attention over the image and the text tokens (q/k/v
  arrive as (B, H, L, D) with ``skip_reshape``). The text refiner's attention runs outside
  these blocks and stays dense.
- Join order: ComfyUI 0.3.75 builds the double blocks with ``flipped_img_txt=True`` and joins
  [image, text] in both kinds of block; 0.33 dropped the flag and joins [text, image]. The
  dispatcher hands the kernels the image tokens first either way (``video_start``).
- Block index: double block i → i, single block j → len(double_blocks) + j (so "-1" is the
  last single block). ComfyUI's ``block_index`` restarts at 0 for the single blocks.
- Image/text split: the double-block pre-hook sees ``img`` and records its length; single
  blocks reuse it (their input is the two joined). Text tokens are Sol-Attn sinks and PSA's
  extra tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from .base import Adapter, ModelInfo, first_tensor_arg


@dataclass(frozen=True)
class JointRole:
    """What a hooked block's attention call holds: ``double`` blocks see the image tokens
    alone in their input (their length is recorded); ``text_first``: ComfyUI joins [text,
    image] rather than [image, text]."""
    double: bool
    text_first: bool


class HunyuanVideoAdapter(Adapter):
    family = "hunyuan_video"

    @staticmethod
    def matches(dm) -> bool:
        try:
            from comfy.ldm.hunyuan_video.model import HunyuanVideo
        except ImportError:  # pragma: no cover
            return False
        return isinstance(dm, HunyuanVideo)

    def info(self, dm) -> ModelInfo:
        n = len(dm.double_blocks) + len(dm.single_blocks)
        return ModelInfo(self.family, n, int(dm.num_heads), int(dm.hidden_size // dm.num_heads))

    def patch_size(self, dm):
        return tuple(dm.patch_size)

    def hook_targets(self, dm):
        text_first = not all(getattr(block, "flipped_img_txt", False) for block in dm.double_blocks)
        nd = len(dm.double_blocks)
        for i, block in enumerate(dm.double_blocks):
            yield block, i, JointRole(double=True, text_first=text_first)
        for j, block in enumerate(dm.single_blocks):
            yield block, nd + j, JointRole(double=False, text_first=text_first)

    def observe(self, role, args, kwargs, info):
        info["text_first"] = role.text_first
        if role.double:
            img = first_tensor_arg(args, kwargs, "img", 0)
            if img is not None:
                info["img_len"] = int(img.shape[1])

    def video_tokens(self, seq_len, grid, hook_info):
        img_len = hook_info.get("img_len")
        if img_len is None or img_len > seq_len:
            return None
        hw = grid[1] * grid[2]
        return img_len if img_len % hw == 0 else None

    def video_start(self, seq_len, n_video, hook_info):
        return seq_len - n_video if hook_info.get("text_first") else 0

"""What an adapter tells the dispatcher about one model family.

An adapter is stateless: it inspects the diffusion model object and the latent; the per-run
state lives in the dispatcher. How each family finds its facts:

- video self-attention and the block index: forward pre-hooks on exactly the modules whose
  attention call is the video self-attention (registered for one sampling run by the
  dispatcher, removed afterwards). ComfyUI ≥ 0.3.7x publishes ``block_index`` for some
  families; the hook value is the same number and works on every version.
- the token grid (T, H, W): from the latent the diffusion model receives and the model's
  patch size (the latent is seen by the dispatcher's APPLY_MODEL wrapper, outside any
  ``torch.compile`` region).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class ModelInfo:
    family: str
    num_blocks: int
    num_heads: int
    head_dim: int


class Adapter:
    family = "base"

    @staticmethod
    def matches(dm) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def info(self, dm) -> ModelInfo:  # pragma: no cover - abstract
        raise NotImplementedError

    def patch_size(self, dm) -> tuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def hook_targets(self, dm):
        """Yield ``(module, block_index, role)`` for every module whose attention calls are
        video self-attention. ``role`` is whatever the adapter's ``observe`` reads (the
        dispatcher only asks whether a hooked module is active): "video" (only video tokens)
        here, HunyuanVideo's ``JointRole`` for its joint attention over video and text."""
        raise NotImplementedError  # pragma: no cover

    def observe(self, role: str, args, kwargs, info: dict) -> None:
        """Called from the pre-hook: record per-forward facts (e.g. HunyuanVideo's image
        length) into ``info``, which lives for one diffusion-model forward."""
        return None

    # --- grid -------------------------------------------------------------------------
    @staticmethod
    def video_latent(x, extra: dict):
        """The video latent (B, C, T, H, W) among what the diffusion model receives."""
        shapes = extra.get("latent_shapes") if extra else None
        if shapes:  # newer ComfyUI packs audio+video latents into one tensor
            return tuple(shapes[0])
        if isinstance(x, (list, tuple)):
            x = x[0]
        tensors = getattr(x, "tensors", None)  # comfy.nested_tensor.NestedTensor
        if tensors:
            x = tensors[0]
        return tuple(x.shape)

    def grid(self, dm, x, extra: dict) -> Optional[tuple]:
        """Token grid (T, H, W) after patchify, or None when the latent is not a video."""
        shape = self.video_latent(x, extra)
        ps = tuple(self.patch_size(dm))
        if len(shape) == 5:
            t, h, w = shape[2:]
        elif len(shape) == 4:  # image models sharing a video class (T = 1)
            t, (h, w) = 1, shape[2:]
        else:
            return None
        if len(ps) == 2:
            ps = (1,) + ps
        return (math.ceil(t / ps[0]), math.ceil(h / ps[1]), math.ceil(w / ps[2]))

    def video_tokens(self, seq_len: int, grid, hook_info: dict) -> Optional[int]:
        """How many of the ``seq_len`` tokens are grid tokens (``video_start`` says where)."""
        n = grid[0] * grid[1] * grid[2]
        if seq_len == n:
            return n
        # extra whole frames (Wan reference/time-concat frames, LTX guide frames)
        hw = grid[1] * grid[2]
        if seq_len % hw == 0:
            return seq_len
        return None

    def video_start(self, seq_len: int, n_video: int, hook_info: dict) -> int:
        """Index of the first of the ``n_video`` grid tokens among the ``seq_len`` tokens of
        a call (0: the video comes first). The dispatcher moves them to the front for the
        kernels, whose grid is the first tokens, and puts the output back in this order."""
        return 0


def register_hooks(adapter: Adapter, dm, enter: Callable, leave: Callable) -> list:
    """Register the adapter's pre/post hooks; return the handles (caller removes them)."""
    handles = []
    for module, block, role in adapter.hook_targets(dm):
        def pre(mod, args, kwargs, _b=block, _r=role):
            enter(_b, _r, args, kwargs)
            return None

        def post(mod, args, kwargs, output, _b=block):
            leave(_b)
            return None

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    return handles


def first_tensor_arg(args, kwargs, name: str, pos: int = 0):
    v = kwargs.get(name) if kwargs else None
    if v is None and len(args) > pos:
        v = args[pos]
    return v if torch.is_tensor(v) else None

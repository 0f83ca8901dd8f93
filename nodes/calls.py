"""One attention call as ComfyUI hands it to an ``optimized_attention_override``: its
arguments, and its tokens in the order the kernels take them.

ComfyUI ≥ 0.33 can hand ``wrap_attn`` ``AttentionTensorContainer`` inputs; an override
without a ``container_function`` attribute (the dispatcher) gets plain tensors from ComfyUI,
and containers that arrive anyway are unwrapped before anything else.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ._kernels import kernels


def unwrap_containers(args):
    """q, k, v taken out of ComfyUI's AttentionTensorContainer (single-owner) inputs."""
    if len(args) >= 3 and not torch.is_tensor(args[0]) and hasattr(args[0], "take"):
        return (args[0].take(), args[1].take(), args[2].take()) + tuple(args[3:])
    return args


class Call(NamedTuple):
    """The facts of one attention call: q, k, v as (B, H, L, D) with ``skip_reshape``, else
    (B, L, H·D), and the keyword options the kernels care about."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    heads: int
    mask: Optional[torch.Tensor]
    skip_reshape: bool
    skip_output_reshape: bool
    low_precision: bool        # False: the caller passed low_precision_attention=False
    enable_gqa: bool
    scale: object              # the caller's softmax scale keyword, None for 1/√head dim


def read_call(args, kwargs) -> Optional[Call]:
    """The :class:`Call` of an override call (positional or keyword, per family; see
    docs/COMFYUI_NOTES.md), or None when q, k, v or heads is missing."""
    q = args[0] if len(args) > 0 else kwargs.get("q")
    k = args[1] if len(args) > 1 else kwargs.get("k")
    v = args[2] if len(args) > 2 else kwargs.get("v")
    heads = args[3] if len(args) > 3 else kwargs.get("heads")
    if q is None or k is None or v is None or heads is None:
        return None
    mask = args[4] if len(args) > 4 else kwargs.get("mask")
    return Call(q, k, v, heads, mask, bool(kwargs.get("skip_reshape", False)),
                bool(kwargs.get("skip_output_reshape", False)),
                kwargs.get("low_precision_attention", True) is not False,
                bool(kwargs.get("enable_gqa", False)), kwargs.get("scale"))


def tokens_of(t: torch.Tensor, skip_reshape: bool) -> int:
    """Sequence length of a call's q/k/v: (B, H, L, D) with ``skip_reshape``, else (B, L, H·D)."""
    return t.shape[2] if skip_reshape else t.shape[1]


def blhd(t: torch.Tensor, heads: int, skip_reshape: bool) -> torch.Tensor:
    """q/k/v of a call as (B, L, H, D) (a view)."""
    if skip_reshape:  # (B, H, L, D)
        return t.transpose(1, 2)
    b, n, hd = t.shape
    return t.view(b, n, heads, hd // heads)


class VideoSpan(NamedTuple):
    """Where a call's video tokens are: ``count`` grid tokens of the (T, H, W) ``grid`` from
    token ``start`` of ``seq_len``; the others (text) are the kernels' extra tokens."""
    start: int
    count: int
    seq_len: int
    grid: tuple


def kernel_inputs(call: Call, span: VideoSpan) -> tuple:
    """A call's q, k, v as the kernels take them: (B, L, H, D), the video tokens first. A
    reorder copies along the call's own token axis (heads first with ``skip_reshape``), so
    the copy keeps the layout the kernels were measured on."""
    dim = 2 if call.skip_reshape else 1
    return tuple(blhd(kernels.tokens_to_front(t, span.start, span.count, dim=dim), call.heads, call.skip_reshape)
                 for t in (call.q, call.k, call.v))


def call_output(out: torch.Tensor, span: VideoSpan, call: Call) -> torch.Tensor:
    """A kernel's (B, L, H, D) output back in the call's token order and layout."""
    out = kernels.tokens_back(out, span.start, span.count)
    if call.skip_output_reshape:
        return out.transpose(1, 2)
    b, l, h, d = out.shape
    return out.reshape(b, l, h * d)

"""Which attention calls run sparse: pure functions of the call's facts (:class:`~.calls.Call`)
and the forward's facts (:class:`Forward`), giving a :class:`Plan` or a :class:`Dense` reason.

Rules, in order (the first that applies gives the reason a call stays dense):
``method_dense`` (the method strategy's own) → ``not_video_self_attention`` (cross, audio,
text refiner, anything outside a hooked module) → ``mask`` (a mask that changes the result:
LTX guides pass one to the video self-attention; an all-zero or all-True mask is dropped,
which is exact) → ``warmup`` / ``final_dense`` → ``dense_block`` → ``min_tokens`` → ``grid``
(tokens do not form the latent grid) → ``backend`` (auto on a machine without CUDA) /
``device`` / ``dtype`` / ``head_dim`` (all of them :func:`route`) → the method's own (its
strategy's ``plan``: Sol ``sol_tile``, the chosen tile pads this grid beyond the library's
limit; PSA ``preset_grid``, the preset refuses this token grid or its masks on it would exceed
the library's size limits) → ``low_precision`` (the caller passed
``low_precision_attention=False``, as ComfyUI 0.33 does for masked or image attention) →
``gqa`` (``enable_gqa``: the kernels take one key head per query head) / ``scale`` (a
``scale`` keyword the kernels refuse) → ``grad`` (q, k or v require gradients with grad mode
on: the kernels have no backward pass; all three :func:`admit`) → sparse, with the caller's
``scale`` if it passed one. An exception while planning (``plan_error``) or in the kernel
(``kernel_error``) falls back to dense: nothing a preset or a widget holds can fail the
sampler. ComfyUI's interrupt is never turned into a fallback (:func:`is_cancel`): Cancel stops
the run.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional, Union

import torch

from ._kernels import kernels
from .calls import Call, VideoSpan, tokens_of


class Dense(NamedTuple):
    """A call that stays dense: the reason (a key of ``report.REASON_TEXT``) and a detail."""
    reason: str
    detail: str = ""


class Plan(NamedTuple):
    """A call that runs sparse: on ``backend`` ("triton" or "reference"), over the video
    tokens of ``span``, with the caller's softmax ``scale`` (None: 1/√head dim); PSA adds the
    block's mask ``params`` (H, 6), which stay on the CPU (the kernel's schedule is built and
    cached there), and their per-head ``density`` (H,)."""
    backend: str
    span: VideoSpan
    scale: Optional[float] = None
    params: Optional[torch.Tensor] = None
    density: Optional[torch.Tensor] = None


Verdict = Union[Plan, Dense]


class Forward:
    """Facts about the diffusion-model forward in progress (one object per dispatcher, reused
    by every forward)."""
    __slots__ = ("active", "grid", "step", "total", "step_reason", "block", "role", "info",
                 "hooks_live", "module_calls")

    def __init__(self):
        self.active = False
        self.grid = None
        self.step = None
        self.total = None
        self.step_reason = None
        self.block = None
        self.role = None
        self.info = {}
        self.hooks_live = False
        self.module_calls = 0  # attention calls that reached the dispatcher in the module entered


def is_cancel(e: BaseException) -> bool:
    """True for ComfyUI's interrupt (the user's Cancel, ``/interrupt``). Every guard that turns
    an exception into a dense fallback re-raises it: ComfyUI clears its interrupt flag when it
    raises, so a swallowed one lets the run go on to the end."""
    mm = sys.modules.get("comfy.model_management")  # only ComfyUI's own, never imported here
    return mm is not None and isinstance(e, mm.InterruptProcessingException)


def progress(fwd: Forward) -> float:
    """Denoising progress of a forward: step / total steps (0 if unknown)."""
    return fwd.step / fwd.total if fwd.step is not None and fwd.total else 0.0


def step_reason(step: int, total: int, config) -> Optional[str]:
    """``warmup`` or ``final_dense`` for a step of ``total`` that the settings keep dense."""
    if step < config.warmup_steps(total):
        return "warmup"
    if step >= total - config.final_dense_steps(total):
        return "final_dense"
    return None


def mask_is_noop(mask) -> bool:
    """True for a mask that leaves attention unchanged: all-True boolean or all-zero additive."""
    if not torch.is_tensor(mask):
        return False
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return not bool(mask.any())


def self_attention_refusal(call: Call, fwd: Forward) -> Optional[Dense]:
    """None for a video self-attention call inside a forward, else why it is not one."""
    if not fwd.active or fwd.role is None or fwd.grid is None:
        return Dense("not_video_self_attention")
    if call.mask is not None and not mask_is_noop(call.mask):
        # inside a video self-attention module, also a query slice (LTX guides)
        lq, lk = tokens_of(call.q, call.skip_reshape), tokens_of(call.k, call.skip_reshape)
        return Dense("mask", f"mask {tuple(call.mask.shape)} on {lq} queries x {lk} keys")
    if tokens_of(call.q, call.skip_reshape) != tokens_of(call.k, call.skip_reshape):
        return Dense("not_video_self_attention")
    return None


def video_span(adapter, seq_len: int, fwd: Forward) -> Optional[VideoSpan]:
    """The video tokens of a call of ``seq_len`` tokens in this forward (its adapter says
    where they are), or None."""
    n_video = adapter.video_tokens(seq_len, fwd.grid, fwd.info)
    if n_video is None:
        return None
    hw = fwd.grid[1] * fwd.grid[2]
    start = adapter.video_start(seq_len, n_video, fwd.info)
    return VideoSpan(start, n_video, seq_len, (n_video // hw, fwd.grid[1], fwd.grid[2]))


def backend_refusal(backend: str, q: torch.Tensor, head_dim: int, interpret: bool) -> Optional[str]:
    """None when the ``backend`` widget's kernels take this call, else the reason."""
    if backend == "reference":
        return None
    if backend == "auto" and not q.is_cuda:
        return "backend"
    if not q.is_cuda and not interpret:
        return "device"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return "dtype"
    if head_dim not in (64, 128):
        return "head_dim"
    return None


def route(call: Call, fwd: Forward, config, dense_blocks: frozenset, adapter, interpret: bool) -> Verdict:
    """The rules every sparse method shares, from ``not_video_self_attention`` to
    ``head_dim`` (``interpret``: Triton's CPU interpreter is on)."""
    refusal = self_attention_refusal(call, fwd)
    if refusal is not None:
        return refusal
    if fwd.step_reason is not None:
        return Dense(fwd.step_reason)
    if fwd.block in dense_blocks:
        return Dense("dense_block")
    lq = tokens_of(call.q, call.skip_reshape)
    if lq < config.min_tokens:
        return Dense("min_tokens", f"{lq} < {config.min_tokens}")
    span = video_span(adapter, lq, fwd)
    if span is None:
        return Dense("grid", f"{lq} tokens, latent grid {fwd.grid}")
    head_dim = call.q.shape[-1] if call.skip_reshape else call.q.shape[-1] // call.heads
    why = backend_refusal(config.backend, call.q, head_dim, interpret)
    if why is not None:
        return Dense(why, f"{call.q.device.type} {call.q.dtype} head_dim={head_dim}")
    return Plan("reference" if config.backend == "reference" else "triton", span)


def admit(call: Call, plan: Plan) -> Verdict:
    """The caller's side, after the method planned the call: its keyword options the kernels
    honour (``scale``) or refuse (``low_precision_attention=False``, ``enable_gqa``, a scale
    out of the kernels' bounds), and whether it needs gradients."""
    if not call.low_precision:
        return Dense("low_precision")
    if call.enable_gqa:
        return Dense("gqa")
    scale = None
    if call.scale is not None:
        try:
            scale = kernels.resolve_scale(call.scale, 1)  # the kernels' own bounds
        except ValueError as e:
            return Dense("scale", str(e))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (call.q, call.k, call.v)):
        return Dense("grad")
    return plan._replace(scale=scale)

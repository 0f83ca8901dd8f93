"""Small named input checks shared by every public entry point.

Each check raises ``ValueError``/``TypeError`` whose message names the argument and says
what is accepted, so a bad call is fixed from the message alone.
"""
from __future__ import annotations

import math
import operator

import torch

from .sol_routing import warn_if_beta_outside_range

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
KERNEL_HEAD_DIMS = (64, 128)


def check_qkv(q, k, v, *, for_kernel: bool) -> tuple[int, int, int, int]:
    """Validate self-attention inputs of layout (B, L, H, D); return (B, L, H, D).

    ``for_kernel`` adds the Triton kernel's limits (CUDA, fp16/bf16, D in {64, 128}).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, L, H, D) (4 dims), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            "q, k and v must have the same shape (B, L, H, D) for self-attention, got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, L, H, D = q.shape
    if min(B, L, H, D) < 1:
        raise ValueError(f"q must have non-empty dimensions, got shape {tuple(q.shape)}")
    if for_kernel:
        if q.dtype not in KERNEL_DTYPES:
            raise TypeError(f"q/k/v dtype must be torch.float16 or torch.bfloat16 for the Triton kernel, got {q.dtype}")
        if D not in KERNEL_HEAD_DIMS:
            raise ValueError(f"head dim D must be one of {KERNEL_HEAD_DIMS} for the Triton kernel, got {D}")
        if q.device.type != "cuda" and not triton_interpreting():
            raise ValueError(
                f"q/k/v must be CUDA tensors for the Triton kernel, got device {q.device}; "
                "use the *_reference function on the CPU"
            )
    return B, L, H, D


def triton_interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_int(value, name: str, minimum: int) -> int:
    """``value`` as a Python int >= minimum (bools and floats refused), else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def resolve_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def per_head_beta(beta, num_heads: int, device) -> torch.Tensor:
    """β as a float32 tensor of shape (H,); ±inf allowed (all exact / none exact). A β outside
    the documented range (``sol_routing.BETA_MIN``/``BETA_MAX``) warns."""
    if isinstance(beta, torch.Tensor):
        if beta.dim() == 0:
            beta = beta.reshape(1).expand(num_heads)
        if beta.shape != (num_heads,):
            raise ValueError(f"beta must be a float or a tensor of shape (H,) = ({num_heads},), got {tuple(beta.shape)}")
        out = beta.detach().to(device=device, dtype=torch.float32)
    elif isinstance(beta, (int, float)) and not isinstance(beta, bool):
        out = torch.full((num_heads,), float(beta), device=device, dtype=torch.float32)
    else:
        raise TypeError(f"beta must be a float or a tensor of shape (H,), got {type(beta).__name__}")
    if torch.isnan(out).any():
        raise ValueError("beta must not be NaN")
    # the float as given: judging a float needs no copy of ``out`` from the device
    warn_if_beta_outside_range(out if isinstance(beta, torch.Tensor) else beta)
    return out


def check_estimator(estimator: str) -> str:
    if estimator not in ("exact", "diag"):
        raise ValueError(f"estimator must be 'exact' or 'diag', got {estimator!r}")
    return estimator


def check_token_ranges(ranges, seq_len: int, name: str = "sinks") -> list[tuple[int, int]]:
    """Validate a list of (start, end) token ranges, end exclusive, inside [0, seq_len]."""
    if ranges is None:
        return []
    out = []
    try:
        items = list(ranges)
    except TypeError:
        raise TypeError(f"{name} must be a list of (start, end) token ranges, got {type(ranges).__name__}") from None
    for r in items:
        try:
            start, end = (int(x) for x in r)
        except (TypeError, ValueError):
            raise TypeError(f"{name} entries must be (start, end) integer pairs, got {r!r}") from None
        if not 0 <= start < end <= seq_len:
            raise ValueError(f"{name} range ({start}, {end}) must satisfy 0 <= start < end <= L = {seq_len}")
        out.append((start, end))
    return out


def unit_stride_last_dim(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim has unit stride (the kernels walk D that way), else a copy;
    every other stride is passed to the kernels as is."""
    return x if x.stride(-1) == 1 else x.contiguous()

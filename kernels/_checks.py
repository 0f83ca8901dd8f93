"""Small named input checks shared by every public entry point.

Each check raises ``ValueError``/``TypeError`` whose message names the argument and says
what is accepted, so a bad call is fixed from the message alone.
"""
from __future__ import annotations

import math
import numbers
import operator

import torch

from ._device import kernel_device_ok

KERNEL_DTYPES = (torch.float16, torch.bfloat16)
FLOAT32_MAX = torch.finfo(torch.float32).max
FLOAT32_TINY = torch.finfo(torch.float32).tiny   # the smallest normal float32
KERNEL_HEAD_DIMS = (64, 128)


def check_qkv(q, k, v, *, for_kernel: bool) -> tuple[int, int, int, int]:
    """Validate self-attention inputs of layout (B, L, H, D); return (B, L, H, D).

    ``for_kernel`` adds the Triton kernel's limits (no gradients, CUDA, fp16/bf16, D in {64, 128}).
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
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise ValueError("q, k, v require gradients, and the Triton kernels have no backward pass (their "
                             "output would silently carry none): call them under torch.no_grad() or "
                             "torch.inference_mode(), or differentiate the *_reference function")
        if q.dtype not in KERNEL_DTYPES:
            raise TypeError(f"q/k/v dtype must be torch.float16 or torch.bfloat16 for the Triton kernel, got {q.dtype}")
        if D not in KERNEL_HEAD_DIMS:
            raise ValueError(f"head dim D must be one of {KERNEL_HEAD_DIMS} for the Triton kernel, got {D}")
        if not kernel_device_ok(q.device):
            raise ValueError(
                f"q/k/v must be CUDA tensors for the Triton kernel, got device {q.device}; "
                "use the *_reference function on the CPU"
            )
    return B, L, H, D


def shown(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages. Huge integers are
    described, not printed (Python refuses to print more than 4300 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return clip(repr(value), limit)


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_int(value, name: str, minimum: int, maximum: int | None = None) -> int:
    """``value`` as a Python int in [minimum, maximum] (bools and floats refused), else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {shown(value)}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {shown(value)}")
    return value


def check_number(value, name: str) -> float:
    """``value`` as a float: a real number (bools and text refused), not NaN, ±inf kept; else a
    TypeError or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {shown(value)}")
    try:
        out = float(value)
    except OverflowError:  # an integer beyond every float
        raise ValueError(f"{name}: out of range, got {shown(value)}") from None
    if math.isnan(out):
        raise ValueError(f"{name}: NaN is not allowed")
    return out


def resolve_scale(scale, head_dim: int) -> float:
    """The softmax scale: ``scale``, or 1/√head_dim for None. The scores are float32, where a
    scale outside float32's normal range becomes 0 or inf (all-NaN attention): refused."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        value = float(scale)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        value = math.nan
    if not FLOAT32_TINY <= value <= FLOAT32_MAX:
        raise ValueError(f"scale must be a positive number in float32's range [{FLOAT32_TINY:.4g}, "
                         f"{FLOAT32_MAX:.4g}], got {shown(scale)}")
    return value


def check_beta(beta, name: str = "beta") -> float:
    """A β given as a number: ±inf or a finite float32 (the routing computes in float32, where
    a larger finite value would silently become inf), never NaN; else a ValueError naming
    ``name``."""
    try:
        value = float(beta)
    except OverflowError:  # an integer beyond every float: finite, and far too large
        value = None
    if value is not None and math.isnan(value):
        raise ValueError(f"{name}: must not be NaN")
    if value is None or (math.isfinite(value) and abs(value) > FLOAT32_MAX):
        raise ValueError(f"{name}: must be -inf, inf or a number within float32's range "
                         f"(±{FLOAT32_MAX:.4g}), got {shown(beta)}")
    return value


def check_estimator(estimator: str) -> str:
    if estimator not in ("exact", "diag"):
        raise ValueError(f"estimator must be 'exact' or 'diag', got {shown(estimator)}")
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
            raise TypeError(f"{name} entries must be (start, end) integer pairs, got {shown(r)}") from None
        if not 0 <= start < end <= seq_len:
            raise ValueError(f"{name} range ({start}, {end}) must satisfy 0 <= start < end <= L = {seq_len}")
        out.append((start, end))
    return out


def unit_stride_last_dim(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim has unit stride (the kernels walk D that way), else a copy;
    every other stride is passed to the kernels as is."""
    return x if x.stride(-1) == 1 else x.contiguous()

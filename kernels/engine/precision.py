"""The precision of the exact blocks' QKᵀ, and what ``auto`` picks on each architecture.

- ``"bf16"``: q and k enter the exact blocks' QKᵀ in the input dtype (bfloat16 or float16),
  as the kernels always ran;
- ``"int8"``: q per query tile and k per key block, k smoothed first, in int8 with int32
  accumulation (``engine.quantize``; float reference ``quantized_reference``). P·V, Sol's
  routing and its pooled term stay in the input dtype. The portable kernel runs these calls
  on every architecture: on a launch row whose loop is the warp-specialised Hopper loop
  (sm_90) that loop has no int8 path, and the portable kernel (TMA boxes) takes the call;
- ``"auto"``: the row of :data:`AUTO_PRECISION` for the GPU's architecture (the launch row's
  capability, ``launch_config.row_capability``), logged once per architecture.

``"fp8"`` has no kernel path yet: it is refused by name, never run as something else.
Nothing of the int8 path has been timed or measured for error on a GPU, so ``auto`` picks
``"bf16"`` on every architecture; a row changes when a measurement of that architecture (or
of its launch row forced on another GPU) puts int8 on the speed/error front, and its reason
then names the file of ``benchmarks/results/`` that shows it.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from .._checks import shown
from .launch_config import ARCHITECTURES, LaunchConfig, config_for_device, row_capability

log = logging.getLogger("sparse_video_attention.kernels")

__all__ = ["PRECISIONS", "KERNEL_PRECISIONS", "AUTO_PRECISION", "PrecisionChoice", "check_precision",
           "resolve_precision", "precision_for_device"]

PRECISIONS = ("auto", "bf16", "int8")   # what a kernel call may name
KERNEL_PRECISIONS = ("bf16", "int8")    # what runs (and what a reference takes)
NOT_YET = {"fp8": "'fp8' has no kernel path yet"}


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a call runs (one of :data:`KERNEL_PRECISIONS`) and why, in a sentence."""

    precision: str
    reason: str

    def describe(self) -> str:
        return f"{self.precision} ({self.reason})"


_NOT_MEASURED = "auto: int8 not yet measured on this architecture"

# capability -> auto's choice, one row per launch row of launch_config.ARCHITECTURES.
AUTO_PRECISION = {cap: PrecisionChoice("bf16", _NOT_MEASURED) for cap in ARCHITECTURES}


def check_precision(value, name: str = "precision", choices=PRECISIONS) -> str:
    """``value`` when it is one of ``choices``; else a ValueError naming ``name`` (a precision
    without a kernel path yet says so)."""
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(repr(c) for c in choices)
    if isinstance(value, str) and value in NOT_YET:
        raise ValueError(f"{name}: {NOT_YET[value]}; choose one of {listed}")
    raise ValueError(f"{name}: expected one of {listed}, got {shown(value)}")


@functools.lru_cache(maxsize=16)
def _logged_auto(capability: tuple) -> PrecisionChoice:
    row = row_capability(capability)
    choice = AUTO_PRECISION[row]
    log.info("[sparse-video-attention] precision auto on sm_%d%d (the sm_%d%d row): %s", *capability, *row,
             choice.describe())
    return choice


def resolve_precision(precision, config: LaunchConfig) -> PrecisionChoice:
    """What a call asking for ``precision`` runs with the launch row ``config``: ``auto``'s
    row (logged once per architecture) or the precision asked for; the reason says when the
    portable kernel takes an int8 call from the warp-specialised Hopper loop."""
    precision = check_precision(precision)
    choice = _logged_auto(tuple(config.capability)) if precision == "auto" else PrecisionChoice(precision, "asked for")
    if choice.precision == "int8" and config.warp_specialized:
        choice = PrecisionChoice("int8", f"{choice.reason}; the portable kernel runs these calls: the "
                                         "warp-specialised Hopper loop has no int8 path")
    return choice


def precision_for_device(precision, device) -> PrecisionChoice:
    """What a kernel call asking for ``precision`` runs on ``device`` (its launch row's
    choice for ``auto``), and why: for the run summary of the ComfyUI nodes."""
    return resolve_precision(precision, config_for_device(device))

"""The precision of the exact blocks' QKᵀ, and what ``auto`` picks per architecture and method.

- ``"bf16"``: q and k enter the exact blocks' QKᵀ in the input dtype (bfloat16 or float16),
  as the kernels always ran;
- ``"int8"``: q per query tile and k per key block, k smoothed first, in int8 with int32
  accumulation (``engine.quantize``; float reference ``quantized_reference``). P·V, Sol's
  routing and its pooled term stay in the input dtype. On the sm_90 row the quantized calls run
  the warp-specialised Hopper loop (Sol's on its 64-token blocks, the pooled chunks in the
  input dtype beside the exact blocks' codes);
- ``"fp8"``: the same structure in float8 e4m3 (per-block scale = amax / 448), QKᵀ on fp8
  tensor cores with float32 accumulation; P·V stays in the input dtype. fp8 MMAs exist from
  sm_89 on (sm_89, sm_90, sm_100, sm_120); Triton refuses float8e4nv on sm_80 and sm_86, so
  "fp8" is refused on those launch rows with an error naming the alternative
  (:func:`check_fp8_row`), never run as something else. Measured on an H100: about as fast
  as int8, with more error than ``auto`` allows (below), so ``auto`` never picks it;
- ``"auto"``: the row of :data:`AUTO_PRECISION` for the GPU's architecture (the launch row's
  capability, ``launch_config.row_capability``) and the method (``"sol"``: a mask with Sol's
  pooled term; ``"psa"``: a static mask), logged once per architecture and method.

``AUTO_PRECISION`` is measured, not assumed. Both precisions were timed in one process on
the Wan 720p grid (75,600 tokens, 40 heads, d 128) and the error each adds measured on the
video-like workload (``benchmarks/fidelity.py --precisions bf16,int8,fp8``): int8 adds
0.0002-0.0005 rel-L2 to Sol's 0.14-0.21 at densities 0.05-0.25 and 0.0003 to PSA's 0.29 with
the Wan 720p preset, inside the bound ``auto`` keeps (0.002 absolute at density 0.15, 25 %
relative); fp8 adds 0.0024-0.0042 to Sol's (0.0033 at 0.15: outside it) and 0.0017 to PSA's.

- The pointer-loop rows (A100, RTX 30/40/50) were forced on an H100 with ``DISABLE_MMA_V3=1``,
  so that Triton emits the ``mma.sync`` those cards run rather than the H100's ``wgmma``; the
  H100's int8 ``mma.sync`` runs at only 1.11-1.14x its bf16 rate (``benchmarks/mma_rates.py``),
  an A100's at 2x and an RTX 40/50's at 4x (whose bf16 with float32 sums runs at half rate);
  the cards' own gains were not measured. Each row ran with the shared memory an SM of its
  cards holds (``benchmarks/sm_shared_memory.py``: 164 KB for sm_80, 100 KB for the others),
  so as many programs shared an SM as there. Sol (``rtx_sol_rows_h100.json``): int8 ran
  1.18x (sm_80 row) and 1.12x (sm_89 row) faster than bf16 at density 0.15 and 1.12x / 1.07x
  at 0.05 (the sm_86, sm_89 and sm_120 rows launch the same kernels). PSA at densities 0.15 /
  0.40 (``rtx_psa_quantized_stages_h100.json``), int8 against bf16 on Wan 720p's grid and
  HunyuanVideo 768p's: 1.08x / 1.11x and 1.14x / 1.22x faster on the sm_80 row, 1.02x / 1.06x
  and 1.06x / 1.08x on the other three (their int8 launches with 2 stages,
  ``LaunchConfig.psa_quantized_stages``); on the grids of the shipped presets with 8-token-wide
  tiles (``rtx_psa_depth_by_tile_h100.json``, ``a100_psa_depth_by_tile_h100.json``), Wan 2.2
  5B 720p's and Wan 2.1 1.3B 480p's, 1.03x / 1.10x and 1.14x / 1.18x on the sm_80 row, 0.95x /
  1.00x and 1.06x / 1.12x on the others. The shipped presets run at densities 0.30-0.39
  (mean over layers), nearer 0.40, where int8 was never slower. ``auto`` picks int8 for both
  methods on all four.
- The Hopper loop (sm_90, H100): PSA's int8 ran 1.04-1.10x faster than bf16 at densities 0.15
  and 0.40 on Wan 720p's and HunyuanVideo 768p's grids (int8); Sol's int8 took 1.05x / 1.04x /
  1.10x of its bf16's time at densities 0.15 / 0.10 / 0.05 (1.02x in two more runs at 0.15)
  and 0.93x at 131K tokens, density 0.10 (bf16).
- A row never forced (sm_100) stays bf16.

The results files (``benchmarks/results/``, each with its command): ``rtx_sol_rows_h100.json``,
``rtx_psa_quantized_stages_h100.json``, ``rtx_psa_depth_by_tile_h100.json`` and
``a100_psa_depth_by_tile_h100.json`` (the pointer rows on ``mma.sync``),
``mma_rates_mma_sync_h100.json``, ``psa_hopper_8bit_qk_h100.json``, ``sol_ws_8bit_h100.json``,
``sol_ws_8bit_density015_h100_a.json``, ``_b.json`` and ``sol_ws_8bit_131k_h100.json`` (sm_90),
``fidelity_precisions_h100.json``, ``fidelity_psa_precisions_h100_layer0.json``.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from .._checks import shown
from .launch_config import ARCHITECTURES, LaunchConfig, config_for_device, row_capability

log = logging.getLogger("sparse_video_attention.kernels")

__all__ = ["PRECISIONS", "KERNEL_PRECISIONS", "QUANTIZED_PRECISIONS", "METHODS", "AUTO_PRECISION",
           "PrecisionChoice", "check_precision", "check_fp8_row", "resolve_precision", "precision_for_device"]

PRECISIONS = ("auto", "bf16", "int8", "fp8")   # what a kernel call may name
KERNEL_PRECISIONS = ("bf16", "int8", "fp8")    # what runs (and what a reference takes)
QUANTIZED_PRECISIONS = ("int8", "fp8")         # the engine kernels' QUANTIZED variants (engine.quantize)
METHODS = ("sol", "psa")                       # the rows of a capability in AUTO_PRECISION
FP8_MIN_CAPABILITY = (8, 9)                    # the first architecture with fp8 tensor cores (Ada)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a call runs (one of :data:`KERNEL_PRECISIONS`) and why, in a sentence."""

    precision: str
    reason: str

    def describe(self) -> str:
        return f"{self.precision} ({self.reason})"


def _auto(precision: str, why: str) -> PrecisionChoice:
    return PrecisionChoice(precision, f"auto: {why}")


_NOT_FORCED = _auto("bf16", "int8 not measured on this launch row")
_ON_MMA_SYNC = "forced on an H100 with its mma.sync and its SM's shared memory"
# The sm_86, sm_89 and sm_120 rows launch the same kernels (launch_config._POINTER_99KB).
_POINTER_99KB_CHOICES = {
    "sol": _auto("int8", f"int8 ran 1.12x faster than bf16 at density 0.15 and 1.07x at 0.05, adding 0.0004 "
                         f"rel-L2 (sm_86, sm_89 and sm_120 rows {_ON_MMA_SYNC})"),
    "psa": _auto("int8", f"int8 ran at 1.00x-1.12x bf16's speed at density 0.40 (near the shipped presets') and "
                         f"0.95x-1.07x at 0.15 on the grids of Wan 720p, HunyuanVideo 768p and the Wan 2.2 5B and "
                         f"2.1 1.3B presets, adding 0.0003 rel-L2 (sm_86, sm_89 and sm_120 rows "
                         f"{_ON_MMA_SYNC})"),
}

# capability -> method -> auto's choice, one entry per launch row of launch_config.ARCHITECTURES.
AUTO_PRECISION = {
    (8, 0): {"sol": _auto("int8", f"int8 ran 1.18x faster than bf16 at density 0.15 and 1.12x at 0.05, adding "
                                  f"0.0004 rel-L2 (sm_80 row {_ON_MMA_SYNC})"),
             "psa": _auto("int8", f"int8 ran at 1.10x-1.22x bf16's speed at density 0.40 (near the shipped presets') "
                                  f"and 1.03x-1.14x at 0.15 on the grids of Wan 720p, HunyuanVideo 768p and the Wan "
                                  f"2.2 5B and 2.1 1.3B presets, adding 0.0003 rel-L2 (sm_80 row {_ON_MMA_SYNC})")},
    (8, 6): _POINTER_99KB_CHOICES,
    (8, 9): _POINTER_99KB_CHOICES,
    (9, 0): {"sol": _auto("bf16", "int8 ran in 1.02x-1.05x / 1.04x / 1.10x bf16's time at density 0.15 / 0.10 / "
                                  "0.05 on the Hopper loop (H100)"),
             "psa": _auto("int8", "int8 ran 1.04x / 1.08x faster than bf16 at density 0.15 / 0.40 on Wan 720p's "
                                  "grid and 1.06x / 1.10x on HunyuanVideo 768p's on the Hopper loop (8-bit QKᵀ, "
                                  "P·V in bf16), adding 0.0003 rel-L2 (H100)")},
    (10, 0): {method: _NOT_FORCED for method in METHODS},
    (12, 0): _POINTER_99KB_CHOICES,
}


def check_precision(value, name: str = "precision", choices=PRECISIONS) -> str:
    """``value`` when it is one of ``choices``; else a ValueError naming ``name``."""
    if isinstance(value, str) and value in choices:
        return value
    listed = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{name}: expected one of {listed}, got {shown(value)}")


def check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(repr(m) for m in METHODS)}, got {shown(method)}")
    return method


def check_fp8_row(config: LaunchConfig) -> None:
    """A ValueError naming ``precision`` when ``config``'s architecture has no fp8 tensor cores
    (before sm_89: Triton refuses float8e4nv there, so nothing could run it)."""
    cap = tuple(config.capability)
    if cap < FP8_MIN_CAPABILITY:
        raise ValueError(f"precision: 'fp8' needs fp8 tensor cores (sm_89 or later), and sm_{cap[0]}{cap[1]} "
                         f"(the {config.name} launch row) has none: choose 'int8' (or 'bf16', or 'auto')")


@functools.lru_cache(maxsize=32)
def _logged_auto(capability: tuple, method: str) -> PrecisionChoice:
    row = row_capability(capability)
    choice = AUTO_PRECISION[row][method]
    log.info("[sparse-video-attention] precision auto for %s on sm_%d%d (the sm_%d%d row): %s", method, *capability,
             *row, choice.describe())
    return choice


def resolve_precision(precision, config: LaunchConfig, method: str) -> PrecisionChoice:
    """What a ``method`` call ("sol" or "psa") asking for ``precision`` runs with the launch
    row ``config``: ``auto``'s row (logged once per architecture and method) or the precision
    asked for ("fp8" refused before sm_89, :func:`check_fp8_row`)."""
    precision = check_precision(precision)
    method = check_method(method)
    if precision == "fp8":
        check_fp8_row(config)
    return (_logged_auto(tuple(config.capability), method) if precision == "auto"
            else PrecisionChoice(precision, "asked for"))


def precision_for_device(precision, device, method: str) -> PrecisionChoice:
    """What a ``method`` kernel call asking for ``precision`` runs on ``device`` (its launch
    row's choice for ``auto``), and why: for the run summary of the ComfyUI nodes."""
    return resolve_precision(precision, config_for_device(device), method)

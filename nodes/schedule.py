"""Where the current denoising step sits in the *full* schedule.

ComfyUI hands a sampler only its slice of the schedule: KSamplerAdvanced with
start/end steps (and two-model Wan 2.2 graphs built from it) pass ``sigmas[start:end+1]``,
the last one possibly forced to 0, and ``denoise < 1`` passes the tail of a longer
schedule. Warm-up is a fraction of the *full* run, so the slice is located in the schedule
it was cut from: every registered ComfyUI scheduler is tried for every plausible total step
count, and the first (smallest total) one that contains the slice wins. When nothing matches
(custom sigmas), the slice is taken as the whole run and the caller is told so.

Decision (documented in the README): within a sampler call, an evaluation at sigma ``s``
belongs to step ``i`` = the last schedule index with ``sigmas[i] >= s``, so the extra model
evaluations of multi-stage samplers (Heun, DPM++ 2S…) count toward the step they refine.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch


@dataclass(frozen=True)
class Schedule:
    sigmas: tuple          # this sampler call's sigmas, as floats
    offset: int            # index of sigmas[0] in the full schedule
    total_steps: int       # steps of the full schedule
    located: bool          # False: slice taken as the whole run (no match found)
    scheduler: Optional[str] = None

    def step_of(self, sigma: float) -> int:
        """Global step index of a model evaluation at ``sigma``."""
        s = self.sigmas
        idx = 0
        tol = 1e-5
        for i in range(len(s) - 1):
            if s[i] >= sigma * (1.0 - tol) - 1e-8:
                idx = i
            else:
                break
        return self.offset + idx


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-6


def _contains(full: Sequence[float], part: Sequence[float]) -> int:
    """Offset of ``part`` in ``full`` (last element of part may be a forced 0), or -1."""
    m = len(part)
    for k in range(0, len(full) - m + 1):
        if not _close(full[k], part[0]):
            continue
        ok = True
        for j in range(1, m):
            if _close(full[k + j], part[j]):
                continue
            if j == m - 1 and part[j] == 0.0:  # force_full_denoise
                continue
            ok = False
            break
        if ok:
            return k
    return -1


def locate(sigmas, model_sampling=None, max_steps: Optional[int] = None) -> Schedule:
    """Locate a sampler call's sigmas in the full schedule (see module docstring)."""
    if torch.is_tensor(sigmas):
        s = tuple(float(x) for x in sigmas.detach().float().cpu().tolist())
    else:
        s = tuple(float(x) for x in sigmas)
    m = len(s)
    if m < 2:
        return Schedule(s, 0, max(m - 1, 1), False)
    if model_sampling is not None:
        try:
            import comfy.samplers as cs
            names = list(getattr(cs, "SCHEDULER_NAMES", []))
        except Exception:  # pragma: no cover - outside ComfyUI
            names = []
        hi = max_steps if max_steps is not None else max(4 * (m - 1), 64)
        # The common case first: the slice is a whole schedule.
        candidates = [(n, name) for n in range(m - 1, hi + 1) for name in names]
        for n, name in candidates:
            try:
                full = cs.calculate_sigmas(model_sampling, name, n)
            except Exception:
                continue
            full = [float(x) for x in full.detach().float().cpu().tolist()]
            k = _contains(full, s)
            if k >= 0:
                return Schedule(s, k, n, True, name)
    return Schedule(s, 0, m - 1, False)

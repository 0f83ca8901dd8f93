"""The method strategies of the "Sparse Attention Patch" node, one per ``method`` widget
value (:data:`METHODS`): each plans a call the policy routed to it and runs its kernel.

A strategy object belongs to one dispatcher; :meth:`KernelMethod.fresh` gives a clone's
dispatcher its own (the PSA preset caches are per patched model, like every run state).
"""
from __future__ import annotations

import logging
import os
import warnings

from . import ops
from ._kernels import kernels
from .calls import call_output, kernel_inputs
from .config import SOL_TILE_AUTO
from .policy import Dense, Plan, admit, is_cancel, progress, route
from .presets import check_preset_for_model

log = logging.getLogger("sparse_video_attention")


class KernelMethod:
    """A method that answers a video self-attention call with a kernel (or dense, by the
    policy): the shared flow of :meth:`attend`, the method's :meth:`plan` and :meth:`run`."""
    name = ""
    kernel_method = ""   # the library's name of the method (kernels.precision_for_device)
    runs_sparse = True   # a run without a sparse call is worth a warning

    def __init__(self, config, preset=None):
        self.config = config
        self.preset = preset  # the patch's stripe-mask preset: PSA runs it, the Inspector draws it

    @staticmethod
    def check_patch(config, preset, info) -> None:
        """At patch time: raise ValueError for settings that cannot apply to the model."""

    def fresh(self) -> "KernelMethod":
        """The same method for a clone's dispatcher (same settings, its own caches)."""
        return self

    def meta(self) -> dict:
        """What the run summary says about the method's settings."""
        p = self.preset
        if p is None:
            return {}
        return {"preset": {"name": p.name, "family": p.family, "grid": list(p.grid),
                           "tile": list(p.tile), "on_grid_mismatch": self.config.preset_grid}}

    def decide(self, d, call):
        """The policy's verdict on a call, with the method's plan (a :class:`Plan`) or a
        :class:`Dense` reason."""
        verdict = route(call, d.fwd, self.config, d.dense_blocks, d.adapter,
                        os.environ.get("TRITON_INTERPRET") == "1")
        return self.plan(verdict, d.fwd) if isinstance(verdict, Plan) else verdict

    def plan(self, plan: Plan, fwd):
        """The method's own rules and data for a routed call."""
        return plan

    def blocks_text(self, plan: Plan):
        """How the run summary describes the method's blocks, or None."""
        return None

    def precision_text(self, plan: Plan, device) -> str:
        """How the run summary describes the precision of a plan's calls on ``device``: what
        ``auto`` chose for its GPU and why, or the float reference's (``ops.precision_for``)."""
        if plan.backend == "reference":
            why = "auto on backend reference" if self.config.precision == "auto" else "asked for"
            reference = ops.precision_for("reference", self.config.precision)
            return f"{reference} ({why}: the float32 reference of that path)"
        return kernels.precision_for_device(self.config.precision, device, self.kernel_method).describe()

    def run(self, q4, k4, v4, plan: Plan):
        """The kernel on (B, L, H, D) q/k/v whose video tokens come first: ``(out, density)``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def attend(self, d, func, args, kwargs, call, in_video: bool):
        """The override's answer to one call of dispatcher ``d``."""
        try:
            verdict = self.decide(d, call)
        except Exception as e:  # never crash a workflow
            if is_cancel(e):
                raise
            verdict = Dense("plan_error", f"{type(e).__name__}: {e}")
        if isinstance(verdict, Plan):
            verdict = admit(call, verdict)
        if isinstance(verdict, Dense):
            return d.run_dense(func, args, kwargs, verdict, in_video)
        try:
            q4, k4, v4 = kernel_inputs(call, verdict.span)
            d.note_kernel_setup(q4, verdict, self)
            out, density = self.run(q4, k4, v4, verdict)
            out = call_output(out, verdict.span, call)
        except Exception as e:  # never crash a workflow
            if is_cancel(e):
                raise
            return d.run_dense(func, args, kwargs, Dense("kernel_error", f"{type(e).__name__}: {e}"), in_video)
        d.count(None, density)
        return out

    def start_run(self, d) -> None:
        """Before a sampling run of dispatcher ``d``."""

    def finish_run(self, d, summary: dict) -> None:
        """After a sampling run that finished (``summary``: its run summary, to add to)."""


class DenseMethod(KernelMethod):
    """``dense``: every call runs the model's own attention."""
    name = "dense"
    runs_sparse = False

    def decide(self, d, call):
        return Dense("method_dense")


class SolAttn(KernelMethod):
    """``sol_attn``: dynamic block routing per query block, at β (``effective_beta``)."""
    name = "sol_attn"
    kernel_method = "sol"

    def __init__(self, config, preset=None):
        super().__init__(config, preset)
        self.beta = config.effective_beta

    @staticmethod
    def check_patch(config, preset, info) -> None:
        # accepted, but said once here; the kernels warn too (BetaRangeWarning)
        problem = kernels.beta_range_problem(config.effective_beta)
        if problem:
            log.warning("[sparse-video-attention] %s", problem)

    def meta(self) -> dict:
        return {"beta": self.beta, **super().meta()}

    def plan(self, plan: Plan, fwd):
        tile = self.config.sol_tile
        if tile not in (None, SOL_TILE_AUTO):
            try:
                kernels.check_padding(kernels.check_grid(plan.span.grid), tile, "sol_tile")
            except ValueError as e:
                return Dense("sol_tile", str(e))
        return plan

    def blocks_text(self, plan: Plan):
        tile = self.config.sol_tile
        if tile == SOL_TILE_AUTO:
            tile = kernels.sol_tile_for_grid(plan.span.grid)
        return ("row-major 64-token blocks" if tile is None
                else "3D tiles {}x{}x{} of the grid {}".format(*tile, plan.span.grid))

    def run(self, q4, k4, v4, plan: Plan):
        cfg = self.config
        span = plan.span
        # 3D tiles of the video grid, the tokens after it (text) always exact; or, with
        # sol_tile "off", row-major blocks with the text tokens as sink ranges.
        if cfg.sol_tile is None:
            sinks = [(span.count, span.seq_len)] if span.seq_len > span.count else None
            grid = tile = None
        else:
            sinks, grid = None, span.grid
            tile = None if cfg.sol_tile == SOL_TILE_AUTO else cfg.sol_tile
        return ops.sol_attention(q4, k4, v4, beta=self.beta, estimator=cfg.estimator, sinks=sinks,
                                 grid=grid, tile=tile, scale=plan.scale, backend=plan.backend,
                                 precision=cfg.precision)


class PSA(KernelMethod):
    """``psa``: the preset's static per-head stripe masks."""
    name = "psa"
    kernel_method = "psa"

    def __init__(self, config, preset=None):
        super().__init__(config, preset)
        self._grid_presets = {}   # token grid -> (preset for it or None, why not)
        self._params = {}         # (grid, block, bucket) -> (params, per-head density)

    @staticmethod
    def check_patch(config, preset, info) -> None:
        if preset is None:
            raise ValueError("preset: method 'psa' needs a stripe-mask preset; connect a "
                             "'Load Stripe Mask Preset' node")
        check_preset_for_model(preset, info)

    def fresh(self) -> "PSA":
        return PSA(self.config, self.preset)

    def preset_for_grid(self, grid):
        """The preset on this token grid, by ``Preset.params_for_grid`` (cached per grid, a
        refusal too: a preset that cannot run on a grid is not retried on every call)."""
        if grid not in self._grid_presets:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    p = self.preset.params_for_grid(grid, on_mismatch=self.config.preset_grid)
                for w in caught:
                    log.warning("[sparse-video-attention] %s", w.message)
                self._grid_presets[grid] = (p, "")
            except Exception as e:  # a refusal (ValueError), or e.g. no memory: not the run's problem
                if is_cancel(e):
                    raise
                why = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
                self._grid_presets[grid] = (None, why)
        return self._grid_presets[grid]

    def params(self, preset, grid, block, at: float):
        """(params (H, 6), per-head density (H,)) of a block at a denoising progress."""
        key = (grid, block, preset.bucket_of(at))
        if key not in self._params:
            params = preset.params_for(block, at)
            density = kernels.psa_mask(grid, params, preset.tile).density(tokens=True)
            self._params[key] = (params, density.float())
        return self._params[key]

    def plan(self, plan: Plan, fwd):
        grid = plan.span.grid
        preset, why = self.preset_for_grid(grid)
        if preset is None:
            return Dense("preset_grid", why)
        params, density = self.params(preset, grid, fwd.block, progress(fwd))
        return plan._replace(params=params, density=density)

    def run(self, q4, k4, v4, plan: Plan):
        span = plan.span
        out = ops.psa_attention(q4, k4, v4, grid=span.grid, params=plan.params, tile=self.preset.tile,
                                extra_tokens=span.seq_len - span.count, scale=plan.scale,
                                backend=plan.backend, precision=self.config.precision)
        return out, plan.density


# the ``method`` widget's values (config.METHODS) -> their strategies
METHODS = {cls.name: cls for cls in (SolAttn, PSA, DenseMethod)}


def method_for(config, preset, info) -> KernelMethod:
    """The strategy of the patch's ``method``, checked against the model."""
    cls = METHODS[config.method]
    cls.check_patch(config, preset, info)
    return cls(config, preset)

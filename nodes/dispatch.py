"""The one dispatcher: per attention call, decide what runs.

One :class:`SparseAttention` object belongs to one patched model (one "Sparse Attention
Patch" node output). It is, at the same time,

- the ``optimized_attention_override`` placed in that clone's ``transformer_options``
  (ComfyUI ≥ 0.3.60 calls it as ``override(func, *args, **kwargs)`` for every attention);
- the OUTER_SAMPLE wrapper's work (:meth:`SparseAttention.outer_sample`): per sampling run,
  locates the run's sigmas in the full schedule (:mod:`.schedule`), registers the adapter's
  forward hooks on the diffusion model and removes them afterwards, and logs the run summary;
- the APPLY_MODEL wrapper's work (:meth:`SparseAttention.apply_model`): per model evaluation
  (outside any torch.compile region), computes the token grid from the latent and the step
  index from the current sigma.

The wrappers registered on the ModelPatcher are the module functions
:func:`outer_sample_wrapper` and :func:`apply_model_wrapper`, not bound methods: they look the
dispatcher up in the ``model_options`` of the run, under :data:`TRANSFORMER_OPTIONS_KEY`, the
same dict the override is read from. ``ModelPatcher.clone()`` deep-copies ``model_options``
(each clone gets its own dispatcher through :meth:`SparseAttention.__deepcopy__`) but copies
``ModelPatcher.wrappers`` shallowly; a bound method there would keep pointing at the
dispatcher of the model that was patched, so a node that clones the model after the patch
(ModelSamplingSD3, a LoRA loader...) would split the hooks and the override over two objects.

Nothing is stored in module or class globals: two patched models share no state, and the
unpatched model never sees the override, the wrappers or the hooks outside our runs.

Rules, in order (the first that applies gives the reason a call stays dense):
``method_dense`` → ``not_video_self_attention`` (cross, audio, text refiner, anything outside
a hooked module) → ``mask`` (a mask that changes the result: LTX guides pass one to the video
self-attention; an all-zero or all-True mask is dropped, which is exact) → ``warmup`` /
``final_dense`` → ``dense_block`` → ``min_tokens`` → ``grid`` (tokens do not form the latent
grid) → ``backend`` (auto on a machine without CUDA) / ``device`` / ``dtype`` / ``head_dim``
→ Sol ``sol_tile`` (the chosen tile pads this grid beyond ``kernels.layout``'s limit) → PSA
``preset_grid`` (the preset refuses this token grid, or its masks on it would exceed
``kernels.psa_mask``'s size limits: ``kernels.presets.Preset.params_for_grid``) →
``low_precision`` (the caller passed ``low_precision_attention=False``, as ComfyUI 0.33 does
for masked or image attention) → ``gqa`` (``enable_gqa``: the kernels take one key head per
query head) / ``scale`` (a ``scale`` keyword the kernels refuse) → ``grad`` (q, k or v require
gradients with grad mode on: the kernels have no backward pass) → sparse, with the caller's
``scale`` if it passed one. An exception while deciding (``plan_error``) or in
the kernel (``kernel_error``) falls back to dense: nothing a preset or a widget holds can fail
the sampler. ComfyUI's interrupt is not caught there (:func:`is_cancel`): Cancel stops the run.
Every reason is logged once per patched model; unexpected ones as warnings.

Guards against a patch that silently does nothing, each warned once per patched model, in the
log and in the run summary's ``warnings`` (the Inspector's ``summary``):

- ``displaced``: at run time the ``optimized_attention_override`` in the run's
  ``transformer_options`` is not this dispatcher (a node placed after the patch installed its
  own: ModelAttentionBackend, a Sage or Radial attention patch...). Seen by the OUTER_SAMPLE
  and APPLY_MODEL wrappers, which still run; warned after the first model evaluation in which
  the video self-attention ran and none of its calls reached the dispatcher (an override that
  hands its calls on to ours is not a displacement; the summary still names it).
- ``displaced_in_part``: that other override hands some video self-attention modules' calls
  on and runs the others itself (ComfyUI's own block-sparse node after 0.33 does, putting itself
  back on top at every step: then the fix is one sparse node per model, not the order).
- ``no_sparse_calls``: a sparse method's run made no sparse call although the video
  self-attention modules ran (the summary says why: displaced, none of their calls reached the
  override, or every call dense for the reasons counted).

ComfyUI ≥ 0.33 can hand ``wrap_attn`` ``AttentionTensorContainer`` inputs; an override
without a ``container_function`` attribute (this one) gets plain tensors from ComfyUI, and
containers that arrive anyway are unwrapped before anything else.

Achieved density (run summary): Sol-Attn reports the share of exactly computed key blocks
per head (the kernel's statistics); PSA the share of kept video-token pairs of the preset's
mask per head on the video's grid (``psa_mask(grid, params, tile).density(tokens=True)``;
HunyuanVideo's text tokens, dense both ways, are not counted).
"""
from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections import defaultdict
from typing import NamedTuple, Optional

import torch

from . import ops
from ._kernels import kernels_module

_layout = kernels_module("layout")  # at import: the call path may run inside torch.compile
_checks = kernels_module("_checks")
from .adapters.base import register_hooks
from .config import SOL_TILE_AUTO, PatchConfig, resolve_blocks
from .schedule import Schedule, locate

log = logging.getLogger("sparse_video_attention")

TRANSFORMER_OPTIONS_KEY = "sparse_video_attention"
WRAPPER_KEY = "sparse_video_attention"

# Reasons that mean "working as configured" are logged at INFO; the rest at WARNING.
EXPECTED_REASONS = {"method_dense", "not_video_self_attention", "warmup", "final_dense",
                    "dense_block", "min_tokens", "low_precision"}

_REASON_TEXT = {
    "method_dense": "method is 'dense'",
    "not_video_self_attention": "not a video self-attention call (cross/audio/text attention)",
    "mask": "the video self-attention carries an attention mask that changes its result (LTX "
            "guides with strength other than 1 or a guide attention mask pass "
            "mask=self_attention_mask); the sparse kernels take none",
    "warmup": "inside the dense warm-up steps",
    "final_dense": "inside the dense final steps",
    "dense_block": "block listed in dense_blocks",
    "min_tokens": "sequence shorter than min_tokens",
    "grid": "token count does not match the latent grid",
    "backend": "backend 'auto' found no CUDA device; choose 'reference' to run the float "
               "reference on this device",
    "device": "the Triton kernels need a CUDA tensor",
    "dtype": "the Triton kernels take float16/bfloat16 only",
    "head_dim": "the Triton kernels take head dim 64 or 128 only",
    "sol_tile": "the sol_tile tile does not fit this video's token grid",
    "preset_grid": "the preset cannot run on this token grid",
    "plan_error": "preparing the sparse call raised an exception",
    "kernel_error": "the sparse kernel raised an exception",
    "low_precision": "the caller asked for full-precision attention (low_precision_attention=False)",
    "gqa": "the caller asked for grouped-query attention (enable_gqa); the sparse kernels take as "
           "many key/value heads as query heads",
    "scale": "the caller's softmax scale is not a positive number in float32's range",
    "grad": "q, k or v require gradients (training) and the sparse kernels have no backward pass",
}

PLACE_LAST = ("place the Sparse Attention Patch last, after ModelAttentionBackend / Sage / other "
              "attention patches")
# ComfyUI's own block-sparse node (comfy_extras/nodes_sparse_attention.py, after 0.33) puts its
# override back on top of the model's at every step (ON_PREPARE_STATE), so no order helps.
# Its override's module: ComfyUI loads comfy_extras files by path, so the module is that path
# less ".py" ("/…/ComfyUI/comfy_extras/nodes_sparse_attention"); a plain import gives the dotted
# comfy_extras.nodes_sparse_attention.
_CORE_SPARSE_OVERRIDE = re.compile(r"(?:^|[./\\])comfy_extras[./\\]nodes_sparse_attention\.")
ONE_SPARSE_NODE = ("use one sparse-attention node per model: ComfyUI's own Model Sparse Attention "
                   "node puts itself back on top at every step, so no order of the two helps")
SETTINGS_FIX = ("see why in the run summary's dense_calls: lower min_tokens, warmup or "
                "dense_blocks, or use a model, dtype and backend the kernels take")
_WARNING_TEXT = {
    "displaced": "this run's attention override is {detail}, not the Sparse Attention Patch's: a "
                 "node after the patch replaced it, so no attention call reaches the patch",
    "displaced_in_part": "this run's attention override is {detail}",
    "no_sparse_calls": "the run made no sparse attention call although the video self-attention "
                       "ran: {detail}",
}


def comfyui_version() -> str:
    """The running ComfyUI's version (its comfyui_version.py), or "unknown"."""
    try:
        import comfyui_version as v
        return str(v.__version__)
    except Exception:  # pragma: no cover - not inside ComfyUI
        return "unknown"


def is_cancel(e: BaseException) -> bool:
    """True for ComfyUI's interrupt (the user's Cancel, ``/interrupt``). Every guard that turns
    an exception into a dense fallback re-raises it: ComfyUI clears its interrupt flag when it
    raises, so a swallowed one lets the run go on to the end."""
    mm = sys.modules.get("comfy.model_management")  # only ComfyUI's own, never imported here
    return mm is not None and isinstance(e, mm.InterruptProcessingException)


def displacement_fix(displaced_by: str) -> str:
    """The fix a displacement warning names, for the override described by ``displaced_by``."""
    return ONE_SPARSE_NODE if _CORE_SPARSE_OVERRIDE.search(displaced_by) else PLACE_LAST


def _describe_override(fn) -> str:
    if fn is None:
        return "none"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{name}"


def _mask_is_noop(mask) -> bool:
    """True for a mask that leaves attention unchanged: all-True boolean or all-zero additive."""
    if not torch.is_tensor(mask):
        return False
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return not bool(mask.any())


def _unwrap_containers(args):
    """q, k, v taken out of ComfyUI's AttentionTensorContainer (single-owner) inputs."""
    if len(args) >= 3 and not torch.is_tensor(args[0]) and hasattr(args[0], "take"):
        return (args[0].take(), args[1].take(), args[2].take()) + tuple(args[3:])
    return args


class _Forward:
    """Facts about the diffusion-model forward in progress (one object, reused)."""
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


class RunStats:
    """Counts of one sampling run; readable as a plain dict via :meth:`as_dict`."""

    def __init__(self):
        self.forwards = 0
        self.sparse = 0
        self.dense = defaultdict(int)
        self.per_step = defaultdict(lambda: {"sparse": 0, "dense": 0})
        # (step, block) -> [sum of per-call mean densities (tensor), calls]
        self.density = {}
        # block -> [sum of per-call per-head densities (H,) tensor, calls]
        self.head_density = {}
        self.schedule = None
        self.compiled_calls_unseen = False
        self.grid = None
        self.notes = {}          # reason -> first detail message of this run
        self.warnings = {}       # guard ("displaced", "displaced_in_part", "no_sparse_calls") -> message with the fix
        self.video_modules = 0   # video self-attention modules entered (forward pre-hooks)
        self.video_calls = 0     # attention calls that reached the override inside them
        self.video_modules_unreached = 0  # entered modules none of whose calls reached it
        self.video_dense = defaultdict(int)  # reason -> those of them that ran dense
        self.displaced_by = None  # the override found in transformer_options instead of ours
        self.meta = {}           # method, family, sizes, preset (set by the dispatcher)

    def as_dict(self) -> dict:
        steps = {}
        for step, c in sorted(self.per_step.items(), key=lambda kv: (kv[0] is None, kv[0])):
            steps[step] = dict(c)
        dens_step = defaultdict(list)
        layer_step = {}
        for (step, block), (s, n) in self.density.items():
            d = float(s) / n
            layer_step[(step, block)] = d
            dens_step[step].append(d)
        for step, ds in dens_step.items():
            steps.setdefault(step, {"sparse": 0, "dense": 0})["mean_density"] = sum(ds) / len(ds)
        total = self.sparse + sum(self.dense.values())
        head = {}
        for block, (s, n) in sorted(self.head_density.items()):
            head[block] = [float(x) / n for x in s.tolist()]
        return {
            **self.meta,
            "grid": self.grid,
            "forwards": self.forwards,
            "calls": total,
            "sparse_calls": self.sparse,
            "dense_calls": dict(self.dense),
            "steps": steps,
            "density_by_step_block": layer_step,
            "mean_density": (sum(layer_step.values()) / len(layer_step)) if layer_step else None,
            "head_density_by_block": head,
            "notes": dict(self.notes),
            "warnings": dict(self.warnings),
            "video_self_attention": {"modules_entered": self.video_modules,
                                     "calls_reached_override": self.video_calls,
                                     "modules_without_a_call": self.video_modules_unreached},
            "override_displaced_by": self.displaced_by,
            "schedule": self.schedule,
            "compiled_calls_unseen": self.compiled_calls_unseen,
        }


def dispatcher_in(transformer_options) -> Optional["SparseAttention"]:
    """The dispatcher stored in a ``transformer_options`` dict, or None."""
    state = transformer_options.get(TRANSFORMER_OPTIONS_KEY) if transformer_options else None
    return state if getattr(state, "is_sparse_video_attention", False) else None


def outer_sample_wrapper(executor, *args, **kwargs):
    """OUTER_SAMPLE wrapper (``executor.class_obj`` is the guider): hands the run to the
    dispatcher in the guider's ``model_options`` (those of the model being sampled, whichever
    clone of the patched model that is)."""
    guider = executor.class_obj
    options = getattr(guider, "model_options", None)
    if options is None:
        options = guider.model_patcher.model_options
    state = dispatcher_in(options.get("transformer_options"))
    if state is None:
        return executor(*args, **kwargs)
    return state.outer_sample(executor, *args, **kwargs)


def apply_model_wrapper(executor, x, t, c_concat=None, c_crossattn=None, control=None,
                        transformer_options={}, **kwargs):
    """APPLY_MODEL wrapper: hands the evaluation to the dispatcher in its
    ``transformer_options`` (the dict the attention override is read from)."""
    state = dispatcher_in(transformer_options)
    if state is None:
        return executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
    return state.apply_model(executor, x, t, c_concat, c_crossattn, control,
                             transformer_options, **kwargs)


def call_args(args, kwargs):
    """``(q, k, v, heads, mask, skip_reshape)`` of an override call (positional or keyword,
    per family; see docs/COMFYUI_NOTES.md)."""
    q = args[0] if len(args) > 0 else kwargs.get("q")
    k = args[1] if len(args) > 1 else kwargs.get("k")
    v = args[2] if len(args) > 2 else kwargs.get("v")
    heads = args[3] if len(args) > 3 else kwargs.get("heads")
    mask = args[4] if len(args) > 4 else kwargs.get("mask")
    return q, k, v, heads, mask, bool(kwargs.get("skip_reshape", False))


def call_options(kwargs) -> tuple[Optional[str], object]:
    """``(None, scale)`` for the keyword options of a call that the kernels honour (``scale``:
    the softmax scale, None for 1/√head dim), else ``(reason, detail)`` to stay dense:
    ``low_precision_attention=False``, ``enable_gqa``, a scale the kernels refuse."""
    if kwargs.get("low_precision_attention", True) is False:
        return "low_precision", ""
    if kwargs.get("enable_gqa", False):
        return "gqa", ""
    scale = kwargs.get("scale")
    if scale is None:
        return None, None
    try:
        return None, _checks.resolve_scale(scale, 1)  # the kernels' own bounds
    except ValueError as e:
        return "scale", str(e)


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


def kernel_input(t: torch.Tensor, heads: int, skip_reshape: bool, span: VideoSpan) -> torch.Tensor:
    """A call's q, k or v as the kernels take it: (B, L, H, D), the video tokens first. A
    reorder copies along the call's own token axis (heads first with ``skip_reshape``), so
    the copy keeps the layout the kernels were measured on."""
    return blhd(_layout.tokens_to_front(t, span.start, span.count, dim=2 if skip_reshape else 1), heads, skip_reshape)


def call_order(out: torch.Tensor, span: VideoSpan) -> torch.Tensor:
    """A kernel's (B, L, H, D) output back in the call's token order."""
    return _layout.tokens_back(out, span.start, span.count)


class SparseAttention:
    """Per-patched-model dispatcher (see module docstring)."""

    # Recognised by attribute, not isinstance: the pack may be imported under two names.
    is_sparse_video_attention = True

    def __init__(self, config: PatchConfig, adapter, info, preset=None, prev_override=None):
        self.config = config
        self.adapter = adapter
        self.info = info
        self.preset = preset
        self.prev_override = prev_override
        self.dense_blocks = resolve_blocks(config.dense_blocks, info.num_blocks)
        self.beta = config.effective_beta if config.method == "sol_attn" else None
        self.fwd = _Forward()
        self.stats = RunStats()
        self.last_run: Optional[dict] = None
        self.schedule: Optional[Schedule] = None
        self._logged = set()
        self._hooks = []
        self._grid_presets = {}   # token grid -> (preset for it or None, why not)
        self._psa_cache = {}      # (grid, block, bucket) -> (params, per-head density)
        self.stats.meta = self._meta()

    def _meta(self) -> dict:
        m = {"method": self.config.method, "family": self.info.family,
             "num_blocks": self.info.num_blocks, "num_heads": self.info.num_heads,
             "comfyui_version": comfyui_version()}
        if self.beta is not None:
            m["beta"] = self.beta
        if self.preset is not None:
            p = self.preset
            m["preset"] = {"name": p.name, "family": p.family, "grid": list(p.grid),
                           "tile": list(p.tile), "on_grid_mismatch": self.config.preset_grid}
        return m

    def __deepcopy__(self, memo):
        """ComfyUI deep-copies ``model_options`` on every ``ModelPatcher.clone()``. A clone
        gets its own run state (no shared counters or hooks); settings, adapter and preset
        are immutable and shared; an earlier override is copied as ComfyUI would copy it."""
        import copy
        new = self.fresh_copy(copy.deepcopy(self.prev_override, memo))
        memo[id(self)] = new
        return new

    def fresh_copy(self, prev_override):
        """Same settings, new run state (what a clone gets)."""
        return SparseAttention(self.config, self.adapter, self.info, preset=self.preset,
                               prev_override=prev_override)

    # ------------------------------------------------------------------ logging / stats
    def _note(self, reason: str, detail: str = ""):
        detail = _checks.clip(detail, 1000)
        self.stats.notes.setdefault(reason, _REASON_TEXT.get(reason, reason)
                                    + (f": {detail}" if detail else ""))
        if reason in self._logged:
            return
        self._logged.add(reason)
        msg = f"[sparse-video-attention] {self.info.family}: dense because " \
              f"{_REASON_TEXT.get(reason, reason)}{': ' + detail if detail else ''} " \
              f"(logged once)"
        (log.info if reason in EXPECTED_REASONS else log.warning)(msg)

    def _warn(self, guard: str, detail: str, fix: str = PLACE_LAST):
        """A silent-no-op guard fired: once per patched model in the log, and in the summary."""
        msg = _WARNING_TEXT[guard].format(detail=detail) + f". Fix: {fix}."
        self.stats.warnings.setdefault(guard, msg)
        if guard not in self._logged:
            self._logged.add(guard)
            log.warning("[sparse-video-attention] %s %s: %s (warned once)", self.info.family,
                        self.config.method, msg)

    def _check_override(self, transformer_options):
        """Record the run's attention override when it is not this dispatcher."""
        current = transformer_options.get("optimized_attention_override") if transformer_options else None
        if current is not self and not torch.compiler.is_compiling():
            self.stats.displaced_by = _describe_override(current)

    def _check_displaced(self):
        """The ``displaced`` guards, after a model evaluation: another override is the run's,
        and the video self-attention ran without one call reaching this dispatcher, or with
        some of its modules' calls run by that override alone."""
        st = self.stats
        if st.displaced_by is None or not st.video_modules:
            return
        fix = displacement_fix(st.displaced_by)
        if not st.video_calls:
            self._warn("displaced", st.displaced_by, fix)
        elif st.video_modules_unreached:
            self._warn("displaced_in_part", f"{st.displaced_by}, placed after the patch: it handed the "
                       f"patch the attention of only some video self-attention modules ("
                       f"{st.video_modules_unreached} of {st.video_modules} ran without the patch)", fix)

    def _check_sparse_calls(self):
        """The ``no_sparse_calls`` guard, at the end of a run of a sparse method."""
        st = self.stats
        if self.config.method not in ("sol_attn", "psa") or st.sparse or not st.video_modules \
                or st.compiled_calls_unseen:
            return
        if st.displaced_by is not None and not st.video_calls:
            self._warn("no_sparse_calls", f"the run's attention override is {st.displaced_by}",
                       displacement_fix(st.displaced_by))
        elif not st.video_calls:
            self._warn("no_sparse_calls", f"{st.video_modules} video self-attention module calls, "
                       "but none of their attention calls reached the patch's override")
        else:
            counts = ", ".join(f"{k}={v}" for k, v in sorted(st.video_dense.items()))
            self._warn("no_sparse_calls", f"all {st.video_calls} video self-attention calls ran "
                       f"dense ({counts})", SETTINGS_FIX)

    def _count(self, reason: Optional[str], density=None):
        if torch.compiler.is_compiling():
            # Python counters inside a compiled region would be specialised into guards.
            self.stats.compiled_calls_unseen = True
            return
        step = self.fwd.step
        if reason is None:
            self.stats.sparse += 1
            self.stats.per_step[step]["sparse"] += 1
            if density is not None:  # (B, H) or (H,): achieved density per head
                block = self.fwd.block
                per_head = density.detach().float().reshape(-1, density.shape[-1]).mean(0)
                for table, key, d in ((self.stats.density, (step, block), per_head.mean()),
                                      (self.stats.head_density, block, per_head)):
                    if key in table:
                        s, n = table[key]
                        table[key] = [s + d, n + 1]
                    else:
                        table[key] = [d, 1]
        else:
            self.stats.dense[reason] += 1
            self.stats.per_step[step]["dense"] += 1

    def summary(self) -> dict:
        """Summary of the last finished sampling run (or the one in progress)."""
        if self.last_run is not None:
            return self.last_run
        return self.stats.as_dict()

    # ------------------------------------------------------------------ hooks
    def _enter(self, block, role, args, kwargs):
        f = self.fwd
        if not f.active:
            return
        f.block, f.role, f.module_calls = block, role, 0
        if not torch.compiler.is_compiling():
            self.stats.video_modules += 1
        self.adapter.observe(role, args, kwargs, f.info)

    def _leave(self, block):
        f = self.fwd
        if f.active and f.role is not None and not f.module_calls and not torch.compiler.is_compiling():
            self.stats.video_modules_unreached += 1
        f.block, f.role = None, None

    def _video_call_arrived(self) -> bool:
        """Count an attention call made inside a hooked video self-attention module; whether
        it is one."""
        f = self.fwd
        if not (f.active and f.role is not None) or torch.compiler.is_compiling():
            return False
        self.stats.video_calls += 1
        f.module_calls += 1
        return True

    def _install_hooks(self, dm):
        self._remove_hooks()
        self._hooks = register_hooks(self.adapter, dm, self._enter, self._leave)
        self.fwd.hooks_live = True

    def _remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.fwd.hooks_live = False

    # ------------------------------------------------------------------ wrappers
    def outer_sample(self, executor, *args, **kwargs):
        """OUTER_SAMPLE wrapper: one sampling run of this patched model."""
        guider = executor.class_obj
        sigmas = kwargs.get("sigmas", args[3] if len(args) > 3 else None)
        patcher = guider.model_patcher
        try:
            ms = patcher.get_model_object("model_sampling")
        except Exception:
            ms = None
        self.schedule = locate(sigmas, ms) if sigmas is not None else None
        self.stats = RunStats()
        self.stats.meta = self._meta()
        self.last_run = None
        if self.schedule is not None:
            sc = self.schedule
            self.stats.schedule = {"offset": sc.offset, "total_steps": sc.total_steps,
                                   "steps_this_run": len(sc.sigmas) - 1,
                                   "located": sc.located, "scheduler": sc.scheduler}
            if not sc.located:
                log.info("[sparse-video-attention] could not find this sampler's sigmas in a "
                         "standard schedule; warm-up counts the %d steps of this sampler call",
                         len(sc.sigmas) - 1)
        options = getattr(guider, "model_options", None) or patcher.model_options
        self._check_override(options.get("transformer_options"))
        self._install_hooks(patcher.model.diffusion_model)
        try:
            return executor(*args, **kwargs)
        finally:
            self._remove_hooks()
            self._check_sparse_calls()
            self.last_run = self.stats.as_dict()
            self._log_summary(self.last_run)

    def apply_model(self, executor, x, t, c_concat=None, c_crossattn=None, control=None,
                    transformer_options={}, **kwargs):
        """APPLY_MODEL wrapper: facts for one model evaluation."""
        f = self.fwd
        dm = executor.class_obj.diffusion_model
        own_hooks = not f.hooks_live
        if own_hooks:  # called outside a sampler run
            self._install_hooks(dm)
        f.active = True
        f.info = {}
        f.block = f.role = None
        try:
            f.grid = self.adapter.grid(dm, x, kwargs)
        except Exception as e:  # pragma: no cover - defensive
            f.grid = None
            self._note("grid", f"cannot read the latent shape ({e})")
        f.step, f.total, f.step_reason = self._step_of(transformer_options)
        self._check_override(transformer_options)
        self.stats.forwards += 1
        if f.grid is not None:
            self.stats.grid = list(f.grid)
        try:
            out = executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
            self._check_displaced()
            return out
        finally:
            f.active = False
            f.block = f.role = None
            if own_hooks:
                self._remove_hooks()

    def _step_of(self, transformer_options):
        sc = self.schedule
        sig = transformer_options.get("sigmas") if transformer_options else None
        if sc is None:
            sample_sigmas = transformer_options.get("sample_sigmas") if transformer_options else None
            if sample_sigmas is None or sig is None:
                return None, None, None
            sc = self.schedule = locate(sample_sigmas, None)
        if sig is None:
            return None, None, None
        sigma = float(sig.detach().float().max()) if torch.is_tensor(sig) else float(sig)
        step = sc.step_of(sigma)
        total = sc.total_steps
        reason = None
        if step < self.config.warmup_steps(total):
            reason = "warmup"
        elif step >= total - self.config.final_dense_steps(total):
            reason = "final_dense"
        return step, total, reason

    def _log_summary(self, s: dict):
        dense = ", ".join(f"{k}={v}" for k, v in sorted(s["dense_calls"].items())) or "none"
        md = s["mean_density"]
        log.info("[sparse-video-attention] %s %s: %d forwards, %d attention calls, %d sparse "
                 "(mean density %s), dense: %s%s", self.info.family, self.config.method,
                 s["forwards"], s["calls"], s["sparse_calls"],
                 "n/a" if md is None else f"{md:.3f}", dense,
                 f"; warnings: {', '.join(sorted(s['warnings']))}" if s["warnings"] else "")

    # ------------------------------------------------------------------ the override
    def _dense(self, func, args, kwargs):
        if self.prev_override is not None:
            return self.prev_override(func, *args, **kwargs)
        return func(*args, **kwargs)

    def _resolve_backend(self, q, head_dim):
        b = self.config.backend
        if b == "reference":
            return "reference", None
        if b == "auto" and not q.is_cuda:
            return None, "backend"
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            return None, "device"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return None, "dtype"
        if head_dim not in (64, 128):
            return None, "head_dim"
        return "triton", None

    def self_attention_reason(self, q, k, mask, skip_reshape):
        """None for a video self-attention call inside a forward, else the dense reason."""
        f = self.fwd
        if not f.active or f.role is None or f.grid is None:
            return "not_video_self_attention"
        if mask is not None and not _mask_is_noop(mask):
            return "mask"  # inside a video self-attention module, also a query slice (LTX guides)
        if tokens_of(q, skip_reshape) != tokens_of(k, skip_reshape):
            return "not_video_self_attention"
        return None

    def video_grid(self, seq_len) -> Optional[VideoSpan]:
        """The video tokens of a call of ``seq_len`` tokens, or None."""
        f = self.fwd
        n_video = self.adapter.video_tokens(seq_len, f.grid, f.info)
        if n_video is None:
            return None
        hw = f.grid[1] * f.grid[2]
        start = self.adapter.video_start(seq_len, n_video, f.info)
        return VideoSpan(start, n_video, seq_len, (n_video // hw, f.grid[1], f.grid[2]))

    def decide(self, q, k, heads, mask, skip_reshape):
        """Return ``(None, plan)`` to run sparse or ``(reason, detail)`` to stay dense."""
        cfg = self.config
        f = self.fwd
        if cfg.method == "dense":
            return "method_dense", ""
        reason = self.self_attention_reason(q, k, mask, skip_reshape)
        if reason is not None:
            return reason, ""
        if f.step_reason is not None:
            return f.step_reason, ""
        if f.block in self.dense_blocks:
            return "dense_block", ""
        lq = tokens_of(q, skip_reshape)
        if lq < cfg.min_tokens:
            return "min_tokens", f"{lq} < {cfg.min_tokens}"
        span = self.video_grid(lq)
        if span is None:
            return "grid", f"{lq} tokens, latent grid {f.grid}"
        grid = span.grid
        head_dim = q.shape[-1] if skip_reshape else q.shape[-1] // heads
        backend, why = self._resolve_backend(q, head_dim)
        if backend is None:
            return why, f"{q.device.type} {q.dtype} head_dim={head_dim}"
        plan = {"backend": backend, "span": span}
        if cfg.method == "sol_attn" and cfg.sol_tile not in (None, SOL_TILE_AUTO):
            layout = kernels_module("layout")
            try:
                layout.check_padding(layout.check_grid(grid), cfg.sol_tile, "sol_tile")
            except ValueError as e:
                return "sol_tile", str(e)
        if cfg.method == "psa":
            preset, why = self._preset_for_grid(grid)
            if preset is None:
                return "preset_grid", why
            plan["params"], plan["density"] = self._psa_params(preset, grid, f.block,
                                                               self.progress())
        return None, plan

    def progress(self) -> float:
        """Denoising progress of the forward in progress: step / total steps (0 if unknown)."""
        f = self.fwd
        return f.step / f.total if f.step is not None and f.total else 0.0

    def _preset_for_grid(self, grid):
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

    def _psa_params(self, preset, grid, block, progress):
        """(params (H, 6), per-head density (H,)) of a block at a denoising progress."""
        key = (grid, block, preset.bucket_of(progress))
        if key not in self._psa_cache:
            psa_mask = kernels_module("psa_mask")
            params = preset.params_for(block, progress)
            dens = psa_mask.psa_mask(grid, params, preset.tile).density(tokens=True)
            self._psa_cache[key] = (params, dens.float())
        return self._psa_cache[key]

    def live_dispatcher(self, kwargs) -> Optional["SparseAttention"]:
        """The dispatcher of the model this call runs for, when that is not this one. A node
        after the patch that wraps our override (ComfyUI's Model Sparse Attention) keeps
        handing calls to the dispatcher it wrapped, also in a clone made after it, whose
        wrappers run a fresh dispatcher (``patching.on_clone``): those calls belong there."""
        live = dispatcher_in(kwargs.get("transformer_options"))
        return live if live is not None and live is not self else None

    def __call__(self, func, *args, **kwargs):
        live = self.live_dispatcher(kwargs)
        if live is not None:
            return live(func, *args, **kwargs)
        args = _unwrap_containers(args)
        q, k, v, heads, mask, skip_reshape = call_args(args, kwargs)
        skip_output_reshape = bool(kwargs.get("skip_output_reshape", False))
        if q is None or k is None or v is None or heads is None:
            return self._dense(func, args, kwargs)
        in_video = self._video_call_arrived()

        try:
            reason, plan = self.decide(q, k, heads, mask, skip_reshape)
        except Exception as e:  # never crash a workflow
            if is_cancel(e):
                raise
            reason, plan = "plan_error", f"{type(e).__name__}: {e}"
        if reason is None:
            reason, scale = call_options(kwargs)
            plan = dict(plan, scale=scale) if reason is None else scale
        if reason is None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            reason, plan = "grad", ""
        if reason == "mask":
            plan = (f"mask {tuple(mask.shape)} on {tokens_of(q, skip_reshape)} queries x "
                    f"{tokens_of(k, skip_reshape)} keys")
        if reason is not None:
            self._note(reason, plan)
            self._count(reason)
            if in_video:
                self.stats.video_dense[reason] += 1
            return self._dense(func, args, kwargs)
        try:
            out, density = self._run_sparse(q, k, v, heads, skip_reshape, plan)
        except Exception as e:  # never crash a workflow
            if is_cancel(e):
                raise
            self._note("kernel_error", f"{type(e).__name__}: {e}")
            self._count("kernel_error")
            if in_video:
                self.stats.video_dense["kernel_error"] += 1
            return self._dense(func, args, kwargs)
        self._count(None, density)
        b, l, h, d = out.shape
        if skip_output_reshape:
            return out.transpose(1, 2)
        return out.reshape(b, l, h * d)

    def _note_kernel_setup(self, q, plan, sol_tile):
        """Once per run, for the summary: the GPU's launch configuration (and why) and Sol's
        blocks (``sol_tile``: a tile, "auto" or None). Not inside a torch.compile region (the
        dict would become a guard, the lookups graph breaks)."""
        meta = self.stats.meta
        if torch.compiler.is_compiling() or "kernel_config" in meta:
            return
        if sol_tile == SOL_TILE_AUTO:
            sol_tile = kernels_module("sol_routing").sol_tile_for_grid(plan["span"].grid)
        if plan["backend"] == "triton" and q.is_cuda:
            meta["kernel_config"] = kernels_module("launch_config").config_for_device(q.device).describe()
        else:
            meta["kernel_config"] = f"backend {plan['backend']} on {q.device.type}"
        if self.config.method == "sol_attn":
            meta["sol_blocks"] = ("row-major 64-token blocks" if sol_tile is None
                                  else "3D tiles {}x{}x{} of the grid {}".format(*sol_tile, plan["span"].grid))

    def _run_sparse(self, q, k, v, heads, skip_reshape, plan):
        span = plan["span"]
        q4, k4, v4 = (kernel_input(t, heads, skip_reshape, span) for t in (q, k, v))
        out, density = self._run_kernel(q4, k4, v4, plan)
        return call_order(out, span), density

    def _run_kernel(self, q4, k4, v4, plan):
        """The method's kernel on (B, L, H, D) q/k/v whose video tokens come first."""
        cfg = self.config
        n_video, seq_len, grid = plan["span"].count, plan["span"].seq_len, plan["span"].grid
        if cfg.method == "sol_attn":
            # 3D tiles of the video grid, the tokens after it (text) always exact; or, with
            # sol_tile "off", row-major blocks with the text tokens as sink ranges.
            if cfg.sol_tile is None:
                sinks, sol_grid, tile = ([(n_video, seq_len)] if seq_len > n_video else None), None, None
            else:
                sinks, sol_grid = None, grid
                tile = None if cfg.sol_tile == SOL_TILE_AUTO else cfg.sol_tile
            self._note_kernel_setup(q4, plan, cfg.sol_tile)
            return ops.sol_attention(q4, k4, v4, beta=self.beta, estimator=cfg.estimator,
                                     sinks=sinks, keep_diagonal=cfg.keep_diagonal, grid=sol_grid,
                                     tile=tile, scale=plan["scale"], backend=plan["backend"])
        self._note_kernel_setup(q4, plan, None)
        # The parameters stay on the CPU: the kernel's schedule is built and cached there.
        out = ops.psa_attention(q4, k4, v4, grid=grid, params=plan["params"], tile=self.preset.tile,
                                extra_tokens=seq_len - n_video, scale=plan["scale"], backend=plan["backend"])
        return out, plan["density"]

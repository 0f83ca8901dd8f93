"""The dispatcher's life: one :class:`SparseAttention` object per patched model (one "Sparse
Attention Patch" or "PSA Mask Search" output), holding the method strategy it runs
(:mod:`.methods`, :mod:`.search`). It is, at the same time,

- the ``optimized_attention_override`` placed in that clone's ``transformer_options``
  (ComfyUI ≥ 0.3.60 calls it as ``override(func, *args, **kwargs)`` for every attention),
  which hands each call to its method strategy;
- the OUTER_SAMPLE wrapper's work (:meth:`SparseAttention.outer_sample`): per sampling run,
  locates the run's sigmas in the full schedule (:mod:`.schedule`), registers the adapter's
  forward hooks on the diffusion model and removes them afterwards, and logs the run summary
  (:mod:`.report`);
- the APPLY_MODEL wrapper's work (:meth:`SparseAttention.apply_model`): per model evaluation
  (outside any torch.compile region), computes the token grid from the latent and the step
  index from the current sigma.

A call the dispatcher keeps dense runs as it would without the patch (:meth:`SparseAttention.dense`):
through an override installed before the patch, else through the attention the running module's
checkpoint names (:mod:`.checkpoint_attention`, hooked for the run like the adapter's modules),
else ComfyUI's own.

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

Displacement (the run report's ``displaced`` guards): at run time the OUTER_SAMPLE and
APPLY_MODEL wrappers, which still run, record an ``optimized_attention_override`` in the run's
``transformer_options`` that is not this dispatcher (a node placed after the patch installed
its own), and the hooks count the video self-attention modules entered and the calls of theirs
that reached the dispatcher.

ComfyUI's own Model Sparse Attention node (``comfy_extras/nodes_sparse_attention.py``, after
0.33) on the same model (:func:`core_sparse_node`): found at patch time (``patching.install``)
and again before the first step of each run (OUTER_SAMPLE) and at each model evaluation
(APPLY_MODEL), by its ``ON_PREPARE_STATE`` callback key or its override. It puts its override
back on top at every step and hands the calls it declines to the one it found, so the order of
the two nodes does not decide what runs. With ``beside_core_node`` "defer" (the default) the
dispatcher hands every call of that run on untouched (reason ``core_sparse_node``); with
"share" it runs the calls that node declines as it would without it. Warned once per patched
model in the log and in every such run's summary (``report.RunLog.core_node``).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from ._kernels import kernels
from .adapters.base import register_hooks
from .calls import read_call, unwrap_containers
from .checkpoint_attention import CheckpointAttention
from .config import PatchConfig, resolve_blocks
from .policy import Dense, Forward, step_reason
from .report import RunLog, RunStats, describe_override, is_core_sparse_override
from .schedule import Schedule, locate

log = logging.getLogger("sparse_video_attention")

TRANSFORMER_OPTIONS_KEY = "sparse_video_attention"
WRAPPER_KEY = "sparse_video_attention"
# The key of the ON_PREPARE_STATE callback by which ComfyUI's own Model Sparse Attention node
# puts its override back on top at every step (comfy_extras/nodes_sparse_attention.py).
CORE_SPARSE_CALLBACK_KEY = "block_sparse_attention"


def core_sparse_node(patcher, transformer_options) -> Optional[str]:
    """How ComfyUI's own Model Sparse Attention node shows on a model, or None: its
    ``ON_PREPARE_STATE`` callback under :data:`CORE_SPARSE_CALLBACK_KEY` on the ModelPatcher
    ``patcher`` (which may be None), and its override in ``transformer_options``, on top or
    below ours (the chain of our dispatchers' earlier overrides)."""
    found = []
    callbacks = getattr(patcher, "callbacks", None)
    if isinstance(callbacks, dict):
        import comfy.patcher_extension as pe
        by_key = callbacks.get(pe.CallbacksMP.ON_PREPARE_STATE) or {}
        if isinstance(by_key, dict) and by_key.get(CORE_SPARSE_CALLBACK_KEY):
            found.append(f"its ON_PREPARE_STATE callback {CORE_SPARSE_CALLBACK_KEY!r}")
    fn = transformer_options.get("optimized_attention_override") if transformer_options else None
    seen = set()
    while fn is not None and id(fn) not in seen:
        seen.add(id(fn))
        if is_core_sparse_override(fn):
            found.append(f"its attention override {describe_override(fn)}")
            break
        fn = getattr(fn, "prev_override", None) if getattr(fn, "is_sparse_video_attention", False) else None
    return " and ".join(found) or None


def comfyui_version() -> str:
    """The running ComfyUI's version (its comfyui_version.py), or "unknown"."""
    try:
        import comfyui_version as v
        return str(v.__version__)
    except Exception:  # pragma: no cover - not inside ComfyUI
        return "unknown"


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


class SparseAttention:
    """Per-patched-model dispatcher (see module docstring) running the strategy ``method``."""

    # Recognised by attribute, not isinstance: the pack may be imported under two names.
    is_sparse_video_attention = True

    def __init__(self, config: PatchConfig, adapter, info, method, prev_override=None):
        self.config = config
        self.adapter = adapter
        self.info = info
        self.method = method
        self.prev_override = prev_override
        self.dense_blocks = resolve_blocks(config.dense_blocks, info.num_blocks)
        self.fwd = Forward()
        self.log = RunLog(info.family, method.name)
        self.stats = RunStats()
        self.last_run: Optional[dict] = None
        self.schedule: Optional[Schedule] = None
        self.core_node: Optional[str] = None   # ComfyUI's own sparse node, as found for this run
        self.checkpoint_attention = CheckpointAttention()
        self._hooks = []
        self.stats.meta = self._meta()

    def _meta(self) -> dict:
        return {"method": self.method.name, "family": self.info.family,
                "num_blocks": self.info.num_blocks, "num_heads": self.info.num_heads,
                "comfyui_version": comfyui_version(), **self.method.meta()}

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
        return SparseAttention(self.config, self.adapter, self.info, self.method.fresh(),
                               prev_override=prev_override)

    def summary(self) -> dict:
        """Summary of the last finished sampling run (or the one in progress)."""
        if self.last_run is not None:
            return self.last_run
        return self.stats.as_dict()

    # ------------------------------------------------------------------ the run report
    def count(self, reason: Optional[str], density=None):
        """One call of the forward in progress: sparse (``reason`` None) or dense."""
        self.stats.count(reason, self.fwd.step, self.fwd.block, density)

    def note_kernel_setup(self, q, plan, method):
        """Once per run, for the summary: the GPU's launch configuration (and why), the
        precision of the exact blocks (and why: ``auto``'s choice for the GPU, or the widget's)
        and the method's blocks. Not inside a torch.compile region (the dict would become a
        guard, the lookups graph breaks)."""
        meta = self.stats.meta
        if torch.compiler.is_compiling() or "kernel_config" in meta:
            return
        if plan.backend == "triton" and q.is_cuda:
            meta["kernel_config"] = kernels.config_for_device(q.device).describe()
        else:
            meta["kernel_config"] = f"backend {plan.backend} on {q.device.type}"
        meta["precision"] = method.precision_text(plan, q.device)
        blocks = method.blocks_text(plan)
        if blocks is not None:
            meta["sol_blocks"] = blocks

    def check_core_node(self, patcher, transformer_options) -> None:
        """Look for ComfyUI's own sparse node (:func:`core_sparse_node`); once found, this run
        (and the patched model's log, once) says what runs."""
        if self.core_node is not None or torch.compiler.is_compiling():
            return
        found = core_sparse_node(patcher, transformer_options)
        if found is not None:
            self.core_node = found
            self.log.core_node(self.stats, found, self.config.beside_core_node)

    @property
    def defers(self) -> bool:
        """Whether this run hands every call on untouched (ComfyUI's sparse node found, and
        ``beside_core_node`` is "defer")."""
        return self.core_node is not None and self.config.beside_core_node == "defer"

    def _check_override(self, transformer_options):
        """Record the run's attention override when it is not this dispatcher."""
        current = transformer_options.get("optimized_attention_override") if transformer_options else None
        if current is not self and not torch.compiler.is_compiling():
            self.stats.displaced_by = describe_override(current)

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
        self._hooks = (register_hooks(self.adapter, dm, self._enter, self._leave)
                       + self.checkpoint_attention.install(dm))
        self.log.checkpoint_attention(self.stats, self.checkpoint_attention.describe())
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
        self.method.start_run(self)
        self.schedule = locate(sigmas, ms) if sigmas is not None else None
        self.stats = RunStats()
        self.stats.meta = self._meta()
        self.last_run = None
        self.core_node = None
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
        self.check_core_node(patcher, options.get("transformer_options"))
        self._check_override(options.get("transformer_options"))
        self._install_hooks(patcher.model.diffusion_model)
        try:
            out = executor(*args, **kwargs)
        finally:
            self._remove_hooks()
            if self.method.runs_sparse:
                self.log.check_sparse_calls(self.stats)
            self.last_run = self.stats.as_dict()
            self.log.summary(self.last_run)
        self.method.finish_run(self, self.last_run)  # only after a run that finished
        return out

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
            self.log.note(self.stats, "grid", f"cannot read the latent shape ({e})")
        f.step, f.total, f.step_reason = self._step_of(transformer_options)
        self.check_core_node(getattr(executor.class_obj, "current_patcher", None), transformer_options)
        self._check_override(transformer_options)
        self.stats.forwards += 1
        if f.grid is not None:
            self.stats.grid = list(f.grid)
        try:
            out = executor(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)
            self.log.check_displaced(self.stats)
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
        return step, sc.total_steps, step_reason(step, sc.total_steps, self.config)

    # ------------------------------------------------------------------ the override
    def dense(self, func, args, kwargs):
        """The call as it would run without the patch: through an earlier override, else
        through the attention its module's checkpoint names (:mod:`.checkpoint_attention`),
        else ComfyUI's."""
        if self.prev_override is not None:
            return self.prev_override(func, *args, **kwargs)
        own = self.checkpoint_attention.dense_function()
        if own is not None:
            self.stats.count_checkpoint_attention()
            return own(*args, **kwargs)
        return func(*args, **kwargs)

    def run_dense(self, func, args, kwargs, verdict: Dense, in_video: bool):
        """The call run dense for ``verdict``, reported."""
        self.log.note(self.stats, verdict.reason, verdict.detail)
        self.count(verdict.reason)
        if in_video:
            self.stats.video_dense[verdict.reason] += 1
        return self.dense(func, args, kwargs)

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
        args = unwrap_containers(args)
        if self.defers:
            return self.run_dense(func, args, kwargs, Dense("core_sparse_node"), self._video_call_arrived())
        call = read_call(args, kwargs)
        if call is None:
            return self.dense(func, args, kwargs)
        return self.method.attend(self, func, args, kwargs, call, self._video_call_arrived())

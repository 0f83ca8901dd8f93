"""Patch a ComfyUI model clone with a :class:`~.dispatch.SparseAttention` dispatcher.

Only ``model.clone()``'s own ``model_options``, wrappers and callbacks change: the attention
override and the dispatcher in ``transformer_options``, one OUTER_SAMPLE and one APPLY_MODEL
wrapper under our key (module functions that find the dispatcher in the run's
``model_options``, so that a later clone of the patched model keeps working), and one
ON_CLONE callback. No ComfyUI module is modified. Patching an already patched model replaces
our earlier patch (its override is unwrapped to whatever was there before it). ComfyUI's own
Model Sparse Attention node, applied before the patch, is warned about here already
(``dispatch.core_sparse_node``).

Every clone of a patched model gets a dispatcher of its own (its own run statistics): ComfyUI
0.3.75 deep-copies ``model_options`` on ``clone()`` (the dispatcher's ``__deepcopy__`` makes
the copy); newer ComfyUI (0.33) copies only its dicts and lists, so the clone would share the
original's dispatcher, and the ON_CLONE callback gives it a fresh one.
"""
from __future__ import annotations

import logging

from .adapters import adapter_for
from .config import PatchConfig
from .dispatch import (TRANSFORMER_OPTIONS_KEY, WRAPPER_KEY, SparseAttention,
                       apply_model_wrapper, dispatcher_in, outer_sample_wrapper)
from .methods import method_for

log = logging.getLogger("sparse_video_attention")


def _diffusion_model(model):
    return model.get_model_object("diffusion_model")


def patch_model(model, config: PatchConfig, preset=None):
    """Return a patched clone of ``model`` (a ComfyUI ModelPatcher).

    Raises ValueError for settings that cannot apply to this model (dense_blocks out of
    range, PSA without a preset or with one whose family or fingerprint does not match the
    model). The token grid is only known when sampling: a grid the preset refuses makes
    those calls dense with a warning (``config.preset_grid``). An unsupported model family
    is not an error: the model is returned unpatched with a warning.
    """
    dm = _diffusion_model(model)
    adapter = adapter_for(dm)
    if adapter is None:
        log.warning("[sparse-video-attention] %s is not a supported video model (Wan, "
                    "HunyuanVideo, LTX-Video, LTX-2); returning the model unchanged",
                    type(dm).__name__)
        return model
    info = adapter.info(dm)
    return install(model, SparseAttention(config, adapter, info, method_for(config, preset, info)))


def install(model, state):
    """Clone ``model`` and install ``state`` (a dispatcher) as its attention override and
    wrappers, chaining to the override that was there before (not to an earlier one of ours)."""
    import comfy.patcher_extension as pe

    m = model.clone()
    to = m.model_options.setdefault("transformer_options", {})
    prev = to.get("optimized_attention_override")
    while getattr(prev, "is_sparse_video_attention", False):  # re-patching replaces our earlier patch
        prev = prev.prev_override
    state.prev_override = prev
    m.remove_wrappers_with_key(pe.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY)
    m.remove_wrappers_with_key(pe.WrappersMP.APPLY_MODEL, WRAPPER_KEY)
    m.remove_callbacks_with_key(pe.CallbacksMP.ON_CLONE, WRAPPER_KEY)
    to["optimized_attention_override"] = state
    to[TRANSFORMER_OPTIONS_KEY] = state
    # Module functions, not state.outer_sample / state.apply_model: clone() copies wrappers
    # shallowly, so the wrappers must find the dispatcher where the override lives (see
    # nodes/dispatch.py).
    m.add_wrapper_with_key(pe.WrappersMP.OUTER_SAMPLE, WRAPPER_KEY, outer_sample_wrapper)
    m.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, WRAPPER_KEY, apply_model_wrapper)
    m.add_callback_with_key(pe.CallbacksMP.ON_CLONE, WRAPPER_KEY, on_clone)
    state.check_core_node(m, to)   # ComfyUI's own sparse node applied before this patch
    return m


def on_clone(original, clone):
    """ON_CLONE callback: a clone that shares the original's dispatcher (ComfyUI that does not
    deep-copy ``model_options``) gets a fresh one, with the same settings and the same earlier
    override. The override entry is replaced only where it still is our dispatcher: one that a
    later node installed stays (and our wrappers warn that the patch is displaced)."""
    state = dispatcher_of(clone)
    if state is None or state is not dispatcher_of(original):
        return
    if clone.model_options is original.model_options:
        clone.model_options = dict(clone.model_options)
    to = clone.model_options["transformer_options"]
    if to is original.model_options.get("transformer_options"):
        to = clone.model_options["transformer_options"] = dict(to)
    fresh = state.fresh_copy(state.prev_override)
    to[TRANSFORMER_OPTIONS_KEY] = fresh
    if to.get("optimized_attention_override") is state:
        to["optimized_attention_override"] = fresh


def dispatcher_of(model):
    """The dispatcher of a patched model, or None."""
    return dispatcher_in(model.model_options.get("transformer_options"))


def run_summary(model):
    """Summary dict of the last sampling run of a patched model (None if not patched)."""
    state = dispatcher_of(model)
    return None if state is None else state.summary()

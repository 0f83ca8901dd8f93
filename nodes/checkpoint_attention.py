"""A checkpoint's own attention per module, kept on the calls the patch runs dense.

ComfyUI after 0.33 lets a checkpoint name an attention per module: a module that makes an
attention call (Wan's self- and cross-attention, for one) holds a ``comfy_attention``
(``ComfyAttention``) whose ``function`` is the attention the checkpoint asked for (comfy-kitchen's
INT8 attention, where it is built), and passes it to ``optimized_attention`` as
``preferred_attention``. ``wrap_attn`` drops that keyword before it calls an
``optimized_attention_override`` and tells the override nothing of it, so a call the patch
keeps dense (cross-attention, warm-up, ``dense_blocks``, HunyuanVideo's text refiner...) would
run ComfyUI's global attention instead: slower, and not the unpatched model's numbers.

:class:`CheckpointAttention` hooks, for the length of a run, the modules whose
``comfy_attention`` has a function: a forward pre-hook records which one is running, and the
dispatcher's dense path (:meth:`CheckpointAttention.dense_function`) calls its function as
``wrap_attn`` would without an override. Models of ComfyUI 0.3.75 and 0.33 hold no such module:
nothing is hooked there.
"""
from __future__ import annotations

from typing import Callable, Optional


def preferred_function(module) -> Optional[Callable]:
    """The attention function a module's checkpoint asked for, or None (no ``comfy_attention``,
    or one without a function: no config, or its kernel is not available here)."""
    fn = getattr(getattr(module, "comfy_attention", None), "function", None)
    return fn if callable(fn) else None


def function_name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


class CheckpointAttention:
    """The modules of one diffusion model that name their own attention, and which of them is
    running (see module docstring)."""

    def __init__(self):
        self._running: list = []   # the comfy_attention of each hooked module being run, innermost last
        self.modules = 0           # hooked modules of the last install
        self.functions: tuple = ()  # their functions' names

    def install(self, dm) -> list:
        """Hook every module of ``dm`` that names its own attention; the handles (the caller
        removes them)."""
        self._running.clear()
        handles, names = [], set()
        for module in dm.modules():
            fn = preferred_function(module)
            if fn is None:
                continue
            names.add(function_name(fn))
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._leave))
        self.modules, self.functions = len(handles) // 2, tuple(sorted(names))
        return handles

    def _enter(self, module, args):
        self._running.append(module.comfy_attention)

    def _leave(self, module, args, output):
        if self._running:
            self._running.pop()

    def dense_function(self) -> Optional[Callable]:
        """The attention function of the module whose call is running, or None."""
        return getattr(self._running[-1], "function", None) if self._running else None

    def describe(self) -> Optional[dict]:
        """For the run summary: the hooked modules and their functions, or None."""
        if not self.modules:
            return None
        return {"modules": self.modules, "functions": list(self.functions)}

"""A stand-in for ComfyUI's own "Model Sparse Attention" node (comfy_extras/nodes_sparse_attention.py,
ComfyUI after 0.33), for the tests of tests/nodes/test_nodes_core_sparse.py. Neither ComfyUI of
the test matrix ships that node; this module follows its published protocol, written for these
tests (docs/COMFYUI_NOTES.md, "ComfyUI's own Model Sparse Attention node"):

* the node's model is a ``clone()`` whose ``transformer_options["optimized_attention_override"]``
  is an override of this module, wrapping the override it found there (``previous``);
* it registers an ``ON_PREPARE_STATE`` callback keyed ``"block_sparse_attention"`` on the clone
  that puts a new wrapper of whatever override is on the run's hook back on top at every step,
  unless one of its own is there already;
* a call it declines goes, with its arguments made ``(q, k, v, heads)`` plus keywords, to
  ``previous`` (or ``func`` when there was none). It takes a call without a mask, with q, k and v
  of one shape (self-attention), head dim ``head_dim`` (the real node: 128), at least
  ``min_tokens`` tokens (the real node: 12,288) and a sigma at or below the one at
  ``start_percent`` of the model's sampling;
* its "sparse" attention is ComfyUI's default attention (``func``), counted in
  :attr:`StandIn.taken` (the step index of each call it took), so a test can tell which calls
  it ran.

The tests do not import this file: they copy it to ``<dir>/comfy_extras/nodes_sparse_attention.py``
and load it by its path, as ComfyUI loads its comfy_extras files (``nodes.load_custom_node``:
the module's name is the file's path less ".py"), so that its override reports the same
path-style module as the real node's.

ComfyUI 0.3.75 calls ``ON_PREPARE_STATE`` callbacks as ``callback(patcher, timestep)``, without
the run's ``model_options``: the real node (which needs them) cannot run there; this stand-in then
leaves the hook as it is, and counts the steps it could not re-install in
:attr:`StandIn.no_model_options`.
"""
from __future__ import annotations

import math

import comfy.patcher_extension

CALLBACK_KEY = "block_sparse_attention"


class StandIn:
    """Settings and counts of one stand-in node application."""

    def __init__(self, min_tokens=0, head_dim=128, sigma_start=math.inf):
        self.min_tokens = min_tokens
        self.head_dim = head_dim
        self.sigma_start = sigma_start
        self.own = []              # the overrides it put on a hook
        self.taken = []            # the step index of every call it ran itself
        self.reinstalled = 0       # ON_PREPARE_STATE calls that found the hook in the run
        self.no_model_options = 0  # ON_PREPARE_STATE calls without the run's model_options

    def takes(self, q, k, v, heads, mask, skip_reshape, transformer_options) -> bool:
        if mask is not None or q.shape != k.shape or q.shape != v.shape:
            return False
        tokens, width = (q.shape[2], q.shape[3]) if skip_reshape else (q.shape[1], q.shape[2] // heads)
        if width != self.head_dim or tokens < self.min_tokens:
            return False
        sigmas = transformer_options.get("sigmas")
        return sigmas is None or float(sigmas.max()) <= self.sigma_start

    def step_of(self, transformer_options):
        sigmas, schedule = transformer_options.get("sigmas"), transformer_options.get("sample_sigmas")
        if sigmas is None or schedule is None:
            return None
        hit = (schedule == sigmas.max()).nonzero()
        return int(hit[0, 0]) if len(hit) else None

    def override_over(self, previous):
        """A new override of this node on top of ``previous``."""
        def block_sparse_override(func, q, k, v, heads, mask=None, attn_precision=None,
                                  skip_reshape=False, skip_output_reshape=False, **kwargs):
            options = kwargs.get("transformer_options") or {}
            if not self.takes(q, k, v, heads, mask, skip_reshape, options):
                keywords = dict(mask=mask, attn_precision=attn_precision, skip_reshape=skip_reshape,
                                skip_output_reshape=skip_output_reshape, **kwargs)
                if previous is None:
                    return func(q, k, v, heads, **keywords)
                return previous(func, q, k, v, heads, **keywords)
            self.taken.append(self.step_of(options))
            return func(q, k, v, heads, mask=mask, attn_precision=attn_precision,
                        skip_reshape=skip_reshape, skip_output_reshape=skip_output_reshape, **kwargs)
        return block_sparse_override

    def install(self, transformer_options):
        """Put a wrapper of the hook's override on top, unless one of ours is on top already."""
        current = transformer_options.get("optimized_attention_override")
        if any(current is mine for mine in self.own):
            return
        mine = self.override_over(current)
        self.own.append(mine)
        transformer_options["optimized_attention_override"] = mine

    def on_prepare_state(self, model_patcher, timestep, model_options=None):
        if model_options is None:
            self.no_model_options += 1
            return
        self.reinstalled += 1
        self.install(model_options.setdefault("transformer_options", {}))


def apply(model, start_percent=0.0, **settings):
    """The node on ``model``: returns (its clone, the :class:`StandIn` with its counts). Its
    sparse steps start at ``start_percent`` of the model's sampling (its sigma at that point)."""
    sigma_start = float(model.get_model_object("model_sampling").percent_to_sigma(start_percent))
    state = StandIn(sigma_start=sigma_start, **settings)
    m = model.clone()   # its own model_options dicts (copied by clone() on both versions)
    state.install(m.model_options.setdefault("transformer_options", {}))
    m.add_callback_with_key(comfy.patcher_extension.CallbacksMP.ON_PREPARE_STATE, CALLBACK_KEY,
                            state.on_prepare_state)
    return m, state

"""The run report: what one sampling run of a patched model did and why.

- :class:`RunStats`: the counts of one run (sparse and dense calls by reason, per step,
  achieved density per step, block and head), read by ``patching.run_summary`` and the
  Inspector as the plain dict of :meth:`RunStats.as_dict`.
- :class:`RunLog`: what is logged once per patched model: the first detail of each dense
  reason (INFO for the reasons that mean "working as configured", else WARNING) and the
  guards against a patch that silently does nothing:

  - ``displaced``: at run time the ``optimized_attention_override`` in the run's
    ``transformer_options`` is not the patch's dispatcher (a node placed after the patch
    installed its own: ModelAttentionBackend, a Sage or Radial attention patch...), and the
    video self-attention ran in a model evaluation without one call reaching the dispatcher
    (an override that hands its calls on to ours is not a displacement; the summary still
    names it);
  - ``displaced_in_part``: that other override hands some video self-attention modules' calls
    on and runs the others itself (ComfyUI's own block-sparse node after 0.33 does, putting
    itself back on top at every step: then the fix is one sparse node per model, not the
    order);
  - ``no_sparse_calls``: a sparse method's run made no sparse call although the video
    self-attention modules ran (the warning says why: displaced, none of their calls reached
    the override, or every call dense for the reasons counted);
  - ``core_sparse_node``: ComfyUI's own Model Sparse Attention node is on the model too
    (``dispatch.core_sparse_node``). The warning says what runs (the patch stands aside with
    ``beside_core_node`` "defer", or runs the calls that node declines with "share"), why the
    order of the two nodes does not matter, and the fix; it replaces the displacement and
    no-sparse-call warnings that node's override would otherwise raise.

Achieved density: Sol-Attn reports the share of exactly computed key blocks per head (the
kernel's statistics); PSA the share of kept video-token pairs of the preset's mask per head on
the video's grid (HunyuanVideo's text tokens, dense both ways, are not counted).
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Optional

import torch

from .widgets import clip

log = logging.getLogger("sparse_video_attention")

# Reasons that mean "working as configured" are logged at INFO; the rest at WARNING.
EXPECTED_REASONS = frozenset({"method_dense", "not_video_self_attention", "warmup", "final_dense",
                              "dense_block", "min_tokens", "low_precision", "search_evaluated",
                              "search_step", "core_sparse_node"})

REASON_TEXT = {
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
    "search_evaluated": "evaluated for the PSA mask search (output kept dense)",
    "search_step": "step not chosen for the PSA mask search",
    "search_grid": "token grid or extra tokens differ from the first call of this search run",
    "search_error": "the PSA mask search raised an exception on this call",
    "core_sparse_node": "ComfyUI's own Model Sparse Attention node is on this model and "
                        "beside_core_node is 'defer': the patch stands aside for the run",
    "search_call_options": "the call passes its own softmax scale or asks for grouped-query "
                           "attention; the loss tables assume 1/√head dim and one key head per "
                           "query head",
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
CORE_NODE_FIX = ("use one sparse-attention node per model: remove ComfyUI's Model Sparse Attention "
                 "node or this patch (beside_core_node 'share' lets the patch run the calls "
                 "ComfyUI's node declines, e.g. LTX-Video's head dim 64)")
_CORE_NODE_RUNS = {
    "defer": "ComfyUI's node runs its own sparse attention on the calls it takes and this patch "
             "stands aside for the run (beside_core_node 'defer': every call it is handed runs "
             "as without the patch, counted as core_sparse_node), so two sparse methods never mix",
    "share": "ComfyUI's node runs its own sparse attention on the calls it takes (head dim 128, "
             "long enough sequences, inside its steps) and this patch runs the calls it declines "
             "(beside_core_node 'share'): two sparse methods in one run",
}
SETTINGS_FIX = ("see why in the run summary's dense_calls: lower min_tokens, warmup or "
                "dense_blocks, or use a model, dtype and backend the kernels take")
_WARNING_TEXT = {
    "displaced": "this run's attention override is {detail}, not the Sparse Attention Patch's: a "
                 "node after the patch replaced it, so no attention call reaches the patch",
    "displaced_in_part": "this run's attention override is {detail}",
    "no_sparse_calls": "the run made no sparse attention call although the video self-attention "
                       "ran: {detail}",
    "core_sparse_node": "ComfyUI's own Model Sparse Attention node is on this model too ({detail}). "
                        "Node order does not matter: it puts its override back on top at every "
                        "step and hands the calls it declines to the attention before it, this "
                        "patch's included. What runs: {runs}",
}


def displacement_fix(displaced_by: str) -> str:
    """The fix a displacement warning names, for the override described by ``displaced_by``."""
    return ONE_SPARSE_NODE if _CORE_SPARSE_OVERRIDE.search(displaced_by) else PLACE_LAST


def is_core_sparse_override(fn) -> bool:
    """Whether ``fn`` is the attention override of ComfyUI's own Model Sparse Attention node."""
    return fn is not None and bool(_CORE_SPARSE_OVERRIDE.search(describe_override(fn)))


def describe_override(fn) -> str:
    """An attention override as the summary names it: its module and qualified name."""
    if fn is None:
        return "none"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{name}"


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
        self.core_node = None     # how ComfyUI's Model Sparse Attention node was found, or None
        self.beside_core = None   # then: the patch's beside_core_node ("defer" / "share")
        self.checkpoint_attention = None  # the modules naming their own attention (checkpoint_attention.describe)
        self.checkpoint_attention_calls = 0  # dense calls run through it
        self.meta = {}           # method, family, sizes, preset (set by the dispatcher)

    def count(self, reason: Optional[str], step, block, density=None):
        """One call of ``step`` in ``block``: sparse (``reason`` None, with its achieved
        ``density`` per head, (B, H) or (H,)) or dense for ``reason``."""
        if torch.compiler.is_compiling():
            # Python counters inside a compiled region would be specialised into guards.
            self.compiled_calls_unseen = True
            return
        if reason is None:
            self.sparse += 1
            self.per_step[step]["sparse"] += 1
            if density is not None:
                per_head = density.detach().float().reshape(-1, density.shape[-1]).mean(0)
                for table, key, d in ((self.density, (step, block), per_head.mean()),
                                      (self.head_density, block, per_head)):
                    if key in table:
                        s, n = table[key]
                        table[key] = [s + d, n + 1]
                    else:
                        table[key] = [d, 1]
        else:
            self.dense[reason] += 1
            self.per_step[step]["dense"] += 1

    def count_checkpoint_attention(self):
        """One dense call run through its module's own attention."""
        if not torch.compiler.is_compiling():
            self.checkpoint_attention_calls += 1

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
            "core_sparse_node": (None if self.core_node is None else
                                 {"found": self.core_node, "beside_core_node": self.beside_core}),
            "checkpoint_attention": (None if self.checkpoint_attention is None else
                                     {**self.checkpoint_attention, "dense_calls": self.checkpoint_attention_calls}),
            "schedule": self.schedule,
            "compiled_calls_unseen": self.compiled_calls_unseen,
        }


class RunLog:
    """The log of one patched model (``method`` on a ``family`` model): each dense reason and
    each guard is logged once in its life, and noted in every run's stats."""

    def __init__(self, family: str, method: str):
        self.family = family
        self.method = method
        self._logged = set()

    def note(self, stats: RunStats, reason: str, detail: str = "") -> None:
        """A call ran dense for ``reason``."""
        detail = clip(detail, 1000)
        stats.notes.setdefault(reason, REASON_TEXT.get(reason, reason) + (f": {detail}" if detail else ""))
        if reason in self._logged:
            return
        self._logged.add(reason)
        msg = f"[sparse-video-attention] {self.family}: dense because " \
              f"{REASON_TEXT.get(reason, reason)}{': ' + detail if detail else ''} " \
              f"(logged once)"
        (log.info if reason in EXPECTED_REASONS else log.warning)(msg)

    def warn(self, stats: RunStats, guard: str, detail: str, fix: str = PLACE_LAST, **more) -> None:
        """A silent-no-op guard fired: once per patched model in the log, and in the summary."""
        msg = _WARNING_TEXT[guard].format(detail=detail, **more) + f". Fix: {fix}."
        stats.warnings.setdefault(guard, msg)
        if guard not in self._logged:
            self._logged.add(guard)
            log.warning("[sparse-video-attention] %s %s: %s (warned once)", self.family, self.method, msg)

    def core_node(self, stats: RunStats, found: str, mode: str) -> None:
        """The ``core_sparse_node`` guard: ComfyUI's own sparse node was ``found`` on the model;
        the patch's ``beside_core_node`` is ``mode``."""
        stats.core_node, stats.beside_core = found, mode
        self.warn(stats, "core_sparse_node", found, CORE_NODE_FIX, runs=_CORE_NODE_RUNS[mode])

    def checkpoint_attention(self, stats: RunStats, modules: Optional[dict]) -> None:
        """The checkpoint names its own attention for some ``modules``
        (``checkpoint_attention.describe``, or None): in the run's stats, and logged once."""
        stats.checkpoint_attention = modules
        if modules is None or "checkpoint_attention" in self._logged:
            return
        self._logged.add("checkpoint_attention")
        log.info("[sparse-video-attention] %s: the checkpoint names its own attention for %d modules (%s); "
                 "the calls the patch keeps dense run it, as without the patch (logged once)",
                 self.family, modules["modules"], ", ".join(modules["functions"]))

    def check_displaced(self, stats: RunStats) -> None:
        """The ``displaced`` guards, after a model evaluation: another override is the run's,
        and the video self-attention ran without one call reaching the dispatcher, or with
        some of its modules' calls run by that override alone. ComfyUI's own sparse node, once
        found, has its own warning (``core_sparse_node``)."""
        if stats.displaced_by is None or not stats.video_modules:
            return
        if stats.core_node is not None and _CORE_SPARSE_OVERRIDE.search(stats.displaced_by):
            return
        fix = displacement_fix(stats.displaced_by)
        if not stats.video_calls:
            self.warn(stats, "displaced", stats.displaced_by, fix)
        elif stats.video_modules_unreached:
            self.warn(stats, "displaced_in_part", f"{stats.displaced_by}, placed after the patch: it handed "
                      f"the patch the attention of only some video self-attention modules ("
                      f"{stats.video_modules_unreached} of {stats.video_modules} ran without the patch)", fix)

    def check_sparse_calls(self, stats: RunStats) -> None:
        """The ``no_sparse_calls`` guard, at the end of a run of a sparse method."""
        if stats.sparse or not stats.video_modules or stats.compiled_calls_unseen:
            return
        if stats.core_node is not None and (stats.beside_core == "defer" or not stats.video_calls):
            return  # no sparse call by design, or ComfyUI's node took them all: core_sparse_node says it
        if stats.displaced_by is not None and not stats.video_calls:
            self.warn(stats, "no_sparse_calls", f"the run's attention override is {stats.displaced_by}",
                      displacement_fix(stats.displaced_by))
        elif not stats.video_calls:
            self.warn(stats, "no_sparse_calls", f"{stats.video_modules} video self-attention module calls, "
                      "but none of their attention calls reached the patch's override")
        else:
            counts = ", ".join(f"{k}={v}" for k, v in sorted(stats.video_dense.items()))
            self.warn(stats, "no_sparse_calls", f"all {stats.video_calls} video self-attention calls ran "
                      f"dense ({counts})", SETTINGS_FIX)

    def summary(self, s: dict) -> None:
        """The line that ends a sampling run (``s``: :meth:`RunStats.as_dict`)."""
        dense = ", ".join(f"{k}={v}" for k, v in sorted(s["dense_calls"].items())) or "none"
        md = s["mean_density"]
        log.info("[sparse-video-attention] %s %s: %d forwards, %d attention calls, %d sparse "
                 "(mean density %s), dense: %s%s", self.family, self.method,
                 s["forwards"], s["calls"], s["sparse_calls"],
                 "n/a" if md is None else f"{md:.3f}", dense,
                 f"; warnings: {', '.join(sorted(s['warnings']))}" if s["warnings"] else "")

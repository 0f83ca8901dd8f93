"""The patch beside ComfyUI's own "Model Sparse Attention" node on the same model, inside a real
ComfyUI (CPU; the version of the matrix that runs).

Neither ComfyUI of the matrix ships that node: tests/core_sparse_standin.py follows its
protocol (its ON_PREPARE_STATE callback "block_sparse_attention" re-installs its override on
top at every step, declined calls go to the override it found) and is loaded by file path as
ComfyUI loads comfy_extras, so its override reports the same path-style module. Its "sparse"
attention is the default attention, counted per step.

Orders: patch → core, core → patch, patch → ModelSamplingSD3 (a clone) → core, patch → core →
a LoRA-style clone. ``beside_core_node`` "defer" (default): the patch runs nothing sparse, the
output is the unpatched one, one warning per patched model (log) and per run (summary), every
call it is handed counted as ``core_sparse_node``. "share": the patch runs exactly the video
self-attention calls the stand-in declines.
"""
from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

import comfyui_harness as H
from pack_nodes import patch, summary

LOGGER = "sparse_video_attention"
STEPS, LAYERS = 3, 3
WARNING = "Model Sparse Attention node is on this model too"
ORDERS = ("patch_core", "core_patch", "patch_shift_core", "patch_core_clone")


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(0, num_layers=LAYERS)


@pytest.fixture(scope="module")
def core(comfy, tmp_path_factory):
    """The stand-in module, loaded from <dir>/comfy_extras/nodes_sparse_attention.py under its
    path less ".py", as ComfyUI's nodes.load_custom_node loads a comfy_extras file."""
    folder = tmp_path_factory.mktemp("comfyui-core") / "comfy_extras"
    folder.mkdir()
    path = folder / "nodes_sparse_attention.py"
    shutil.copy(Path(__file__).resolve().parents[1] / "core_sparse_standin.py", path)
    name = os.path.splitext(str(path))[0]
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(name, None)


def prepare_state_gets_model_options() -> bool:
    """0.33 calls ON_PREPARE_STATE callbacks with the run's model_options; 0.3.75 does not."""
    import comfy.model_patcher
    return "model_options" in inspect.signature(comfy.model_patcher.ModelPatcher.prepare_state).parameters


def shift_node(comfy):
    return comfy.nodes.NODE_CLASS_MAPPINGS["ModelSamplingSD3"]()


def build(order, pack, comfy, core, wan, **widgets):
    """(the model to sample, the stand-in's counts, the unpatched model with the same sampling)."""
    widgets = {"beta": 1.0, "warmup": 0.0, "dense_blocks": "", **widgets}
    base = wan.patcher
    if order == "core_patch":
        c, state = core.apply(base, start_percent=0.5)
        return patch(pack, c, **widgets), state, base
    m = patch(pack, base, **widgets)
    if order == "patch_shift_core":
        (m,) = shift_node(comfy).patch(m, shift=3.0)
        (base,) = shift_node(comfy).patch(base, shift=3.0)
    m, state = core.apply(m, start_percent=0.5)
    if order == "patch_core_clone":
        m = m.clone()
    return m, state, base


def core_on_top(order) -> bool:
    """Whether the stand-in's override runs before the patch's: it was applied after the patch,
    or it re-installs itself on top at every step (ComfyUI that hands it the run's options)."""
    return order != "core_patch" or prepare_state_gets_model_options()


def logged(caplog, text):
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
            and text in r.getMessage()]


def test_found_by_its_callback_key_or_its_override(pack, core, wan):
    find = pack.dispatch.core_sparse_node
    assert find(wan.patcher, wan.patcher.model_options.get("transformer_options")) is None
    c, _ = core.apply(wan.patcher)
    found = find(c, c.model_options["transformer_options"])
    assert "ON_PREPARE_STATE callback 'block_sparse_attention'" in found
    assert "/comfy_extras/nodes_sparse_attention.StandIn.override_over" in found
    # the callback alone (before its override is on the hook)...
    import comfy.patcher_extension as pe
    only_key = wan.patcher.clone()
    only_key.add_callback_with_key(pe.CallbacksMP.ON_PREPARE_STATE, "block_sparse_attention", lambda *a: None)
    assert "callback" in find(only_key, {}) and "override" not in find(only_key, {})
    # ...the override alone, also below the patch's dispatcher
    top = c.model_options["transformer_options"]["optimized_attention_override"]
    assert "override" in find(None, {"optimized_attention_override": top})
    below = patch(pack, H.with_attention_override(wan.patcher, top))
    assert find(None, below.model_options["transformer_options"]) is not None
    # another node's callback key, or an override of that name from another module: not it
    other = wan.patcher.clone()
    other.add_callback_with_key(pe.CallbacksMP.ON_PREPARE_STATE, "some_other_node", lambda *a: None)

    def block_sparse_override(func, *args, **kwargs):
        return func(*args, **kwargs)
    assert find(other, {"optimized_attention_override": block_sparse_override}) is None


def test_the_widget_follows_the_older_ones_and_defaults_to_defer(pack):
    schema = pack.node_patch.SparseAttentionPatch.define_schema()
    widget = schema.inputs[-2]  # only precision came after it
    assert widget.id == "beside_core_node" and widget.default == "defer"
    assert list(widget.options) == ["defer", "share"]
    with pytest.raises(ValueError, match="beside_core_node"):
        pack.config.make_config(beside_core_node="mix")


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
def test_defer_runs_nothing_sparse_and_says_so_once(pack, comfy, core, wan, order, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        m, state, base = build(order, pack, comfy, core, wan)
        # core → patch: found when the patch is applied
        assert len(logged(caplog, WARNING)) == (1 if order == "core_patch" else 0)
        out = H.sample(wan, steps=STEPS, model=m)
        first = summary(pack, m)
        H.sample(wan, steps=STEPS, model=m)
    s = summary(pack, m)
    assert state.taken, "the stand-in ran none of its calls"
    torch.testing.assert_close(out, H.sample(wan, steps=STEPS, model=base))  # nothing of the patch ran
    for run in (first, s):
        assert run["sparse_calls"] == 0 and run["calls"] > 0
        assert run["dense_calls"] == {"core_sparse_node": run["calls"]}
        assert set(run["warnings"]) == {"core_sparse_node"}, run["warnings"]
        assert run["core_sparse_node"]["beside_core_node"] == "defer"
        assert "block_sparse_attention" in run["core_sparse_node"]["found"]
    if core_on_top(order):   # the patch was handed only what the stand-in declined
        assert s["calls"] == 2 * LAYERS * STEPS - len(state.taken) // 2
    text = s["warnings"]["core_sparse_node"]
    assert "Node order does not matter" in text and "beside_core_node 'defer'" in text
    assert text.endswith("Fix: " + pack.report.CORE_NODE_FIX + ".")
    assert len(logged(caplog, WARNING)) == 1                 # once per patched model
    assert not logged(caplog, "Fix: place") and not logged(caplog, "no sparse attention call")
    info = json.loads(pack.node_inspector.SparseAttentionInspector.execute(model=m).result[3])
    assert info["warnings"] == s["warnings"] and info["core_sparse_node"] == s["core_sparse_node"]


@pytest.mark.slow
@pytest.mark.parametrize("order", ORDERS)
def test_share_runs_exactly_the_calls_the_core_node_declines(pack, comfy, core, wan, order, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        m, state, _ = build(order, pack, comfy, core, wan, beside_core_node="share")
        H.sample(wan, steps=STEPS, model=m)
    s = summary(pack, m)
    assert state.reinstalled > 0 if prepare_state_gets_model_options() else state.no_model_options > 0
    sparse_by_step = {step: c["sparse"] for step, c in s["steps"].items()}
    if core_on_top(order):
        taken = [state.taken.count(step) for step in range(STEPS)]
        assert 0 < sum(taken) < LAYERS * STEPS, taken           # it takes some steps, not all
        # per step: every video self-attention call it declined ran sparse in the patch
        assert sparse_by_step == {step: LAYERS - taken[step] for step in range(STEPS)}, (sparse_by_step, taken)
    else:  # 0.3.75, core → patch: the stand-in cannot get back on top; the patch runs first
        assert state.taken == [] and s["sparse_calls"] == LAYERS * STEPS
    assert "core_sparse_node" not in s["dense_calls"]
    assert set(s["warnings"]) == {"core_sparse_node"}
    assert "beside_core_node 'share'" in s["warnings"]["core_sparse_node"]
    assert len(logged(caplog, WARNING)) == 1
    assert not logged(caplog, "Fix: place")

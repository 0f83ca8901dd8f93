"""Error messages echo at most a few hundred characters of what was typed or sent: a 1 MB
widget value through the API must not come back as a 1 MB error in the UI, the history and
the log. Every message still names the widget (real ComfyUI, CPU)."""
from __future__ import annotations

import pytest

import comfyui_harness as H

HUGE = "x" * 1_000_000
LIMIT = 400


@pytest.fixture(scope="module")
def model(comfy):
    return H.build_wan21(3, num_layers=2).patcher


def message(call) -> str:
    with pytest.raises((ValueError, TypeError)) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize("widget, value", [
    ("dense_blocks", HUGE), ("dense_blocks", "1" * 1_000_000), ("dense_blocks", "0," * 500_000),
    ("sol_tile", HUGE), ("sol_tile", "8,8," + "1" * 1_000_000), ("method", HUGE), ("estimator", HUGE),
    ("backend", HUGE), ("preset_grid", HUGE), pytest.param("min_tokens", 10 ** 5000, id="min_tokens-huge_int"), ("beta", HUGE),
])
def test_patch_errors_are_bounded(pack, model, widget, value):
    text = message(lambda: pack.node_patch.SparseAttentionPatch.execute(model, **{widget: value}))
    assert text.startswith(f"{widget}: ") and len(text) < LIMIT, text[:500]


@pytest.mark.parametrize("widget, value", [
    ("steps", HUGE), ("steps", "5" * 1_000_000), ("steps", "0," * 500_000), ("tile", HUGE),
    ("bucket_edges", HUGE), ("bucket_edges", "0.5 " * 250_000), ("table_name", HUGE), pytest.param("max_candidates", 10 ** 5000, id="max_candidates-huge_int"),
])
def test_search_errors_are_bounded(pack, model, widget, value):
    text = message(lambda: pack.node_search.PSAMaskSearch.execute(model, **{widget: value}))
    assert text.startswith(f"{widget}") and len(text) < LIMIT, text[:500]


@pytest.mark.parametrize("widgets, name", [({"table": HUGE}, "table"),
                                           ({"table": "t.safetensors", "preset_name": HUGE}, "preset_name")])
def test_select_errors_are_bounded(pack, widgets, name):
    text = message(lambda: pack.node_search.PSAMaskSelect.execute(**widgets))
    assert text.startswith(f"{name}: ") and len(text) < LIMIT, text[:500]


def test_preset_loader_errors_are_bounded(pack):
    text = message(lambda: pack.node_preset.LoadStripeMaskPreset.execute(HUGE))
    assert len(text) < LIMIT, text[:500]

"""PSA Mask Search / PSA Mask Select inside a real ComfyUI (CPU): the search runs during an
ordinary sampling run with a dense output, shows progress through comfy.utils.ProgressBar,
writes loss tables (and Q/K/V samples for the offline CLI); Select turns a table into a
preset that Sparse Attention Patch runs."""
from __future__ import annotations

import json
import os

import pytest
import torch

import comfyui_harness as H
from kernels.preset_file import load_preset
from kernels.psa_mask import psa_mask
from kernels.psa_search import LossTable, estimate_sample_bytes, load_qkv_sample, search_samples
from pack_nodes import live_dispatcher, patch, sample_seeing_hunyuan_layers, search, summary, value_rows

STEPS = 4


@pytest.fixture(scope="module")
def wan(comfy):
    tiny = H.build_wan21(5, num_layers=2, dim=256)       # 2 blocks, 2 heads, grid (3, 4, 6)
    return tiny, H.sample(tiny, steps=STEPS)


@pytest.fixture
def progress():
    """ComfyUI's global progress-bar hook (what the server sets), recording updates."""
    import comfy.utils
    calls = []
    previous = comfy.utils.PROGRESS_BAR_HOOK
    comfy.utils.set_progress_bar_global_hook(lambda value, total, preview, node_id=None:
                                             calls.append((value, total)))
    yield calls
    comfy.utils.set_progress_bar_global_hook(previous)


def select(pack, table, name, **widgets):
    out = pack.node_search.PSAMaskSelect.execute(table, preset_name=name, **widgets)
    return out.result[0], json.loads(out.result[1])


def test_search_keeps_output_dense_writes_table_and_shows_progress(pack, wan, progress):
    tiny, base = wan
    m = search(pack, tiny.patcher, "wan_t1")
    out = H.sample(tiny, steps=STEPS, model=m)
    torch.testing.assert_close(out, base, atol=0, rtol=0)     # the workflow's video is unchanged
    s = summary(pack, m)
    assert s["dense_calls"] == {"search_evaluated": STEPS * 2, "not_video_self_attention": STEPS * 2}
    path = s["search"]["table"]
    assert path.endswith(os.path.join("psa_loss_tables", "wan_t1.safetensors"))
    t = LossTable.load(path)
    assert t.layers == [0, 1] and t.grid == (3, 4, 6) and t.tile == (1, 2, 2)
    assert t.calls.tolist() == [[STEPS], [STEPS]] and t.num_heads == 2
    assert not torch.isnan(t.loss()).any()
    assert t.settings["family"] == "wan" and t.settings["prompts"] == 1
    assert t.settings["fingerprint"] == {"layers": 2, "heads": 2, "head_dim": 128, "hidden_size": 256}
    # the dense candidate has zero loss; narrower ones lose something
    dense = int(torch.argmax(t.density))
    assert float(t.density[dense]) == 1.0 and float(t.loss()[..., dense].abs().max()) < 1e-10
    assert float(t.loss().max()) > 0
    # progress: one update per evaluated call, total = steps × blocks. ComfyUI 0.33's
    # ProgressBar throttles what reaches the hook (the first and the last update always do).
    n = STEPS * 2
    values = [v for v, _ in progress]
    assert progress[0] == (1, n) and progress[-1] == (n, n) and {t for _, t in progress} == {n}
    assert values == sorted(set(values))
    if H.comfyui_env.comfyui_version() == "0.3.75":
        assert values == list(range(1, n + 1))


def test_search_steps_and_accumulate(pack, wan):
    tiny, _ = wan
    m = search(pack, tiny.patcher, "wan_acc", steps="1-2", accumulate=True)
    H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["dense_calls"]["search_step"] == 2 * 2 and s["search"]["evaluated_calls"] == 2 * 2
    first = LossTable.load(s["search"]["table"])
    H.sample(tiny, steps=STEPS, seed=7, model=m)           # a second "prompt"
    both = LossTable.load(s["search"]["table"])
    assert both.settings["prompts"] == 2 and both.calls.tolist() == [[4], [4]]
    assert (both.sq_err >= first.sq_err).all() and (both.sq_err > first.sq_err).any()


def test_saved_qkv_reproduce_the_table_offline(pack, wan, caplog):
    tiny, _ = wan
    m = search(pack, tiny.patcher, "wan_qkv", save_qkv=True, steps="-2--1")
    with caplog.at_level("INFO", logger="sparse_video_attention"):
        H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)["search"]
    assert s["qkv_files"] == 2 * 2 and s["qkv_bytes"] > 0
    estimate = [r.getMessage() for r in caplog.records if "Q/K/V samples: about" in r.getMessage()]
    assert estimate and s["qkv_dir"] in estimate[0]
    files = sorted(os.path.join(s["qkv_dir"], f) for f in os.listdir(s["qkv_dir"]))
    assert len(files) == 4
    online = LossTable.load(s["table"])
    offline = search_samples(files, tile=(1, 2, 2), candidates=online.candidates, query_tiles=None)
    assert offline.layers == online.layers
    torch.testing.assert_close(offline.sq_err, online.sq_err, rtol=1e-9, atol=0)
    # a size cap below the estimate writes nothing
    m = search(pack, tiny.patcher, "wan_qkv_capped", save_qkv=True, qkv_max_gb=0.0)
    H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)["search"]
    assert s["qkv_files"] == 0 and "exceeds qkv_max_gb" in s["qkv_refused"]


def test_qkv_max_gb_caps_the_sample_folder_not_one_run(pack, wan):
    """Decision (docs/HARDENING.md): runs that accumulate keep filling one folder, so the cap
    counts what is already there."""
    tiny, _ = wan
    per_run = STEPS * 2 * estimate_sample_bytes((1, 72, 2, 128), torch.float32)
    cap_gb = 1.5 * per_run / 1e9                                 # one run fits, two do not
    m = search(pack, tiny.patcher, "wan_qkv_folder_cap", save_qkv=True, accumulate=True, qkv_max_gb=cap_gb)
    H.sample(tiny, steps=STEPS, model=m)
    first = summary(pack, m)["search"]
    assert first["qkv_files"] == STEPS * 2 and "qkv_refused" not in first
    H.sample(tiny, steps=STEPS, seed=3, model=m)
    second = summary(pack, m)["search"]
    assert second["qkv_files"] == 0 and first["qkv_dir"] in second["qkv_refused"]
    assert "plus the 0 GB already" not in second["qkv_refused"] and "exceeds qkv_max_gb" in second["qkv_refused"]
    assert len(os.listdir(first["qkv_dir"])) == STEPS * 2
    assert LossTable.load(second["table"]).settings["prompts"] == 2    # the table still grows


def test_search_skips_calls_with_their_own_scale_or_gqa(pack, wan):
    """The loss tables assume the default softmax scale and one key head per query head."""
    import comfy.ldm.modules.attention as attention
    tiny, _ = wan
    d = live_dispatcher(pack, search(pack, tiny.patcher, "wan_call_options"))
    d.stats = pack.report.RunStats()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    for options in ({"scale": 0.1}, {"enable_gqa": True}):
        assert torch.equal(d(attention.attention_basic, q, k, v, 2, **options),
                           attention.attention_basic(q, k, v, 2, **options))
    assert dict(d.stats.dense) == {"search_call_options": 2} and d.method.evaluated == 0
    d(attention.attention_basic, q, k, v, 2)
    assert d.method.evaluated == 1


def test_a_call_with_nan_is_reported_and_the_table_still_loads(pack, wan):
    """A non-finite call is not evaluated (search_error, in the run summary's notes): the
    table of the run's other calls is written and reads back."""
    import comfy.ldm.modules.attention as attention
    tiny, _ = wan
    d = live_dispatcher(pack, search(pack, tiny.patcher, "wan_nan_call"))
    d.stats = pack.report.RunStats()
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    v_nan = v.clone()
    v_nan[0, 7, 3] = float("nan")
    d(attention.attention_basic, q, k, v_nan, 2)
    d(attention.attention_basic, q, k, v, 2)
    assert dict(d.stats.dense) == {"search_error": 1, "search_evaluated": 1} and d.method.evaluated == 1
    assert "dense attention output of this call is not finite" in d.stats.notes["search_error"]
    info = {}
    d.method.write_table(d, info)                         # what the end of a sampling run does
    assert LossTable.load(info["table"]).calls.tolist() == [[1]]


def test_search_samples_hunyuan_video_with_the_video_tokens_first(pack):
    """The search measures (and saves) HunyuanVideo's joint attention with the video tokens
    first and the text after them, in either of ComfyUI's join orders (test_nodes.py): the
    saved values are the rows of ComfyUI's own image and text layers, in that order."""
    tiny = H.build_hunyuan_video(5, hidden_size=256)
    m = search(pack, tiny.patcher, "hunyuan_join_order", save_qkv=True)
    seen = sample_seeing_hunyuan_layers(tiny, m)
    s = summary(pack, m)["search"]
    files = sorted(os.listdir(s["qkv_dir"]))
    assert len(files) == 2                                   # the double block, the single block
    _, _, v, header = load_qkv_sample(os.path.join(s["qkv_dir"], files[0]))
    img_v, txt_v = (value_rows(seen[name], tiny.heads) for name in ("double_img_qkv", "double_txt_qkv"))
    assert header["extra_tokens"] == txt_v.shape[1]
    torch.testing.assert_close(v, torch.cat([img_v, txt_v], dim=1), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["wan", "hunyuan_video"])
def test_search_select_patch_end_to_end(pack, wan, family):
    if family == "wan":
        tiny, base = wan
    else:
        tiny = H.build_hunyuan_video(5, hidden_size=256)    # joint attention, text extra tokens
        base = H.sample(tiny, steps=STEPS)
    m = search(pack, tiny.patcher, f"e2e_{family}")
    H.sample(tiny, steps=STEPS, model=m)
    table = f"e2e_{family}.safetensors"
    dense_preset, info0 = select(pack, table, f"e2e_{family}_a0", rule="alpha", alpha=0.0)
    sparse_preset, info1 = select(pack, table, f"e2e_{family}_s", rule="target_sparsity",
                                  target_sparsity=0.5)
    assert info0["sparsity"] <= info1["sparsity"] and info1["sparsity"] >= 0.5
    assert os.path.isfile(info1["preset"])
    assert load_preset(info1["preset"]).stats["sparsity"] == pytest.approx(info1["sparsity"])
    with pytest.raises(ValueError, match="exists"):
        select(pack, table, f"e2e_{family}_s", rule="alpha", alpha=1.0)
    # the selected preset loads by name and runs on the sparse path
    loaded = pack.node_preset.LoadStripeMaskPreset.execute(f"e2e_{family}_s.json").result[0]
    m = patch(pack, tiny.patcher, method="psa", preset=loaded, warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2
    want = [float(psa_mask((3, 4, 6), sparse_preset.params_for(b, 0.0), (1, 2, 2))
                  .density(tokens=True).mean()) for b in range(2)]
    assert s["mean_density"] == pytest.approx(sum(want) / 2, rel=1e-6) and max(want) < 1.0
    assert 0 < float((out - base).abs().max())
    # α = 0 keeps only lossless (dense-equivalent) masks: reproduces the unpatched output
    m = patch(pack, tiny.patcher, method="psa", preset=dense_preset, warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(tiny, steps=STEPS, model=m), base, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("widgets, words", [
    ({"table_name": "../x"}, "table_name"),
    ({"tile": "off"}, "tile"),
    ({"tile": "1,2"}, "tile"),
    ({"steps": "a-b"}, "steps"),
    ({"bucket_edges": "0.5,0.2"}, "bucket_edges"),
    ({"bucket_edges": "x"}, "bucket_edges"),
    ({"max_candidates": 0}, "max_candidates"),
    ({"qkv_max_gb": -1.0}, "qkv_max_gb"),
    ({"tile": "1000,1,1"}, "tile.t must be <= 256"),                  # bounded, ASCII
    ({"tile": "64,64,64"}, "tile (64, 64, 64) has 262144 tokens"),
    ({"tile": "１,2,2"}, "tile: expected"),
    ({"bucket_edges": "０.５"}, "bucket_edges"),
    ({"table_name": "nl\n"}, "table_name: 'nl\\n' must be"),
    ({"max_candidates": 5000}, "max_candidates: expected a whole number in [1, 4096]"),
])
def test_search_widget_errors_name_the_widget(pack, wan, widgets, words):
    tiny, _ = wan
    widgets = {"table_name": "x", **widgets}
    with pytest.raises(ValueError) as e:
        pack.node_search.PSAMaskSearch.execute(tiny.patcher, **widgets)
    assert words in str(e.value)


def test_select_errors(pack, wan):
    with pytest.raises(ValueError, match="table"):
        select(pack, "nope.safetensors", "x")
    with pytest.raises(ValueError, match="preset_name"):
        select(pack, "nope.safetensors", "../evil")

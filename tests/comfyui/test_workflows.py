"""The example workflows (workflows/*.json) as a user meets them.

One real ComfyUI server (main.py --cpu, this pack installed, plus the text-encoder stand-in
of tools/tiny_text_encode) serves every test here. Its models folder holds tiny files under
the official names the workflows load (tools/tiny_models.py, shared with ``make demo``).

* test_workflow_matches_object_info: node types exist (core or this pack only), widget
  values line up with /object_info (count, combo options, number bounds), links join
  matching types, a Note points at BENCHMARKS.md.
* test_workflow_follows_the_recommended_settings: every Sparse Attention Patch uses its row
  of the README's "Recommended settings" (tools/recommended_settings.py) and the node's
  defaults elsewhere; a PSA row's preset is the shipped one for the workflow's token grid.
  The files are written against ComfyUI 0.3.75 (tools/make_workflows.py on the default
  ComfyUI), the LTX-2.5 one against 0.33.0 (0.3.75 has no LTX-2 nodes: its tests skip there);
  on a newer ComfyUI a node may have gained trailing widgets (0.33: CreateVideo's bit_depth),
  which the frontend fills with their defaults, as tools/workflow_api.py does.
* test_template_opens_through_the_endpoint: ComfyUI's template browser lists every file under
  the pack's folder name, and the URL it opens serves the file (ComfyUI serves the first of
  its example folder names that a pack has, so no other such folder may exist).
* test_workflow_loads_in_web_ui (needs chromium): the real web UI in headless Chromium opens
  the template from that URL, as its template browser does: no missing node type, every widget holds the saved value and a valid one, and the
  frontend's own graphToPrompt gives the same API prompt as tools/workflow_api.py.
* test_workflow_runs_on_cpu: UI -> API, submitted to /prompt, executed to the end (video
  saved), and the run summary the patch node logs shows sparse attention calls.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest

import comfyui_harness as h  # puts tools/ on sys.path
import recommended_settings
import tiny_models as tiny
import workflow_api as wc
from comfyui_server import SUMMARY_RE

pytestmark = pytest.mark.slow  # a ComfyUI server runs every workflow, some in a browser

WORKFLOWS_DIR = h.REPO_ROOT / "workflows"
WORKFLOWS = {
    "wan2.1_t2v_14B_720p_sol_attn.json": "wan21_t2v",
    "wan2.1_t2v_14B_720p_psa.json": "wan21_t2v",
    "wan2.2_i2v_A14B_two_stage_sol_attn.json": "wan22_i2v",
    "hunyuan_video_t2v_720p_psa.json": "hunyuan_video",
    "ltxv_t2v_sol_attn.json": "ltxv",
    "hunyuan_video1.5_t2v_720p_psa.json": "hunyuan_video15",
    "wan2.2_ti2v_5B_720p_sol_attn.json": "wan22_ti2v",
    "ltx2.5_t2v_720p_sol_attn.json": "ltx25",      # needs LTXAV's nodes: skips on 0.3.75
}
PATCHES_EXPECTED = {"wan21_t2v": 1, "wan22_i2v": 2, "hunyuan_video": 1, "ltxv": 1, "hunyuan_video15": 1, "wan22_ti2v": 1,
                    "ltx25": 1}
PRESET_FAMILY = {"wan21_t2v": "wan", "wan22_ti2v": "wan", "hunyuan_video15": "hunyuan_video"}  # else the family's name
PACK_MODULE = f"custom_nodes.{h.PACK_NAME}"
I2V_START_IMAGE = "sparse_attention_i2v_start.png"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
MODEL_CACHE = h.REPO_ROOT / ".cache" / "test-models"
# the ComfyUI whose /object_info tools/make_workflows.py wrote each file from
WRITTEN_WITH = wc.make_workflows.WRITTEN_WITH
VERSION = h.comfyui_env.comfyui_version()


def to_api(name: str, wf: dict, info: dict) -> dict:
    """The API prompt, trailing widgets the files predate taking their defaults (never on the
    ComfyUI the files were written with)."""
    defaults = []
    prompt = wc.ui_to_api(wf, info, defaults)
    assert VERSION != WRITTEN_WITH[name] or defaults == [], defaults
    return prompt


def load(name: str) -> dict:
    return json.loads((WORKFLOWS_DIR / name).read_text())


def skip_without_its_nodes(name: str):
    """The LTX-2.5 workflow needs LTXAV's nodes (LTXVEmptyLatentAudio, LTXVConcatAVLatent...), which
    ComfyUI 0.3.75 lacks."""
    if WORKFLOWS[name] == "ltx25":
        ok, reason = h.ltx2_available()
        if not ok:
            pytest.skip(reason)


def test_every_workflow_file_is_covered():
    assert sorted(p.name for p in WORKFLOWS_DIR.glob("*.json")) == sorted(WORKFLOWS)


def template_url(name: str) -> str:
    """The URL ComfyUI's template browser opens for a pack's workflow."""
    return f"/api/workflow_templates/{h.PACK_NAME}/{name}"


# ComfyUI's example folder names (app/custom_node_manager.py, 0.3.75 and 0.33.0): it serves the
# first one a pack has, so a second one hides workflows/.
TEMPLATE_FOLDER_NAMES = ("example_workflows", "example", "examples", "workflow", "workflows")


def test_workflows_is_the_only_template_folder():
    assert [n for n in TEMPLATE_FOLDER_NAMES if (h.REPO_ROOT / n).exists()] == ["workflows"]


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_template_opens_through_the_endpoint(server, name):
    listed = server.get_json("/api/workflow_templates")
    assert sorted(listed.get(h.PACK_NAME, [])) == sorted(Path(n).stem for n in WORKFLOWS), listed
    assert server.get_json(template_url(name)) == load(name)


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------

# The PSA workflows' tiny runs: (blocks, heads, hidden size) of the family's file in
# tools/tiny_models.py, the token grid tiny_run_prompt gives it, and a tile for that grid.
TINY_PSA = {
    "wan21_t2v": (2, 1, tiny.wan_hidden_size(1), wc.WAN_TINY_GRID, (1, 2, 2)),
    "hunyuan_video": (2, 1, 128, wc.HUNYUAN_TINY_GRID, (1, 2, 4)),
    "hunyuan_video15": (2, 1, 128, wc.WAN_TINY_GRID, (1, 2, 2)),   # its tiny latent: the 3 x 4 x 6 grid too
}


def preset_names(wf: dict) -> list[str]:
    return [n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "LoadStripeMaskPreset"]


def _write_standin_presets(folder: Path):
    """For each PSA workflow, a preset for its tiny model (tiny_models.standin_preset: the
    shipped one cut to the tiny model and grid) under the name the workflow loads:
    models/sparse_attention_presets/ comes first in the loader's search, so it stands in for
    the shipped 720p preset as the tiny files do for the real weights."""
    from kernels.preset_file import save_preset
    folder.mkdir(parents=True, exist_ok=True)
    for name, family in WORKFLOWS.items():
        for preset in preset_names(load(name)):
            layers, heads, hidden, grid, tile = TINY_PSA[family]
            save_preset(tiny.standin_preset(h.REPO_ROOT / "mask_presets" / preset, layers=layers, heads=heads,
                                            hidden_size=hidden, grid=grid, tile=tile), folder / preset)


def _write_start_image(path: Path):
    import numpy as np
    from PIL import Image
    y, x = np.mgrid[0:64, 0:96]
    rgb = np.stack([x * 2, y * 3, (x + y) % 256], axis=-1).astype("uint8")
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory, comfyui):
    """main.py --cpu with tiny models under the official names. (Depends on ``comfyui`` only
    so that ComfyUI's modules are importable here for writing the tiny files.)"""
    base = tmp_path_factory.mktemp("workflow-server")
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / tiny.TEXT_ENCODE_NODE_FOLDER).symlink_to(tiny.TEXT_ENCODE_NODE_DIR)
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for family in tiny.FILES:
        if family != "ltx25" or h.ltx2_available()[0]:
            tiny.write_models(base / "models", family, cache_dir=MODEL_CACHE)
    _write_standin_presets(base / "models" / "sparse_attention_presets")
    _write_start_image(base / "input" / I2V_START_IMAGE)
    files_s = time.perf_counter() - t0
    srv = h.start_server(base)
    srv.files_s = files_s
    srv.object_info = srv.get_json("/object_info", timeout=120)
    yield srv
    srv.stop()


# --------------------------------------------------------------------------------------------
# Static checks against /object_info
# --------------------------------------------------------------------------------------------

def _official_file_names() -> set:
    names = set()
    for fam in tiny.FILES.values():
        for files in fam.values():
            names.update(files)
    for files in tiny.TEXT_ENCODER_FILES.values():
        names.update(files)
    return names


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_workflow_matches_object_info(server, name):
    skip_without_its_nodes(name)
    wf = load(name)
    info = server.object_info
    assert wf["version"] == 0.4 and wf["last_node_id"] == max(n["id"] for n in wf["nodes"])
    assert wf["last_link_id"] == max(link[0] for link in wf["links"])
    official = _official_file_names()
    nodes = {n["id"]: n for n in wf["nodes"]}
    notes = [n for n in wf["nodes"] if n["type"] == "Note"]
    assert len(notes) == 1 and "BENCHMARKS.md" in notes[0]["widgets_values"][0]
    for node in wf["nodes"]:
        if node["type"] in wc.FRONTEND_ONLY:
            continue
        assert node["type"] in info, f"{name}: node type {node['type']} unknown to this ComfyUI"
        module = info[node["type"]]["python_module"]
        assert module == "nodes" or module.startswith("comfy_extras.") or module == PACK_MODULE, \
            f"{name}: {node['type']} comes from {module}, not ComfyUI core or this pack"
        values = node["widgets_values"]
        specs = wc.widget_specs(info, node["type"], values)
        layout = [(n, k) for n, k, _ in specs]
        if VERSION == WRITTEN_WITH[name]:
            assert len(values) == len(layout), f"{node['type']}: {values} vs {layout}"
        else:  # widgets added since: trailing, each with a default the frontend gives it
            assert len(values) <= len(layout), f"{node['type']}: {values} vs {layout}"
            for wname, kind in layout[len(values):]:
                assert kind in ("control", "upload") or \
                    wc.widget_default(info, node["type"], wname, values) is not None, \
                    f"{name}: {node['type']}.{wname} is new and has no default"
        spec_all = {**info[node["type"]]["input"].get("required", {}), **info[node["type"]]["input"].get("optional", {})}
        for (wname, kind, opts), value in zip(specs, values):
            if kind == "control":
                assert value in ("fixed", "increment", "decrement", "randomize")
                continue
            if kind == "upload":
                assert value == "image"
                continue
            spec = spec_all.get(wname)   # None for a dynamic combo's inputs ("format.codec")
            if kind == "COMBO":
                options = spec[0] if spec and isinstance(spec[0], list) else opts.get("options", [])
                # file names come from this machine's folders: the model files must be the
                # official names, the preset the shipped one, the image the user's own
                if wname in ("unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "ckpt_name"):
                    assert value in official, f"{node['type']}.{wname} = {value!r} is not an official file name"
                elif wname not in ("image", "preset_name"):
                    assert value in options, f"{node['type']}.{wname} = {value!r} not in {options}"
            elif kind in ("INT", "FLOAT"):
                assert isinstance(value, (int, float)) and not isinstance(value, bool)
                if kind == "INT":
                    assert value == int(value)
                assert opts.get("min", -math.inf) <= value <= opts.get("max", math.inf), f"{node['type']}.{wname}"
            elif kind == "BOOLEAN":
                assert isinstance(value, bool)
            elif kind == "STRING":
                assert isinstance(value, str)
    for lid, src, slot, dst, dslot, ltype in wf["links"]:
        out_type = info[nodes[src]["type"]]["output"][slot]
        inp = nodes[dst]["inputs"][dslot]
        assert ltype == out_type == inp["type"] and inp["link"] == lid, f"{name}: link {lid}"
        assert lid in nodes[src]["outputs"][slot]["links"]
    patches = [n for n in wf["nodes"] if n["type"] == "SparseAttentionPatch"]
    assert len(patches) == PATCHES_EXPECTED[WORKFLOWS[name]]
    # every patch sits between a model loader and the sampler: its MODEL output is used
    for p in patches:
        assert p["outputs"][0]["links"], f"{name}: a patch node's output is not connected"
    # the prompt converts and ComfyUI accepts every required input
    prompt = to_api(name, wf, info)
    for nid, node in prompt.items():
        for req in info[node["class_type"]]["input"].get("required", {}):
            assert req in node["inputs"], f"{name}: {node['class_type']} {nid} lacks {req}"


# The latent nodes of the PSA workflows: the pixels per token in height and width (spatial
# compression of the VAE times the patch); every VAE here compresses 4x in time, patch 1.
PIXELS_PER_TOKEN = {"EmptyHunyuanLatentVideo": 16,    # Wan 2.1 / HunyuanVideo VAE 8x, patch 2x2
                    "Wan22ImageToVideoLatent": 32,    # Wan 2.2 VAE 16x, patch 2x2
                    "EmptyHunyuanVideo15Latent": 16}  # HunyuanVideo 1.5 VAE 16x, patch 1x1


def token_grid(prompt: dict) -> tuple[int, int, int]:
    """The video token grid of a workflow's latent node."""
    latent, per = next((n["inputs"], PIXELS_PER_TOKEN[n["class_type"]]) for n in prompt.values()
                       if n["class_type"] in PIXELS_PER_TOKEN)
    return (latent["length"] - 1) // 4 + 1, latent["height"] // per, latent["width"] // per


@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_workflow_follows_the_recommended_settings(server, name):
    skip_without_its_nodes(name)
    info = server.object_info
    row = recommended_settings.for_workflow(name)
    prompt = wc.ui_to_api(load(name), info, defaults_used=[])  # widgets newer ComfyUI added: defaults
    patches = [n["inputs"] for n in prompt.values() if n["class_type"] == "SparseAttentionPatch"]
    assert patches
    widgets = [w for w, kind in wc.widget_layout(info, "SparseAttentionPatch") if kind not in ("control", "upload")]
    for inputs in patches:
        assert inputs["method"] == row.method
        for widget in widgets:
            value, wanted = inputs[widget], row.settings.get(widget)
            if isinstance(wanted, tuple):
                assert wanted[0] <= value <= wanted[1], f"{name}: {widget} {value} outside the recommended {wanted}"
            elif widget in row.settings:
                assert value == wanted, f"{name}: {widget} {value!r}, recommended {wanted!r}"
            elif widget != "method":
                default = wc.widget_default(info, "SparseAttentionPatch", widget)
                assert value == default, f"{name}: {widget} {value!r} is neither recommended nor the default {default!r}"
        if row.shipped_preset:
            source = prompt[inputs["preset"][0]]
            assert source["class_type"] == "LoadStripeMaskPreset", source
            from kernels.preset_file import load_preset
            preset = load_preset(h.REPO_ROOT / "mask_presets" / source["inputs"]["preset_name"])
            assert preset.family == PRESET_FAMILY.get(WORKFLOWS[name], WORKFLOWS[name])
            assert tuple(preset.grid) == token_grid(prompt), f"{name}: preset grid {preset.grid}"
        else:
            assert "preset" not in inputs


# --------------------------------------------------------------------------------------------
# The real web UI in headless Chromium
# --------------------------------------------------------------------------------------------

def _chromium_or_skip():
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM} (make ui-test-deps installs Debian's chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is missing (make ui-test-deps installs it)")


@pytest.fixture(scope="module")
def page(server):
    _chromium_or_skip()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.console_log = []
        pg.on("console", lambda msg: pg.console_log.append((msg.type, msg.text)))
        pg.on("pageerror", lambda exc: pg.console_log.append(("pageerror", str(exc))))
        # which request a "Failed to load resource" error was about (the console omits the URL)
        pg.on("response", lambda r: pg.console_log.append(("http", f"{r.status} {r.request.method} {r.url}"))
              if r.status >= 400 else None)
        t0 = time.perf_counter()
        pg.goto(server.url + "/", wait_until="load", timeout=120_000)
        pg.wait_for_function("() => window.app && window.app.graph && window.LiteGraph"
                             " && Object.keys(window.LiteGraph.registered_node_types).length > 400",
                             timeout=120_000)
        pg.ui_start_s = time.perf_counter() - t0
        yield pg
        browser.close()


OFFLINE_ERRORS = ("Failed to load resource: net::ERR_NAME_NOT_RESOLVED",
                  "Failed to load resource: net::ERR_INTERNET_DISCONNECTED",
                  "Error fetching file size: TypeError: Failed to fetch")  # the missing-models dialog

LOAD_AND_INSPECT = """
async (url) => {
  const app = window.app;
  const response = await fetch(url);
  if (!response.ok) return {status: response.status};
  const wf = await response.json();
  await app.loadGraphData(structuredClone(wf), true, true, "svattn-test");
  const registered = window.LiteGraph.registered_node_types;
  const nodes = app.graph._nodes.map(n => ({
    id: n.id, type: n.type, registered: n.type in registered, has_errors: !!n.has_errors,
    widgets: (n.widgets || []).map(w => ({name: w.name, type: w.type, value: w.value,
                                          options: w.options && w.options.values ? w.options.values : null,
                                          min: w.options ? w.options.min : undefined,
                                          max: w.options ? w.options.max : undefined})),
  }));
  const p = await app.graphToPrompt();
  return {status: response.status, workflow: wf, nodes, output: p.output};
}
"""


@pytest.mark.chromium
@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_workflow_loads_in_web_ui(server, page, name):
    skip_without_its_nodes(name)
    wf = load(name)
    n_console = len(page.console_log)
    result = page.evaluate(LOAD_AND_INSPECT, template_url(name))
    assert result["status"] == 200, f"{name}: the template URL answered {result['status']}"
    assert result["workflow"] == wf, f"{name}: the template URL served another file"
    # node ids: numbers in the file; frontend 1.49.6 (ComfyUI 0.33) hands them back as strings
    loaded = {str(n["id"]): n for n in result["nodes"]}
    assert sorted(loaded) == sorted(str(n["id"]) for n in wf["nodes"]), "the UI did not create every node"
    for node in wf["nodes"]:
        got = loaded[str(node["id"])]
        assert got["registered"], f"{name}: the web UI has no node type {node['type']} (missing node)"
        if got["has_errors"]:
            # frontend 1.49.6 (ComfyUI 0.33) marks a loader whose file this server lacks: only the
            # text encoders, which cannot be tiny (tools/tiny_models.py), are missing here
            missing = [w["value"] for w in got["widgets"] if w["name"] in ("clip_name", "clip_name1", "clip_name2")
                       and w["value"] not in (w["options"] or [])]
            assert node["type"] in wc.TEXT_ENCODER_LOADERS and missing, \
                f"{name}: node {node['id']} {node['type']} is marked with errors"
            assert set(missing) <= {f for files in tiny.TEXT_ENCODER_FILES.values() for f in files}
        values = [w["value"] for w in got["widgets"]]
        assert values[:len(node["widgets_values"])] == node["widgets_values"], \
            f"{name}: {node['type']} widgets {[(w['name'], w['value']) for w in got['widgets']]} " \
            f"do not hold the saved values {node['widgets_values']}"
        names = [w["name"] for w in got["widgets"]]
        if node["type"] not in wc.FRONTEND_ONLY:
            held = node["widgets_values"] + values[len(node["widgets_values"]):]
            layout = [n.split(":")[0] for n, k in wc.widget_layout(server.object_info, node["type"], held)]
            # the frontend names the seed control widget "control_after_generate" and the
            # image upload button "upload"; every named input widget is where /object_info puts it
            expected = [n if k not in ("control", "upload") else None
                        for n, k in wc.widget_layout(server.object_info, node["type"], held)]
            assert [n for n, e in zip(names, expected) if e is not None] == [e for e in expected if e is not None], \
                f"{name}: {node['type']} widget order {names} vs /object_info {layout}"
        for w in got["widgets"]:
            if w["type"] == "number":
                lo = -math.inf if w["min"] is None else w["min"]
                hi = math.inf if w["max"] is None else w["max"]
                assert lo <= w["value"] <= hi, f"{name}: {node['type']}.{w['name']} = {w['value']} out of range"
            if w["type"] == "combo" and w["options"] is not None and w["name"] not in (
                    "unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "ckpt_name", "image"):
                assert w["value"] in w["options"], f"{name}: {node['type']}.{w['name']} = {w['value']!r} not offered"
    # no network here: the UI's look-ups of the models' download URLs (huggingface.co) fail to
    # resolve; any other console error (a 404 of the server, an exception) fails the test
    errors = [m for m in page.console_log[n_console:] if m[0] in ("error", "pageerror")
              and not m[1].startswith(OFFLINE_ERRORS)]
    failed_requests = [m[1] for m in page.console_log[n_console:] if m[0] == "http"]
    assert not errors, f"{name}: console errors while loading: {errors}; failed requests: {failed_requests}"
    # the frontend's own conversion equals ours (which the run test submits)
    ours = to_api(name, wf, server.object_info)
    theirs = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in result["output"].items()}
    assert theirs == {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in ours.items()}


# --------------------------------------------------------------------------------------------
# Executing each workflow on the CPU
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKFLOWS))
def test_workflow_runs_on_cpu(server, name):
    skip_without_its_nodes(name)
    family = WORKFLOWS[name]
    prompt, changed = wc.tiny_run_prompt(to_api(name, load(name), server.object_info), family)
    log_before = server.log_path.read_text(errors="replace")
    t0 = time.perf_counter()
    entry = server.run_prompt(prompt)
    elapsed = time.perf_counter() - t0
    log = server.log_path.read_text(errors="replace")[len(log_before):]
    # the video was written
    saves = [nid for nid, n in prompt.items() if n["class_type"] == "SaveVideo"]
    assert saves and all(entry["outputs"].get(nid) for nid in saves), f"no SaveVideo output: {entry['outputs']}"
    for nid in saves:
        files = [f for v in entry["outputs"][nid].values() if isinstance(v, list) for f in v if isinstance(f, dict)]
        assert files, entry["outputs"][nid]
        for f in files:
            path = server.base_dir / "output" / f.get("subfolder", "") / f["filename"]
            assert path.is_file() and path.stat().st_size > 0, path
    # an Inspector node (the Wan 2.1 workflow has one after the sampler) ran and shows its 3 images
    for nid in [n for n, node in prompt.items() if node["class_type"] == "SparseAttentionInspector"]:
        assert len(entry["outputs"].get(nid, {}).get("images", [])) == 3, entry["outputs"].get(nid)
    # the sparse path was taken: one run summary per patched model, each with sparse calls
    summaries = [m.groups() for m in SUMMARY_RE.finditer(log)]
    method = recommended_settings.for_workflow(name).method
    assert len(summaries) == PATCHES_EXPECTED[family], f"run summaries {summaries}; changes {changed}\n{log[-3000:]}"
    for fam, meth, forwards, calls, sparse, density, dense in summaries:
        assert meth == method and int(forwards) > 0
        assert int(sparse) > 0, f"{name}: no sparse attention call ({calls} calls, dense: {dense})\n{log[-3000:]}"
        # dense only where the settings say so (warm-up, first block, cross/text attention)
        reasons = dict(part.split("=") for part in dense.split(", ")) if dense != "none" else {}
        assert set(reasons) <= {"warmup", "dense_block", "not_video_self_attention", "final_dense"}, reasons
    print(f"{name}: ran in {elapsed:.1f} s; summaries {summaries}")


def test_patch_survives_a_later_model_node(server):
    """A user who puts ModelSamplingSD3 (or a LoRA) after the patch still gets sparse attention."""
    name = "wan2.1_t2v_14B_720p_sol_attn.json"
    prompt, _ = wc.tiny_run_prompt(to_api(name, load(name), server.object_info),
                                   "wan21_t2v")
    patch = next(k for k, n in prompt.items() if n["class_type"] == "SparseAttentionPatch")
    shift = next(k for k, n in prompt.items() if n["class_type"] == "ModelSamplingSD3")
    sampler = next(k for k, n in prompt.items() if n["class_type"] == "KSampler")
    # loader -> patch -> ModelSamplingSD3 -> sampler
    prompt[patch]["inputs"]["model"], prompt[shift]["inputs"]["model"] = prompt[shift]["inputs"]["model"], [patch, 0]
    prompt[sampler]["inputs"]["model"] = [shift, 0]
    log_before = len(server.log_path.read_text(errors="replace"))
    server.run_prompt(prompt)
    summaries = [m.groups() for m in SUMMARY_RE.finditer(server.log_path.read_text(errors="replace")[log_before:])]
    assert len(summaries) == 1 and int(summaries[0][4]) > 0, summaries

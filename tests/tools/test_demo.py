"""``make demo`` (tools/demo.py) on the CPU, as a user runs it: a subprocess that starts the
real ComfyUI server, runs a Wan example workflow dense and sparse on the tiny stand-ins,
prints the report and writes the inspector's PNG files. Both choices: ``--demo sol`` (the
default of ``make demo``) and ``--demo psa`` (``make demo DEMO=psa``)."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each demo starts a ComfyUI server and samples a workflow dense and sparse

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "tools" / "demo.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKFLOW = {"sol": "wan2.1_t2v_14B_720p_sol_attn.json", "psa": "wan2.1_t2v_14B_720p_psa.json"}
METHOD = {"sol": "sol_attn", "psa": "psa"}
MESSAGE_IMAGE_HEIGHT = 64  # nodes/draw.py message_image: "NO PSA PRESET" and the like


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SVATTN_MODELS_DIR", "SVATTN_EXTRA_MODEL_PATHS")}  # the embedded default
    env.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py sets it without CUDA
    return {**env, **extra}


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory):
    """demo_runs(name) -> (completed process, out dir): each demo run once per module."""
    runs = {}

    def get(name):
        if name not in runs:
            out = tmp_path_factory.mktemp(f"demo-{name}") / "out"
            proc = subprocess.run([sys.executable, str(DEMO), "--demo", name, "--out", str(out)], cwd=REPO,
                                  env=_env(), capture_output=True, text=True, timeout=300)
            runs[name] = proc, out
        return runs[name]
    return get


@pytest.fixture(params=sorted(WORKFLOW))
def demo_run(request, demo_runs):
    return (request.param, *demo_runs(request.param))


def test_demo_prints_the_report(demo_run):
    name, proc, out = demo_run
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    text = proc.stdout
    for needle in (WORKFLOW[name], "tiny stand-ins under the official names",
                   "attention calls", "dense by reason, sparse run:", "achieved density",
                   "sampling (KSampler)", "whole prompt (wall)", "output vs dense: rel-L2",
                   "the videos are close to flat grey by design",
                   "the stand-in models' weights are random"):
        assert needle in text, f"{needle!r} missing from the report:\n{text}"
    # "close to flat grey" is measured: every video's pixel spread is small around mid-grey
    spread = re.findall(r"(dense|sparse) mean (\d+), std ([0-9.]+)", text)
    assert sorted(n for n, _, _ in spread) == ["dense", "sparse"], text
    assert all(90 <= int(m) <= 165 and float(sd) < 12 for _, m, sd in spread), spread
    doc = json.loads((out / "report.json").read_text())
    dense, sparse = doc["run_summary"]["dense"], doc["run_summary"]["sparse"]
    assert dense["method"] == "dense"
    assert dense["sparse"] == 0 and set(dense["dense"]) == {"method_dense"}
    assert sparse["method"] == METHOD[name] and sparse["sparse"] > 0 and sparse["calls"] == dense["calls"]
    assert set(sparse["dense"]) <= {"warmup", "dense_block", "not_video_self_attention", "final_dense"}
    assert 0 < sparse["mean_density"] < 1
    assert 0 < doc["rel_l2_latent"] < 0.5 and math.isfinite(doc["rel_l2_latent"])
    assert doc["sampling_s"]["dense"] > 0 and doc["sampling_s"]["sparse"] > 0


def test_demo_writes_the_inspector_pngs(demo_run):
    name, proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    for image in ["density_map.png", "head_density.png", "psa_masks.png"]:
        path = out / image
        assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC, path
        assert str(path) in proc.stdout  # the report prints where they are
    from PIL import Image
    with Image.open(out / "density_map.png") as img:
        assert img.width > 100 and img.height > 100
    with Image.open(out / "psa_masks.png") as img:
        # PSA: one tile of block masks per head; Sol-Attn: the "NO PSA PRESET" message, explained
        assert (img.height > MESSAGE_IMAGE_HEIGHT) == (name == "psa"), img.size
    if name == "sol":
        assert "psa_masks.png says NO PSA PRESET" in proc.stdout


def test_psa_demo_says_its_preset_is_a_standin_cut_from_the_shipped_one(demo_runs):
    """The shipped preset fits only the real 40 x 40 model on the 720p grid: the report says
    what the tiny run used instead."""
    proc, out = demo_runs("psa")
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads((out / "report.json").read_text())
    assert doc["preset"].startswith("wan2.1_14b_720p_81f.json: a stand-in in models/sparse_attention_presets/")
    assert "blocks 0-3, heads 0-1, rescaled to token grid (5, 10, 16) with tile (1, 2, 4)" in doc["preset"]
    assert f"preset: {doc['preset']}" in proc.stdout


def test_demo_fails_with_a_message(tmp_path):
    missing = tmp_path / "no_such_extra_model_paths.yaml"
    proc = subprocess.run([sys.executable, str(DEMO), "--out", str(tmp_path / "out")], cwd=REPO,
                          env=_env(SVATTN_EXTRA_MODEL_PATHS=str(missing), TMPDIR=str(tmp_path)),  # the kept base dir
                          capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "make demo FAILED" in proc.stderr and str(missing) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_configured_models_folder_becomes_an_extra_model_paths_file(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "tools"))
    import demo
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("SVATTN_MODELS_DIR", str(models))
    monkeypatch.delenv("SVATTN_EXTRA_MODEL_PATHS", raising=False)
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    configs, sources = demo.configured_model_paths(tmp_path)
    assert sources == [f"SVATTN_MODELS_DIR={models}"] and len(configs) == 1
    text = configs[0].read_text()
    assert json.dumps(str(models.resolve())) in text and '"diffusion_models\\nunet"' in text
    monkeypatch.setenv("SVATTN_MODELS_DIR", str(tmp_path / "missing"))
    with pytest.raises(demo.DemoError, match="SVATTN_MODELS_DIR"):
        demo.configured_model_paths(tmp_path)


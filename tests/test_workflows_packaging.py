"""Registry packaging: `comfy node validate` and `comfy node pack` (comfy-cli) on this checkout.

Both commands read git: validate reads pyproject.toml (and runs ruff's security rules), pack
zips the git-tracked files minus .comfyignore. They run on a copy of the tracked files of the
working tree (a fresh git repository in a temp dir), so no node.zip lands in the checkout.
comfy-cli lives in its own venv (`make test-tools`: .venv-tools); $COMFY_CLI overrides.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


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
    names = sorted(d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"])
    assert names == ["numpy", "safetensors", "torch", "triton"]
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
    for needed in ("__init__.py", "pyproject.toml", "README.md", "icon.png", "nodes/extension.py",
                   "nodes/dispatch.py", "kernels/block_sparse.py", "kernels/sol_router.py"):
        assert needed in names, f"{needed} missing from node.zip"
    workflows = sorted(p.name for p in (REPO_ROOT / "workflows").glob("*.json"))
    assert workflows and all(f"workflows/{w}" in names for w in workflows)
    presets = sorted(p.name for p in (REPO_ROOT / "mask_presets").glob("*.json")) if (REPO_ROOT / "mask_presets").is_dir() else []
    assert all(f"mask_presets/{p}" in names for p in presets)
    for left_out in ("tests/", "benchmarks/", "tools/", "docs/", ".ci/"):
        assert not [n for n in names if n.startswith(left_out)], f"{left_out} is in node.zip"
    assert "Makefile" not in names and "BENCHMARKS.md" in names  # the workflows' notes point at it

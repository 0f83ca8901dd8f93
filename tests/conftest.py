"""Test setup shared by every test.

Layout: the folders mirror the tree.

* ``kernels/``: the library (``kernels/``) without ComfyUI, on Triton's interpreter here.
* ``nodes/``: the pack's nodes in a real ComfyUI started in-process (``comfyui`` fixture).
* ``comfyui/``: what users meet through a ComfyUI server: the shipped workflows (API and web
  UI), the registry packaging, cancelling a run.
* ``tools/``: the scripts of ``tools/`` and ``benchmarks/`` and their command lines.
* ``gpu/``: the kernels on a CUDA device; marked ``gpu`` and skipped (not failed) without one.

No test module imports another. Fixtures shared across modules live here; helpers (plain
functions and constants) live in modules beside this file, imported by bare name (pytest puts
this folder on ``sys.path``):

* ``comfyui_harness``: starting ComfyUI in-process or as a server, tiny models, sampling;
* ``pack_nodes``: calling the pack's nodes (``patch``, ``search``, ``summary``...) and files in
  ComfyUI's models folders;
* ``preset_builders``: stripe-mask presets built in code;
* ``psa_search_inputs``: small grids, q/k/v and loss tables for the PSA search;
* ``qkv_layouts``: q/k/v in the layouts of the supported models;
* ``cli_usage``: the usage-error check of the command lines.

Test module names are unique across the folders (pytest imports each by its basename).

Markers (pyproject.toml): ``gpu``; ``slow`` on the tests that take more than about 10 s (a
parametrized test: its cases together) or start a ComfyUI server, a browser or worker
processes (``make test-fast`` runs the rest); ``chromium``.

Set-up done here:

* Without CUDA, Triton kernels run through Triton's interpreter: TRITON_INTERPRET=1 must be in
  the environment before `triton` is first imported, so it is set here, at conftest import,
  before any test module is collected. An explicit TRITON_INTERPRET in the environment wins.
* The repo root goes first on ``sys.path``, so ``import kernels`` is the pack's library however
  pytest was started (``python -m pytest``, ``.venv/bin/pytest``, from any folder). Hugging
  Face's package ``kernels`` (installed by transformers 5.x, and in the test venv on purpose)
  has the same name; an import of the wrong one stops the run here with both paths.
* Fixtures: ``comfyui`` (a real ComfyUI, in-process, CPU, only this pack as custom node; the
  node tests take it as ``comfy``), ``pack`` (the pack's ``nodes`` modules as ComfyUI imported
  them), ``tiny_model`` (tiny Wan / HunyuanVideo / LTXV models loaded through ComfyUI) and
  ``comfyui_server`` (the real web server); see tests/comfyui_harness.py and
  docs/DEVELOPMENT.md.
"""

import importlib
import os
import sys
from pathlib import Path

import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before tests/conftest.py could set TRITON_INTERPRET=1")
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO_ROOT = Path(__file__).resolve().parents[1]
while str(REPO_ROOT) in sys.path:
    sys.path.remove(str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT))

import kernels  # noqa: E402
import pytest  # noqa: E402

if Path(kernels.__file__).resolve().parent != REPO_ROOT / "kernels":
    raise RuntimeError(f"`import kernels` gave {kernels.__file__}, not the pack's {REPO_ROOT / 'kernels'}: "
                       "another package named `kernels` was imported before tests/conftest.py")

GPU_DIR = Path(__file__).resolve().parent / "gpu"


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA (none available: Triton runs interpreted on this machine)")
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not CUDA:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def comfyui(tmp_path_factory):
    """ComfyUI started in-process (CPU) with only this pack in its custom_nodes folder."""
    from comfyui_harness import start_comfyui
    return start_comfyui(tmp_path_factory.mktemp("comfyui-base"))


@pytest.fixture(scope="session")
def tiny_model(comfyui):
    """tiny_model(family, seed=0) -> TinyModel, built once per (family, seed). LTX-2 and LTX-2.3
    skip (with the reason) on a ComfyUI without them."""
    from comfyui_harness import BUILDERS, ltx2_available
    cache = {}

    def get(family: str, seed: int = 0):
        if family in ("ltx2", "ltx23"):
            ok, reason = ltx2_available()
            if not ok:
                pytest.skip(reason)
        if (family, seed) not in cache:
            cache[family, seed] = BUILDERS[family](seed)
        return cache[family, seed]

    return get


@pytest.fixture(scope="session")
def comfy(comfyui):
    """The in-process ComfyUI that the node tests patch and sample models in."""
    return comfyui


@pytest.fixture(scope="session")
def pack(comfy):
    """The pack as ComfyUI imported it: ``pack.<module>`` is its ``nodes.<module>``."""
    root = comfy.pack_module()

    class Pack:
        def __getattr__(self, name):
            return importlib.import_module(f"{root.__name__}.nodes.{name}")
    return Pack()


@pytest.fixture(scope="session")
def comfyui_server(tmp_path_factory):
    """The real ComfyUI web server/API (main.py --cpu) on a free loopback port, only this pack."""
    from comfyui_harness import start_server
    server = start_server(tmp_path_factory.mktemp("comfyui-server"))
    yield server
    server.stop()

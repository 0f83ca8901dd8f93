"""Every entry point of the repository finds the pack's own ``kernels`` library, whatever else
is installed and whatever the working directory.

Hugging Face's package ``kernels`` (installed by transformers 5.x, which ComfyUI's requirements
pull in) is a top-level module of the same name. The test venv installs it on purpose
(``make env``), so a script that appended the repository to ``sys.path`` instead of putting it
first would import that package here and fail. Each script below runs from a folder outside
the repository as ``python SCRIPT --help`` would (its own folder first on ``sys.path``), and
reports which ``kernels`` it imported.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACK_KERNELS = REPO / "kernels" / "__init__.py"
SCRIPTS = sorted(p.relative_to(REPO).as_posix() for d in ("tools", "benchmarks")
                 for p in (REPO / d).glob("*.py") if p.name != "__init__.py")

# Runs SCRIPT as `python SCRIPT --help` does (sys.path[0] is its folder, __name__ is
# "__main__"), then prints the file of the `kernels` module it imported, if any.
PROBE = """
import json, runpy, sys
script = sys.argv[1]
sys.argv = [script, "--help"]
sys.path[0] = __import__("os").path.dirname(script)
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit:
    pass
m = sys.modules.get("kernels")
print("PROBE " + json.dumps(getattr(m, "__file__", None)))
"""


def test_the_other_kernels_package_is_installed(tmp_path):
    """The clash stays covered: from a folder outside the repository, `kernels` is Hugging
    Face's package, not the pack's."""
    proc = subprocess.run([sys.executable, "-c", "import importlib.util, importlib.metadata as m; "
                           "print(importlib.util.find_spec('kernels').origin); print(m.version('kernels'))"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, ("Hugging Face's `kernels` is missing from the test venv (make env installs it): "
                                  + proc.stderr[-1000:])
    origin, version = proc.stdout.split()
    assert Path(origin).resolve() != PACK_KERNELS, origin
    assert version


def test_the_test_process_imported_the_packs_kernels():
    import kernels
    assert Path(kernels.__file__).resolve() == PACK_KERNELS
    assert importlib.util.find_spec("kernels.preset_file").origin == str(REPO / "kernels" / "preset_file.py")


@pytest.mark.slow  # a Python process per script, about 5 s each
@pytest.mark.parametrize("script", SCRIPTS)
def test_script_imports_the_packs_kernels(script, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(REPO / script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    imported = json.loads(line[-1][len("PROBE "):])
    assert imported is None or Path(imported).resolve() == PACK_KERNELS, f"{script} imported {imported}"


def test_pytest_started_directly_from_outside_the_repository(tmp_path):
    """`.venv/bin/pytest` (not `python -m pytest`, which puts the working folder first), from
    another folder: tests/conftest.py puts the repository first."""
    pytest_bin = Path(sys.executable).with_name("pytest")
    if not pytest_bin.exists():
        pytest.skip(f"no pytest script beside {sys.executable}")
    proc = subprocess.run([str(pytest_bin), "--collect-only", "-q", "-p", "no:cacheprovider",
                           str(REPO / "tests" / "kernels" / "test_presets.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error" not in proc.stdout.lower().split("\n")[-2], proc.stdout[-2000:]

